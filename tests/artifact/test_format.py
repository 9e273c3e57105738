"""The .ninfer v3 format: round trip, validation errors that name the file, atomic writes."""
from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

from ninfer_jax.artifact.format import (ArtifactContents, load_artifact, save_artifact,
                                        tensor_group)
from ninfer_jax.errors import ArtifactError
from tiny_artifacts import random_params, tiny_config, tiny_contents


def test_round_trip_keeps_metadata_and_weights(tiny_artifact_dir):
    contents = tiny_contents()
    artifact = load_artifact(tiny_artifact_dir)
    assert artifact.name == "tiny-llama"
    assert artifact.config == contents.config
    assert artifact.metadata["format_version"] == 3
    assert artifact.components == {"text": True, "mtp": False, "dflash": False, "vision": False}
    assert artifact.eos_ids == [262]
    assert artifact.weight_formats == {"embed": "f32", "layers": "f32", "norms": "f32",
                                       "lm_head": "f32"}
    np.testing.assert_array_equal(artifact.params["embed"], contents.params["embed"])
    np.testing.assert_array_equal(artifact.params["layers"][1]["w_down"],
                                  contents.params["layers"][1]["w_down"])
    assert isinstance(artifact.params["layers"], list) and len(artifact.params["layers"]) == 2
    assert artifact.chat_template == contents.chat_template


def test_metadata_only_load_skips_weights(tiny_artifact_dir):
    artifact = load_artifact(tiny_artifact_dir, weights=False)
    assert artifact.params is None
    assert artifact.load_tokenizer().token_to_id("<|im_start|>") == 261


def test_bf16_storage_keeps_norms_f32(tmp_path):
    from ninfer_jax.artifact import convert_common as common

    config = tiny_config()
    params = random_params(config)
    stored = {"embed": common.store("embed", params["embed"], "bf16"),
              "final_norm": common.store("final_norm", params["final_norm"], "bf16"),
              "lm_head": common.store("lm_head", params["lm_head"], "bf16"),
              "layers": [{k: common.store(k, v, "bf16") for k, v in layer.items()}
                         for layer in params["layers"]]}
    contents = tiny_contents(config, stored)
    contents.weight_formats = common.float_weight_formats(config, "bf16")
    artifact = load_artifact(save_artifact(tmp_path / "bf16.ninfer", contents))
    assert str(artifact.params["layers"][0]["wq"].dtype) == "bfloat16"
    assert artifact.params["layers"][0]["attn_norm"].dtype == np.float32


