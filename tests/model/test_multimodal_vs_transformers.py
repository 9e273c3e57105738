"""The vision tower and the multimodal forward against transformers' Qwen3-VL (f32, eager).

Two images of different sizes (neither the 4 x 4 learned position grid's size) and a two-frame
video are encoded in one pass, padded to a larger bucket; merged embeddings and deepstack
features must match HF within 1e-4, and padding must not change the real rows. Then a prompt
holding the three items is prefilled in chunks of 8 (chunk boundaries cut through media spans)
through a permuted page table and decoded for a few steps through the ragged row region; every
logit row must match Qwen3VLForConditionalGeneration's full forward within 1e-4.
"""
from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from hf_vision_reference import (load_tensors, load_text_params, load_vision_params,
                                 media_prompt, multimodal_reference_logits, tiny_qwen3_vl,
                                 vision_reference)
from ninfer_jax.artifact.hf_convert import model_config
from ninfer_jax.artifact.hf_vision import vision_config
from ninfer_jax.kernels import paged_attention
from ninfer_jax.model import llama, multimodal, ragged_batch
from ninfer_jax.model.vision import grid, mrope, tower

GRIDS = [(1, 4, 6), (1, 8, 4), (2, 4, 4)]  # image, image, video of two temporal patches
TOLERANCE = 1e-4
PAGE_SIZE = 4
NUM_PAGES = 24
CHUNK = 8
NUM_DECODE = 4
TABLE_WIDTH = 12  # pages of the longest sequence here (46 tokens); one width, one compile
# Shared compiled steps: eager calls run op by op (the attention kernels in interpret mode).
ENCODE = jax.jit(tower.encode, static_argnames="config")
PREFILL = jax.jit(llama.prefill, static_argnames=("config", "page_size"))
RAGGED = jax.jit(llama.ragged, static_argnames=("config", "page_size"))


@pytest.fixture(autouse=True)
def _full_precision():
    with jax.default_matmul_precision("highest"):  # no TF32 rounding when run on a GPU
        yield



@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    model = tiny_qwen3_vl()
    checkpoint = tmp_path_factory.mktemp("qwen3_vl")
    model.save_pretrained(checkpoint)
    hf = json.loads((checkpoint / "config.json").read_text())
    config = vision_config(hf, checkpoint / "config.json", text_hidden=48)
    text_config = model_config(hf, checkpoint / "config.json")
    tensors = load_tensors(checkpoint)
    params = jax.tree.map(jnp.asarray, load_vision_params(tensors))
    text_params = jax.tree.map(jnp.asarray, load_text_params(tensors, text_config))
    pixels = np.random.default_rng(3).standard_normal(
        (grid.num_patches(GRIDS), config.patch_dim)).astype(np.float32)
    return model, config, params, pixels, text_config, text_params


