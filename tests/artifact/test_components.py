"""The mtp component: written to mtp/ beside weights/, read only when asked for, and
validated like the text weights (missing directory, metadata that disagrees, wrong shapes)."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from ninfer_jax.artifact import weights_io
from ninfer_jax.artifact.components import mtp_expected_shapes
from ninfer_jax.artifact.format import load_artifact, save_artifact, tensor_group
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.errors import ArtifactError
from tiny_artifacts import tiny_contents


def hybrid_contents():
    config = dataclasses.replace(PRESETS["qwen3.6-tiny-moe"].config, vocab_size=264)
    contents = tiny_contents(config, random_params(config, seed=0, dtype="f32"))
    contents.components = dict(contents.components, mtp=True)
    contents.weight_formats = dict(contents.weight_formats, mtp="f32")
    return contents


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    return save_artifact(tmp_path_factory.mktemp("mtp") / "h.ninfer", hybrid_contents())


def test_mtp_lives_in_its_own_checkpoint(hybrid_dir):
    assert (hybrid_dir / "mtp").is_dir()
    text_names = {name for name, _ in weights_io.walk_tree(weights_io.stored_tree(hybrid_dir / "weights"))}
    assert not any(name.startswith("mtp") for name in text_names)
    artifact = load_artifact(hybrid_dir)
    assert "mtp" not in artifact.params and artifact.components["mtp"]
    head = load_artifact(hybrid_dir, mtp=True).params["mtp"]
    for name, shape in mtp_expected_shapes(artifact.config).items():
        assert weights_io.subtree(head, name[len("mtp."):]).shape == shape, name


def test_mtp_norms_and_gdn_vectors_are_in_the_f32_norms_group():
    assert tensor_group("mtp.pre_fc_norm_embedding") == tensor_group("mtp.norm") == "norms"
    assert tensor_group("layers.0.A_log") == tensor_group("layers.0.dt_bias") == "norms"
    assert tensor_group("mtp.fc") == tensor_group("mtp.layers.0.wq") == "mtp"


def test_asking_for_an_absent_mtp_head_fails(tiny_artifact_dir):
    with pytest.raises(ArtifactError, match="no mtp component"):
        load_artifact(tiny_artifact_dir, mtp=True)


def test_missing_mtp_directory_names_it(hybrid_dir, tmp_path):
    broken = shutil.copytree(hybrid_dir, tmp_path / "b.ninfer")
    shutil.rmtree(broken / "mtp")
    with pytest.raises(ArtifactError) as info:
        load_artifact(broken, weights=False)
    assert info.value.path == str(broken / "mtp")


def test_components_must_agree_with_the_config(hybrid_dir, tmp_path):
    broken = shutil.copytree(hybrid_dir, tmp_path / "b.ninfer")
    metadata = json.loads((broken / "metadata.json").read_text())
    metadata["components"]["mtp"] = False
    (broken / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(ArtifactError, match="components.mtp must be true exactly when"):
        load_artifact(broken, weights=False)


def test_save_refuses_an_mtp_tree_the_metadata_does_not_declare(tmp_path):
    contents = hybrid_contents()
    contents.components["mtp"] = False
    with pytest.raises(ArtifactError):
        save_artifact(tmp_path / "x.ninfer", contents)
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_mtp_shape_is_reported_with_its_name(tmp_path):
    contents = hybrid_contents()
    contents.params["mtp"]["fc"] = np.zeros((3, 3), np.float32)
    path = save_artifact(tmp_path / "x.ninfer", contents)  # metadata-level checks pass
    with pytest.raises(ArtifactError, match=r"tensor mtp.fc has shape \(3, 3\)"):
        load_artifact(path, mtp=True)