def _copy(src: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    dst = tmp_path / "copy.ninfer"
    shutil.copytree(src, dst)
    return dst


def _edit_metadata(path: pathlib.Path, edit) -> None:
    metadata = json.loads((path / "metadata.json").read_text())
    edit(metadata)
    (path / "metadata.json").write_text(json.dumps(metadata))


@pytest.mark.parametrize("damage, file, problem", [
    (lambda p: (p / "metadata.json").unlink(), "metadata.json", "missing"),
    (lambda p: (p / "metadata.json").write_text("{not json"), "metadata.json", "not valid JSON"),
    (lambda p: _edit_metadata(p, lambda m: m.update(format_version=2)), "metadata.json",
     "format_version is 2"),
    (lambda p: _edit_metadata(p, lambda m: m.update(architecture="gpt9")), "metadata.json",
     "unknown architecture 'gpt9'"),
    (lambda p: _edit_metadata(p, lambda m: m["config"].update(hidden_size=24)), "weights",
     "tensor embed has shape (264, 16), the config needs (264, 24)"),
    (lambda p: _edit_metadata(p, lambda m: m["config"].update(num_layers=3)), "weights",
     "missing tensor layers.2.attn_norm"),
    (lambda p: _edit_metadata(p, lambda m: m["config"].update(bogus=1)), "metadata.json",
     "invalid config"),
    (lambda p: _edit_metadata(p, lambda m: m["weight_formats"].update(layers="q3")),
     "metadata.json", "unknown format 'q3'"),
    (lambda p: (p / "tokenizer.json").unlink(), "tokenizer.json", "missing"),
    (lambda p: (p / "chat_template.jinja").unlink(), "chat_template.jinja", "missing"),
    (lambda p: shutil.rmtree(p / "weights"), "weights", "missing"),
])
def test_load_errors_name_the_file_and_problem(tiny_artifact_dir, tmp_path, damage, file, problem):
    path = _copy(tiny_artifact_dir, tmp_path)
    damage(path)
    with pytest.raises(ArtifactError) as info:
        load_artifact(path)
    assert info.value.path == str(path / file)
    assert problem in info.value.problem


def test_unknown_tensor_is_rejected(tmp_path):
    config = tiny_config()
    params = random_params(config)
    params["layers"][0]["extra"] = np.zeros(3, np.float32)
    path = save_artifact(tmp_path / "extra.ninfer", tiny_contents(config, params))
    with pytest.raises(ArtifactError, match="unknown tensor layers.0.extra"):
        load_artifact(path)


def test_corrupt_checkpoint_is_reported(tiny_artifact_dir, tmp_path):
    path = _copy(tiny_artifact_dir, tmp_path)
    data_files = [f for f in (path / "weights").rglob("*") if f.is_file()
                  and f.stat().st_size > 1000]
    assert data_files
    for f in data_files:
        f.write_bytes(b"\0" * f.stat().st_size)
    with pytest.raises(ArtifactError) as info:
        load_artifact(path, verify=False)  # past the checksums: orbax's own failure
    assert info.value.path == str(path / "weights")
    assert "corrupt checkpoint" in info.value.problem


def test_damaged_weight_bytes_fail_the_checksum(tiny_artifact_dir, tmp_path):
    path = _copy(tiny_artifact_dir, tmp_path)
    metadata = json.loads((path / "metadata.json").read_text())
    recorded = metadata["checksums"]["sha256"]
    assert "tokenizer.json" in recorded and any(r.startswith("weights/") for r in recorded)
    biggest = max((f for f in (path / "weights").rglob("*") if f.is_file()),
                  key=lambda f: f.stat().st_size)
    data = bytearray(biggest.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(b ^ 0x5A for b in data[middle:middle + 4096])
    biggest.write_bytes(bytes(data))
    with pytest.raises(ArtifactError) as info:
        load_artifact(path)
    assert info.value.path == str(path / biggest.relative_to(path))
    assert "checksum mismatch" in info.value.problem
    assert load_artifact(path, weights=False).params is None  # metadata-only loads skip it
    try:  # the opt-out: whatever orbax makes of the bytes, no checksum is computed
        load_artifact(path, verify=False)
    except ArtifactError as exc:
        assert "checksum" not in exc.problem


def test_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    from ninfer_jax.artifact import weights_io

    def fail_halfway(directory, params):
        directory.mkdir()
        (directory / "partial").write_bytes(b"x" * 100)
        raise OSError("disk full")

    monkeypatch.setattr(weights_io, "save_weights", fail_halfway)
    with pytest.raises(OSError, match="disk full"):
        save_artifact(tmp_path / "broken.ninfer", tiny_contents())
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_not_replaced_without_overwrite(tiny_artifact_dir, tmp_path):
    path = _copy(tiny_artifact_dir, tmp_path)
    with pytest.raises(FileExistsError):
        save_artifact(path, tiny_contents())
    save_artifact(path, tiny_contents(), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.ninfer"]
    load_artifact(path)


def test_tensor_groups():
    assert tensor_group("embed") == "embed"
    assert tensor_group("layers.3.wq") == "layers"
    assert tensor_group("layers.3.attn_norm") == "norms"
    assert tensor_group("final_norm") == "norms"
    assert tensor_group("lm_head") == "lm_head"


def test_contents_metadata_has_every_field():
    metadata = ArtifactContents.metadata(tiny_contents())
    assert set(metadata) == {"format_version", "name", "architecture", "config",
                             "weight_formats", "special_tokens", "components", "chat_format",
                             "source"}
    assert metadata["special_tokens"]["named"] == {"<|endoftext|>": 260, "<|im_start|>": 261,
                                                   "<|im_end|>": 262}