def test_tower_matches_transformers_for_images_and_video(reference):
    model, config, params, pixels = reference[:4]
    expected_embeds, expected_deepstack = vision_reference(model, pixels, GRIDS)
    encode = functools.partial(ENCODE, config=config)
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
    _, config, params, pixels = reference[:4]
    first = grid.num_patches(GRIDS[:1])
    alone = pixels[first:first + grid.num_patches(GRIDS[1:2])]
    joint, _ = ENCODE(params, grid.vision_inputs(pixels, GRIDS, config), config=config)
    single, _ = ENCODE(params, grid.vision_inputs(alone, GRIDS[1:2], config), config=config)
    span = slice(first // config.merge_unit, (first + len(alone)) // config.merge_unit)
    np.testing.assert_allclose(np.asarray(single), np.asarray(joint[span]), atol=1e-5, rtol=0)


def test_bad_inputs_are_refused(reference):
    _, config, _, pixels = reference[:4]
    with pytest.raises(ValueError, match="pixel_values has shape"):
        grid.vision_inputs(pixels[:-1], GRIDS, config)
    with pytest.raises(ValueError, match="multiple of"):
        grid.vision_inputs(pixels, GRIDS, config, num_rows=grid.num_patches(GRIDS) + 1)
    with pytest.raises(ValueError, match="merge size"):
        grid.vision_inputs(pixels[:12], [(1, 3, 4)], config)


def empty_kv(config):
    shape = paged_attention.get_kv_cache_shape(NUM_PAGES, PAGE_SIZE, config.num_kv_heads,
                                               config.head_dim)
    return [(jnp.zeros(shape), jnp.zeros(shape)) for _ in range(config.num_layers)]


def chunk_media(positions, is_media, embeds, deepstack, start, num):
    """MediaRows of one CHUNK-row prefill chunk at `start` holding `num` real tokens."""
    pad = CHUNK - num
    take = slice(start, start + num)
    return multimodal.MediaRows(
        rope_positions=jnp.pad(positions[:, take], ((0, 0), (0, pad))),
        embeds=jnp.pad(embeds[take], ((0, pad), (0, 0))),
        is_media=jnp.pad(is_media[take], (0, pad)),
        deepstack=jnp.pad(deepstack[:, take], ((0, 0), (0, pad), (0, 0))))


def test_multimodal_prefill_and_decode_match_transformers(reference):
    model, config, params, pixels, text_config, text_params = reference
    split = grid.num_patches(GRIDS[:2])
    image_tokens = [grid.num_tokens(g, config) for g in GRIDS[:2]]
    t, h, w = GRIDS[2]
    frame_tokens = [h * w // config.merge_unit] * t
    rng = np.random.default_rng(4)
    prompt = media_prompt(rng, image_tokens, frame_tokens)
    tokens = np.concatenate([prompt, rng.integers(0, 100, NUM_DECODE)])
    expected = multimodal_reference_logits(model, tokens, pixels[:split], GRIDS[:2],
                                           pixels[split:], GRIDS[2:])
    types = mrope.token_types(prompt, config)
    positions, delta = mrope.rope_positions(types, GRIDS[:2], GRIDS[2:], config)
    hf_positions, hf_delta = model.model.get_rope_index(
        torch.from_numpy(tokens)[None], mm_token_type_ids=torch.from_numpy(
            mrope.token_types(tokens, config).astype(np.int64))[None],
        image_grid_thw=torch.tensor(GRIDS[:2]), video_grid_thw=torch.tensor(GRIDS[2:]))
    np.testing.assert_array_equal(positions, hf_positions[:, 0, :len(prompt)].numpy())
    assert delta == int(hf_delta) and delta < 0  # the grids are shorter than their spans

    embeds, deepstack = ENCODE(params, grid.vision_inputs(pixels, GRIDS, config),
                               config=config)
    is_media = jnp.asarray(types != mrope.TEXT)
    row_embeds = multimodal.place(is_media, embeds)
    row_deepstack = jax.vmap(lambda f: multimodal.place(is_media, f))(deepstack)
    assert len(tokens) <= TABLE_WIDTH * PAGE_SIZE
    page_table = np.random.default_rng(2).permutation(np.arange(1, NUM_PAGES))[
        :TABLE_WIDTH].astype(np.int32)
    prefill = functools.partial(PREFILL, config=text_config, page_size=PAGE_SIZE)
    kv = empty_kv(text_config)
    for start in range(0, len(prompt), CHUNK):
        num = min(CHUNK, len(prompt) - start)
        chunk = np.zeros(CHUNK, np.int32)
        chunk[:num] = prompt[start:start + num]
        media = chunk_media(jnp.asarray(positions), is_media, row_embeds, row_deepstack,
                            start, num)
        logits, kv = prefill(text_params, kv, chunk, np.int32(start), np.int32(num),
                             page_table, media=media)
        np.testing.assert_allclose(np.asarray(logits), expected[start + num - 1],
                                   atol=TOLERANCE, rtol=0)

    ragged = functools.partial(RAGGED, config=text_config, page_size=PAGE_SIZE)
    dummy_row = np.full_like(page_table, paged_attention.DUMMY_PAGE)
    no_chunk = jnp.zeros((0, text_config.hidden_size))
    for position in range(len(prompt), len(tokens)):
        batch = ragged_batch.rows_only(jnp.asarray([tokens[position], 0], jnp.int32),
                                       jnp.asarray([position, 0], jnp.int32),
                                       jnp.asarray(np.stack([page_table, dummy_row])))
        rows = np.array([position + delta, 0], np.int32)
        media = multimodal.MediaRows(jnp.asarray(np.broadcast_to(rows, (3, 2))), no_chunk,
                                     jnp.zeros(0, bool), jnp.zeros((2, 0, 48)))
        logits, kv = ragged(text_params, kv, batch, None, media=media)
        np.testing.assert_allclose(np.asarray(logits[1]), expected[position],
                                   atol=TOLERANCE, rtol=0)


def test_text_only_mrope_equals_the_text_path(reference):
    """With the three axes equal and no media rows, the media path gives the text numbers."""
    *_, text_config, text_params = reference
    tokens = np.random.default_rng(5).integers(0, 100, CHUNK).astype(np.int32)
    page_table = np.arange(1, 1 + TABLE_WIDTH, dtype=np.int32)
    start, num = np.int32(0), np.int32(CHUNK)
    plain, _ = PREFILL(text_params, empty_kv(text_config), tokens, start, num, page_table,
                             config=text_config, page_size=PAGE_SIZE)
    media = multimodal.MediaRows(
        jnp.asarray(np.broadcast_to(np.arange(CHUNK, dtype=np.int32), (3, CHUNK))),
        jnp.zeros((CHUNK, 48)), jnp.zeros(CHUNK, bool), jnp.zeros((2, CHUNK, 48)))
    with_media, _ = PREFILL(text_params, empty_kv(text_config), tokens, start, num,
                            page_table, config=text_config, page_size=PAGE_SIZE, media=media)
    # Equal math, not equal kernels: the GPU's f32 trig and fusions differ by ~3e-6 (run 28b).
    np.testing.assert_allclose(np.asarray(with_media), np.asarray(plain), atol=1e-5, rtol=0)
