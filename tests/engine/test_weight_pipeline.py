"""The pipelined weight load (engine/weight_pipeline.py) against the sequential one it
replaces: load_artifact's numpy tree through runner.place_params."""
from __future__ import annotations

import json
import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.artifact import weights_io
from ninfer_jax.artifact.format import load_artifact, save_artifact
from ninfer_jax.engine import weight_pipeline
from ninfer_jax.engine.runner import place_params
from ninfer_jax.errors import ArtifactError

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "artifact"))

from tiny_artifacts import tiny_config, tiny_contents  # noqa: E402

Options = weight_pipeline.PipelineOptions


def _contents(kind: str):
    from ninfer_jax.artifact import convert_common

    if kind == "llama":
        return tiny_contents(tiny_config(num_layers=5))
    if kind == "llama-32":  # every K a multiple of the GGUF blocks' 32
        return tiny_contents(tiny_config(num_layers=3, hidden_size=32, intermediate_size=64,
                                         head_dim=8))
    if kind == "qwen3-int8":
        return convert_common.apply_quantization(
            tiny_contents(tiny_config(architecture="qwen3", num_layers=3)), "int8")
    return tiny_contents(tiny_config(  # hybrid: its own groups fuse (fused_leaves)
        architecture="qwen3_5", layer_types=("linear_attention", "full_attention"),
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=4,
        linear_value_head_dim=4, linear_conv_kernel_dim=2))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    return {kind: save_artifact(root / f"{kind}.ninfer", _contents(kind))
            for kind in ("llama", "llama-32", "qwen3-int8", "qwen3.5")}


def _assert_same_leaves(expected, found):
    want, got = dict(weights_io.walk_tree(expected)), dict(weights_io.walk_tree(found))
    assert sorted(want) == sorted(got)
    for name, leaf in want.items():
        assert isinstance(got[name], jax.Array), name
        assert got[name].sharding.memory_kind == "device", name  # not left in pinned host
        assert (got[name].shape, got[name].dtype) == (leaf.shape, leaf.dtype), name
        assert np.asarray(got[name]).tobytes() == np.asarray(leaf).tobytes(), name


@pytest.mark.parametrize("kind, dtype, options", [
    ("llama", jnp.float32, Options(part_bytes=0, device_fuse=True)),
    ("llama", jnp.bfloat16, Options(workers=2, part_bytes=5000)),  # cast on the host
    ("llama", jnp.float32, Options(workers=3, device_fuse=False)),  # all layers one part
    ("llama", jnp.float32, Options(part_bytes=0, device_fuse=True, via_pinned=True)),
    ("qwen3-int8", jnp.float32, Options(workers=2, part_bytes=0, device_fuse=True)),
    ("qwen3.5", jnp.float32, Options(part_bytes=0)),  # hybrid groups, on the device
])
def test_the_pipelined_load_equals_the_sequential_one(saved, kind, dtype, options):
    path = saved[kind]
    sequential = load_artifact(path)
    expected = place_params(sequential.params, sequential.config, dtype)
    pipelined = load_artifact(path, placement=weight_pipeline.placement(
        sequential.config, dtype, options=options))
    _assert_same_leaves(expected, pipelined.params)
    fused = [("in_qkvzba" if "in_qkvzba" in layer or "in_qkv" in layer else "wqkv") in layer
             for layer in pipelined.params["layers"]]
    assert fused == [True] * len(fused)


def test_parts_cover_every_leaf_once_with_the_largest_entry_first(saved):
    structure = weights_io.stored_tree(saved["llama"] / "weights")
    layer_bytes = sum(int(np.prod(leaf.shape)) * 4
                      for _, leaf in weights_io.walk_tree(structure["layers"][0]))
    parts = weights_io.split_parts(structure, part_bytes=layer_bytes + 1)  # 2 layers a part
    assert parts[0].keys in {("embed",), ("lm_head",)} and parts[0].num_bytes == 264 * 16 * 4
    assert [part.layers for part in parts if part.layers] == [(0, 1), (2, 3), (4,)]
    assert [part.num_bytes for part in parts if part.layers] == [2 * layer_bytes,
                                                                 2 * layer_bytes, layer_bytes]
    names = []
    for part in parts:
        restored = weights_io.restore_part(saved["llama"] / "weights", structure, part)
        names += [name for name, _ in weights_io.walk_tree(
            {**{key: restored[key] for key in part.keys},
             **({"layers": dict(zip(map(str, part.layers), restored["layers"]))}
                if part.layers else {})})]
    assert sorted(names) == sorted(name for name, _ in weights_io.walk_tree(structure))


