"""The artifact's vision component: `ninfer convert` of a tiny transformers Qwen3-VL (its tower
must encode exactly as transformers' does after the round trip), init-random presets with a
tower, loading it only on request, inspect-artifact's summary, and metadata validation."""
from __future__ import annotations

import copy
import pathlib

import jax
import numpy as np
import pytest

from ninfer_jax.artifact.convert import convert
from ninfer_jax.artifact.format import check_metadata, load_artifact, save_artifact
from ninfer_jax.artifact.inventory import describe_artifact, format_report
from ninfer_jax.artifact.random_init import init_random
from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.vision import grid, tower
from test_hf_convert import write_tokenizer_files

GRIDS = [(1, 4, 6), (2, 4, 4)]  # an image and a two-frame video


@pytest.fixture(autouse=True)
def _full_precision():
    with jax.default_matmul_precision("highest"):  # no TF32 rounding when run on a GPU
        yield



def tiny_hf_qwen3_vl():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3VLConfig(
        text_config=dict(vocab_size=264, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, eos_token_id=262,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                          "mrope_section": [4, 2, 2], "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2,
                           patch_size=4, out_hidden_size=32, num_position_embeddings=16,
                           deepstack_visual_indexes=[1]),
        image_token_id=256, video_token_id=257, vision_start_token_id=258,
        vision_end_token_id=259)
    config.vision_config._attn_implementation = "eager"
    model = transformers.Qwen3VLForConditionalGeneration(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    model = tiny_hf_qwen3_vl()
    root = tmp_path_factory.mktemp("qwen3vl")
    model.save_pretrained(root / "hf")
    write_tokenizer_files(root / "hf")
    return model, convert(root / "hf", root / "out.ninfer")


def test_converted_tower_encodes_like_transformers(converted):
    import torch

    model, path = converted
    artifact = load_artifact(path, vision=True)
    config, vision = artifact.config, artifact.vision_config
    assert config.architecture == "qwen3" and config.mrope_section == (4, 2, 2)
    assert vision.deepstack_layers == (1,) and vision.video_token_id == 257
    pixels = np.random.default_rng(0).standard_normal(
        (grid.num_patches(GRIDS), vision.patch_dim)).astype(np.float32)
    embeds, deepstack = jax.jit(tower.encode, static_argnames="config")(
        artifact.params["vision"], grid.vision_inputs(pixels, GRIDS, vision), config=vision)
    with torch.no_grad():
        out = model.model.visual(torch.from_numpy(pixels), grid_thw=torch.tensor(GRIDS))
    np.testing.assert_allclose(np.asarray(embeds), out.pooler_output.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(deepstack[0]), out.deepstack_features[0].numpy(),
                               atol=1e-4, rtol=0)


def test_the_tower_is_read_only_when_asked(converted):
    _, path = converted
    assert "vision" not in load_artifact(path).params
    report = describe_artifact(path)
    names = {row["name"] for row in report["tensors"]}
    assert "vision.blocks.1.wqkv" in names and "vision.deepstack.0.w_fc2" in names
    assert report["vision"]["depth"] == 2 and report["vision"]["parameters"] > 0
    assert "deepstack taps 1" in format_report(report)


@pytest.mark.parametrize("preset", ["qwen3-vl-tiny", "qwen3.5-tiny"])
def test_presets_carry_a_tiny_tower(preset, tmp_path):
    path = save_artifact(tmp_path / preset, init_random(preset))
    artifact = load_artifact(path, vision=True)
    vision = artifact.vision_config
    assert vision.out_hidden_size == artifact.config.hidden_size and vision.patch_size == 16
    assert bool(vision.deepstack_layers) == (preset == "qwen3-vl-tiny")
    assert artifact.metadata["weight_formats"]["vision"] == "f32"
    shapes = {name: tuple(leaf.shape) for name, leaf in
              _flatten(artifact.params["vision"], "vision.")}
    assert shapes == vision.expected_shapes("vision.")


def test_metadata_must_agree_with_the_component(converted):
    _, path = converted
    metadata = load_artifact(path, weights=False).metadata
    display = pathlib.Path("metadata.json")
    cases = [({"vision_config": None}, "exactly when vision_config"),
             ({"vision_config.image_token_id": 10_000}, "outside the vocabulary"),
             ({"vision_config.out_hidden_size": 48}, "out_hidden_size"),
             ({"config.mrope_section": []}, "needs config.mrope_section")]
    for change, message in cases:
        broken = copy.deepcopy(metadata)
        (key, value), = change.items()
        section, _, field = key.partition(".")
        if field:
            broken[section][field] = value
        else:
            broken.pop(section)
        with pytest.raises(ArtifactError, match=message):
            check_metadata(broken, display)


def _flatten(tree, prefix):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flatten(value, f"{prefix}{key}.")
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from _flatten(value, f"{prefix}{index}.")
    else:
        yield prefix[:-1], tree
