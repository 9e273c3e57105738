"""Our llama/qwen3 steps against transformers (f32, eager attention) on tiny random models.

The sequence is ingested by chunked prefill (several chunks, non-zero start offsets, a padded
last chunk) through a permuted page table, then decoded for 16 steps in a batch whose second
row is padding; every logit row must match the HF full-sequence forward within 1e-4.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hf_reference import reference_logits, saved_tiny_model
from ninfer_jax.kernels import paged_attention
from ninfer_jax.model import llama, ragged_batch

PAGE_SIZE = 4
NUM_PAGES = 40
CHUNK = 16
PROMPT_LEN = 37  # chunks of 16, 16 and a padded 5
NUM_DECODE = 16
TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def reference(request, tmp_path_factory):
    model, tiny = saved_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    config, params = tiny.config, jax.tree_util.tree_map(jnp.asarray, tiny.params)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, config.vocab_size, PROMPT_LEN + NUM_DECODE)
    import torch

    with torch.no_grad():  # the residual stream after each layer but the last (normed there)
        hidden = model(torch.tensor([tokens[:PROMPT_LEN].tolist()]),
                       output_hidden_states=True).hidden_states[1:-1]
    return (config, params, tokens, reference_logits(model, tokens),
            np.concatenate([h[0].float().numpy() for h in hidden], axis=-1))


def test_taps_are_the_residual_stream_after_each_layer(reference):
    """llama.ragged's `taps` (the DFlash drafters' context) over a prompt in one chunk:
    transformers' hidden_states[i + 1] for each layer i, concatenated."""
    config, params, tokens, _, expected = reference
    taps = tuple(range(config.num_layers - 1))
    batch = ragged_batch.chunk_only(jnp.asarray(tokens[:PROMPT_LEN], jnp.int32), jnp.int32(0),
                                    jnp.int32(PROMPT_LEN), jnp.arange(1, NUM_PAGES,
                                                                      dtype=jnp.int32))
    ragged = jax.jit(functools.partial(llama.ragged, config=config, page_size=PAGE_SIZE,
                                       taps=taps))
    _, _, tapped = ragged(params, empty_kv(config), batch, None)
    assert len(taps) >= 1 and tapped.shape == expected.shape
    np.testing.assert_allclose(np.asarray(tapped), expected, atol=TOLERANCE, rtol=0)


def empty_kv(config):
    shape = paged_attention.get_kv_cache_shape(NUM_PAGES, PAGE_SIZE, config.num_kv_heads,
                                               config.head_dim)
    return [(jnp.zeros(shape), jnp.zeros(shape)) for _ in range(config.num_layers)]


def test_chunked_prefill_then_decode_matches_transformers(reference):
    config, params, tokens, expected, _ = reference
    total = PROMPT_LEN + NUM_DECODE
    # Pages in a scrambled order, never the dummy page: a non-contiguous sequence.
    page_table = np.random.default_rng(2).permutation(np.arange(1, NUM_PAGES))[
        : -(-total // PAGE_SIZE)].astype(np.int32)
    prefill = jax.jit(functools.partial(llama.prefill, config=config, page_size=PAGE_SIZE))
    decode = jax.jit(functools.partial(llama.decode, config=config, page_size=PAGE_SIZE))
    kv = empty_kv(config)

    for start in range(0, PROMPT_LEN, CHUNK):
        num = min(CHUNK, PROMPT_LEN - start)
        chunk = np.zeros(CHUNK, np.int32)
        chunk[:num] = tokens[start:start + num]
        logits, kv = prefill(params, kv, chunk, np.int32(start), np.int32(num), page_table)
        np.testing.assert_allclose(np.asarray(logits), expected[start + num - 1],
                                   atol=TOLERANCE, rtol=0)

    dummy_row = np.full_like(page_table, paged_attention.DUMMY_PAGE)
    for position in range(PROMPT_LEN, total):
        batch_tokens = np.array([tokens[position], 0], np.int32)
        positions = np.array([position, 0], np.int32)
        logits, kv = decode(params, kv, batch_tokens, positions, np.stack([page_table, dummy_row]))
        np.testing.assert_allclose(np.asarray(logits[0]), expected[position],
                                   atol=TOLERANCE, rtol=0)
