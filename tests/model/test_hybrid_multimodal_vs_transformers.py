"""The hybrid Qwen3.5 forward with media against transformers' Qwen3_5ForConditionalGeneration
(f32, eager): a prompt with an image and a two-frame video, prefilled in chunks of 8 through
the Gated DeltaNet state slot and the paged KV, MRoPE over the partial rotary dims; every
chunk's last logits must match the full HF forward within 1e-4."""
from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

from hf_hybrid_reference import _COMMON, _random_like, load_params, model_config_from_hf
from hf_vision_reference import (END, IMAGE, START, VIDEO, load_vision_params, media_prompt,
                                 multimodal_reference_logits)
from ninfer_jax.artifact.hf_vision import vision_config
from ninfer_jax.model import hybrid, multimodal
from ninfer_jax.model.vision import grid, mrope, tower

GRIDS = [(1, 4, 6), (2, 4, 4)]  # an image, then a video of two temporal patches
PAGE_SIZE, NUM_PAGES, WIDTH, CHUNK, SLOT = 4, 16, 12, 8, 1
MROPE_SECTION = [2, 1, 1]  # rotary dim 8 (head 16, factor 0.5): 4 frequencies


class _Renamed:
    """The wrapper's language model seen as a causal LM's state dict (model.layers.*)."""

    def __init__(self, model):
        self._tensors = {k.replace("model.language_model.", "model."): v
                         for k, v in model.state_dict().items() if "visual" not in k}

    def state_dict(self):
        return self._tensors


@pytest.fixture(autouse=True)
def _full_precision():
    with jax.default_matmul_precision("highest"):  # no TF32 rounding when run on a GPU
        yield



def test_hybrid_multimodal_prefill_matches_transformers():
    torch.manual_seed(0)
    rope = dict(_COMMON["rope_parameters"], mrope_section=MROPE_SECTION, mrope_interleaved=True)
    text = dict(_COMMON, vocab_size=128, intermediate_size=40, rope_parameters=rope)
    text.pop("attn_implementation")
    hf_config = Qwen3_5Config(
        text_config=text, tie_word_embeddings=True, image_token_id=IMAGE,
        video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2,
                           patch_size=4, out_hidden_size=32, num_position_embeddings=16))
    for sub in (hf_config, hf_config.text_config, hf_config.vision_config):
        sub._attn_implementation = "eager"
    model = Qwen3_5ForConditionalGeneration(hf_config)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            tensor.copy_(_random_like(name, tensor) if "visual" not in name
                         else 0.3 * torch.randn_like(tensor))
    model = model.float().eval()
    vision = vision_config(hf_config.to_dict(), pathlib.Path("<test>"), text_hidden=32)
    config = model_config_from_hf(hf_config.text_config)
    config = dataclasses.replace(config, vocab_size=128, tie_word_embeddings=True,
                                 mrope_section=tuple(MROPE_SECTION))
    params = jax.tree.map(jnp.asarray, load_params(_Renamed(model), config))
    tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    vision_params = jax.tree.map(jnp.asarray, load_vision_params(tensors))

    rng = np.random.default_rng(6)
    pixels = rng.standard_normal((grid.num_patches(GRIDS), vision.patch_dim)).astype(np.float32)
    split = grid.num_patches(GRIDS[:1])
    prompt = media_prompt(rng, [grid.num_tokens(GRIDS[0], vision)], [4, 4])
    expected = multimodal_reference_logits(model, prompt, pixels[:split], GRIDS[:1],
                                           pixels[split:], GRIDS[1:])
    types = mrope.token_types(prompt, vision)
    positions, _ = mrope.rope_positions(types, GRIDS[:1], GRIDS[1:], vision)
    embeds, deepstack = tower.encode(vision_params, grid.vision_inputs(pixels, GRIDS, vision),
                                     config=vision)
    assert deepstack.shape[0] == 0
    is_media = jnp.asarray(types != mrope.TEXT)
    rows = multimodal.place(is_media, embeds)
    caches = hybrid.init_caches(config, num_pages=NUM_PAGES, page_size=PAGE_SIZE,
                                num_state_slots=2, dtype=jnp.float32, kv_dtype=jnp.float32)
    prefill = jax.jit(functools.partial(hybrid.prefill, config=config, page_size=PAGE_SIZE))
    table = np.arange(1, 1 + WIDTH, dtype=np.int32)
    assert len(prompt) <= WIDTH * PAGE_SIZE
    for start in range(0, len(prompt), CHUNK):
        num = min(CHUNK, len(prompt) - start)
        pad, take = CHUNK - num, slice(start, start + num)
        chunk = np.zeros(CHUNK, np.int32)
        chunk[:num] = prompt[take]
        media = multimodal.MediaRows(jnp.pad(jnp.asarray(positions[:, take]), ((0, 0), (0, pad))),
                                     jnp.pad(rows[take], ((0, pad), (0, 0))),
                                     jnp.pad(is_media[take], (0, pad)), jnp.zeros((0, CHUNK, 32)))
        logits, caches = prefill(params, caches, chunk, np.int32(start), np.int32(num), table,
                                 np.int32(SLOT), media=media)
        np.testing.assert_allclose(np.asarray(logits), expected[start + num - 1], atol=1e-4,
                                   rtol=0)