def test_a_damaged_file_still_fails_the_load_by_its_checksum(saved, tmp_path):
    path = pathlib.Path(shutil.copytree(saved["llama"], tmp_path / "copy.ninfer"))
    biggest = max((f for f in (path / "weights").rglob("*") if f.is_file()),
                  key=lambda f: f.stat().st_size)
    data = bytearray(biggest.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 256] = bytes(b ^ 0x5A for b in data[middle:middle + 256])
    biggest.write_bytes(bytes(data))
    assert json.loads((path / "metadata.json").read_text())["checksums"]
    config = load_artifact(path, weights=False).config
    with pytest.raises(ArtifactError) as info:
        load_artifact(path, placement=weight_pipeline.placement(config, jnp.float32))
    assert info.value.path == str(path / biggest.relative_to(path))
    assert "checksum mismatch" in info.value.problem


def _world(saved):
    structure = weights_io.stored_tree(saved["llama"] / "weights")
    return structure, load_artifact(saved["llama"], weights=False).config


def _broken(path):
    return ArtifactError(path, "corrupt checkpoint (test)")


def test_a_failure_stops_the_parts_not_yet_started_then_one_whole_read_is_tried(saved):
    structure, config = _world(saved)
    started = []

    def read_part(part):
        started.append(part)
        raise _broken(saved["llama"] / "weights")

    with pytest.raises(ArtifactError, match="corrupt checkpoint"):
        weight_pipeline.place_in_parts(structure, read_part, config=config,
                                       dtype=jnp.float32,
                                       options=Options(workers=1, part_bytes=0))
    # the first part failed, seven more were cancelled, then the whole tree failed too
    assert started == [weights_io.split_parts(structure)[0], weights_io.whole_part(structure)]


def test_an_orbax_whose_partial_reads_fail_still_loads_whole(saved):
    structure, config = _world(saved)
    whole = weights_io.whole_part(structure)

    def read_part(part):
        if part != whole:
            raise _broken(saved["llama"] / "weights")
        return weights_io.restore_part(saved["llama"] / "weights", structure, part)

    placed = weight_pipeline.place_in_parts(structure, read_part, config=config,
                                            dtype=jnp.float32)
    sequential = load_artifact(saved["llama"])
    _assert_same_leaves(place_params(sequential.params, config, jnp.float32), placed)


def test_a_failure_cancels_the_rest_while_an_earlier_part_still_runs(saved):
    import threading

    structure, config = _world(saved)
    release, started = threading.Event(), []

    def read_part(part):
        started.append(part)
        if part.keys == ("embed",):  # the first part runs until released
            release.wait(30)
            return weights_io.restore_part(saved["llama"] / "weights", structure, part)
        raise _broken(saved["llama"] / "weights")

    threading.Timer(1.0, release.set).start()  # the embedding's read ends in any case
    with pytest.raises(ArtifactError, match="corrupt checkpoint"):
        weight_pipeline.place_in_parts(structure, read_part, config=config,
                                       dtype=jnp.float32,
                                       options=Options(workers=2, part_bytes=0))
    # 8 parts; waiting on them in order would have let the second worker start them all
    # while the first read ran (its failing worker may take one more before the cancel);
    # then the whole tree's read
    assert len(started) <= 4 and started[-1] == weights_io.whole_part(structure)


@pytest.mark.parametrize("fmt", ["q8_0", "int8"])
def test_serve_weights_quantizes_each_part_as_convert_would(saved, fmt):
    # `ninfer serve --weights FMT`: the float projections quantized as the parts are read,
    # the same leaves as converting the artifact with --weights FMT and loading that
    from ninfer_jax.artifact import convert_common

    path = saved["llama-32"]
    sequential = load_artifact(path)
    converted = convert_common.quantize_projections(
        {k: v for k, v in sequential.params.items()}, fmt)
    expected = place_params(converted, sequential.config, jnp.float32)
    pipelined = load_artifact(path, placement=weight_pipeline.placement(
        sequential.config, jnp.float32, options=Options(part_bytes=0, quantize=fmt)))
    _assert_same_leaves(expected, pipelined.params)
    layer = pipelined.params["layers"][0]
    assert sorted(layer["wqkv"]) == sorted(expected["layers"][0]["wqkv"])
    assert fmt in layer["wqkv"] and fmt in layer["w_down"]
    assert not isinstance(pipelined.params["embed"], dict)  # the table stays float
