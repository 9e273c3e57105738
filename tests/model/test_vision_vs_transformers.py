"""The vision tower against transformers' Qwen3-VL vision model (f32, eager attention).

Two images of different sizes (neither the 4 x 4 learned position grid's size) and a two-frame
video are encoded in one pass, padded to a larger bucket; merged embeddings and deepstack
features must match HF within 1e-4, and padding must not change the real rows.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hf_vision_reference import (load_tensors, load_vision_params, tiny_qwen3_vl,
                                 vision_reference)
from ninfer_jax.artifact.hf_vision import vision_config
from ninfer_jax.model.vision import grid, tower

GRIDS = [(1, 4, 6), (1, 8, 4), (2, 4, 4)]  # image, image, video of two temporal patches
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    model = tiny_qwen3_vl()
    checkpoint = tmp_path_factory.mktemp("qwen3_vl")
    model.save_pretrained(checkpoint)
    import json
    hf = json.loads((checkpoint / "config.json").read_text())
    config = vision_config(hf, checkpoint / "config.json", text_hidden=48)
    params = jax.tree.map(jnp.asarray, load_vision_params(load_tensors(checkpoint)))
    pixels = np.random.default_rng(3).standard_normal(
        (grid.num_patches(GRIDS), config.patch_dim)).astype(np.float32)
    return model, config, params, pixels


def test_tower_matches_transformers_for_images_and_video(reference):
    model, config, params, pixels = reference
    expected_embeds, expected_deepstack = vision_reference(model, pixels, GRIDS)
    encode = jax.jit(functools.partial(tower.encode, config=config))
    real = grid.num_patches(GRIDS)
    tokens = real // config.merge_unit
    for num_rows in (real, real + 3 * config.merge_unit):  # exact, and padded to a bucket
        embeds, deepstack = encode(params, grid.vision_inputs(pixels, GRIDS, config, num_rows))
        assert embeds.shape == (num_rows // config.merge_unit, 48)
        assert deepstack.shape == (2, num_rows // config.merge_unit, 48)
        np.testing.assert_allclose(np.asarray(embeds[:tokens]), expected_embeds,
                                   atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(np.asarray(deepstack[:, :tokens]), expected_deepstack,
                                   atol=TOLERANCE, rtol=0)
    assert np.abs(expected_embeds).max() > 0.5  # the comparison is not between near-zeros


def test_each_item_sees_only_its_own_frames(reference):
    """Encoding the second image alone gives the rows it gets in the joint pass."""
    _, config, params, pixels = reference
    first = grid.num_patches(GRIDS[:1])
    alone = pixels[first:first + grid.num_patches(GRIDS[1:2])]
    joint, _ = tower.encode(params, grid.vision_inputs(pixels, GRIDS, config), config=config)
    single, _ = tower.encode(params, grid.vision_inputs(alone, GRIDS[1:2], config),
                             config=config)
    span = slice(first // config.merge_unit, (first + len(alone)) // config.merge_unit)
    np.testing.assert_allclose(np.asarray(single), np.asarray(joint[span]), atol=1e-5, rtol=0)


def test_bad_inputs_are_refused(reference):
    _, config, _, pixels = reference
    with pytest.raises(ValueError, match="pixel_values has shape"):
        grid.vision_inputs(pixels[:-1], GRIDS, config)
    with pytest.raises(ValueError, match="multiple of"):
        grid.vision_inputs(pixels, GRIDS, config, num_rows=grid.num_patches(GRIDS) + 1)
    with pytest.raises(ValueError, match="merge size"):
        grid.vision_inputs(pixels[:12], [(1, 3, 4)], config)
