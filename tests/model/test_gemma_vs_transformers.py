"""The Gemma 4 text family (gemma4) against transformers' Gemma4ForCausalLM in f32.

A tiny random model with every norm weight and layer_scalar randomised: six layers, sliding
(window 8) and full attention interleaved, full layers with their own head dim (32 vs 16),
one kv head and keys reused as values (attention_k_eq_v), proportional RoPE on a quarter of
the full layers' pairs, per-layer inputs, the last two layers KV-shared with a double-wide MLP,
final logit soft-capping, tied embeddings. The weights go through our converter
(save_pretrained, then hf_convert / hf_gemma), so the tensor names are checked too. Checks:
  - a prompt in chunks at odd offsets (13, 17, a padded 7) through a shuffled page table, then
    16 decode steps beside a padding row (positions to 52: the window is passed many times
    over, and the sliding layers' rings of 6 pages, 24 positions, wrap twice): every logit
    row within 1e-4 of HF's full forward;
  - a mixed ragged step (one sequence's chunk plus another's decode row, each on its slot);
  - greedy decoding of 16 tokens from our own samples equals HF's generate;
  - the sliding layers' memory: rings sized by window and step, not by pages or context.
"""
from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_reference import randomize
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

from ninfer_jax.artifact import hf_convert, hf_gemma
from ninfer_jax.artifact.hf_convert import _sources
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE
from ninfer_jax.model import gemma
from ninfer_jax.model.ragged_batch import FROM_HOST, RaggedBatch

PAGE_SIZE = 4
WIDTH = 16  # pages per table: 64 positions
NUM_PAGES = 1 + 2 * WIDTH
SLOTS = (1, 2)  # sequence i's state slot (slot 0 is the dummy)
CHUNK = 17
PROMPT_LEN = 37  # chunks of 13, 17 and a padded 7
NUM_DECODE = 16
WINDOW = 8
TOLERANCE = 1e-4
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention",
               "sliding_attention", "sliding_attention", "full_attention"]


@pytest.fixture(autouse=True)
def exact_f32_matmuls():
    with jax.default_matmul_precision("highest"):
        yield


def tiny_gemma_model(seed: int = 0):
    torch.manual_seed(seed)
    hf_config = Gemma4TextConfig(
        vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=WINDOW,
        layer_types=LAYER_TYPES, hidden_size_per_layer_input=8, vocab_size_per_layer_input=96,
        num_kv_shared_layers=2, use_double_wide_mlp=True, final_logit_softcapping=30.0,
        max_position_embeddings=256,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000.0}},
        attn_implementation="eager")
    model = Gemma4ForCausalLM(hf_config)
    randomize(model)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.layer_scalar.copy_(0.8 + 0.4 * torch.rand(1))
    return model.float().eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    model = tiny_gemma_model()
    checkpoint = tmp_path_factory.mktemp("gemma4")
    model.save_pretrained(checkpoint)
    config = hf_convert.model_config(model.config.to_dict() | {
        "architectures": ["Gemma4ForCausalLM"]}, pathlib.Path(checkpoint, "config.json"))
    params = hf_gemma.gemma_params(_sources(checkpoint), config, "f32", None)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, (2, PROMPT_LEN + NUM_DECODE))
    with torch.no_grad():
        expected = [model(torch.tensor([list(seq)])).logits[0].float().numpy() for seq in tokens]
    tables = np.random.default_rng(2).permutation(np.arange(1, NUM_PAGES)).astype(
        np.int32).reshape(2, WIDTH)
    steps = {name: jax.jit(functools.partial(getattr(gemma, name), config=config,
                                             page_size=PAGE_SIZE))
             for name in ("prefill", "decode", "ragged")}  # compiled once for the module
    return model, config, params, tokens, expected, tables, steps


def empty_kv(config):
    return gemma.init_caches(config, num_pages=NUM_PAGES, page_size=PAGE_SIZE,
                             num_state_slots=len(SLOTS) + 1, dtype=jnp.float32,
                             kv_dtype=jnp.float32, step_tokens=CHUNK)


def decode_rows(decode, params, kv, token, position, table, slot=SLOTS[0]):
    """One decode step of one sequence beside a padding row (one compiled shape)."""
    padding_table = np.full(WIDTH, DUMMY_PAGE, np.int32)
    logits, kv = decode(params, kv, np.array([token, 0], np.int32),
                        np.array([position, 0], np.int32), np.stack([table, padding_table]),
                        np.array([slot, 0], np.int32))
    return logits[0], kv


def prefill_prompt(prefill, params, kv, tokens, table, slot=SLOTS[0], *, expected=None):
    """Chunks of 13, 17, 7 (padded to CHUNK); each chunk's last logits checked if asked."""
    start = 0
    for num in (13, 17, PROMPT_LEN - 30):
        chunk = np.zeros(CHUNK, np.int32)
        chunk[:num] = tokens[start:start + num]
        logits, kv = prefill(params, kv, chunk, np.int32(start), np.int32(num), table,
                             np.int32(slot))
        if expected is not None:
            np.testing.assert_allclose(np.asarray(logits), expected[start + num - 1],
                                       atol=TOLERANCE, rtol=0)
        start += num
    return logits, kv


def test_config_reads_the_gemma_fields(world):
    _, config, params, *_ = world
    assert config.architecture == "gemma4" and config.layer_types == tuple(LAYER_TYPES)
    assert (config.sliding_window, config.global_head_dim, config.global_num_kv_heads) == (
        WINDOW, 32, 1)
    assert config.attention_k_eq_v and config.num_kv_shared_layers == 2
    assert (config.rope_theta, config.global_rope_theta) == (100.0, 1000.0)
    assert config.partial_rotary_factor == 0.25 and config.final_logit_softcapping == 30.0
    assert config.cache_layers() == [0, 1, 2, 3]  # layers 4 and 5 read layers 3 and 2
    assert "wv" not in params["layers"][2] and "wk" not in params["layers"][5]
    assert params["layers"][5]["w_gate"].shape == (48, 128)  # double-wide
    caches = empty_kv(config)
    assert caches[2][0].shape == (NUM_PAGES, 1, PAGE_SIZE, 32)  # full: paged
    assert config.ring_layers() == [0, 1, 3]
    ring = config.ring_pages(PAGE_SIZE, CHUNK)
    assert ring == 6  # (8 + 17 - 1) / 4
    assert caches[0]["k"].shape == (len(SLOTS) + 1, ring, 2, PAGE_SIZE, 16)  # sliding: rings


def test_sliding_layer_memory_does_not_grow_with_the_pool_or_context(world):
    _, config, *_ = world
    sizes = dict(page_size=PAGE_SIZE, num_state_slots=3, dtype=jnp.float32,
                 kv_dtype=jnp.float32, step_tokens=CHUNK)
    small = gemma.cache_shapes(config, num_pages=NUM_PAGES, **sizes)
    large = gemma.cache_shapes(config, num_pages=64 * NUM_PAGES, **sizes)
    for i, layer in enumerate(config.cache_layers()):
        if layer in config.ring_layers():
            assert small[i] == large[i]
        else:
            assert large[i][0].shape[0] == 64 * NUM_PAGES
    with pytest.raises(ValueError, match="state slots"):
        gemma.cache_shapes(config, num_pages=NUM_PAGES, **(sizes | {"num_state_slots": 0}))


def test_chunked_prefill_then_decode_matches_transformers(world):
    _, config, params, tokens, expected, tables, steps = world
    _, kv = prefill_prompt(steps["prefill"], params, empty_kv(config), tokens[0], tables[0],
                           expected=expected[0])
    for position in range(PROMPT_LEN, PROMPT_LEN + NUM_DECODE):
        logits, kv = decode_rows(steps["decode"], params, kv, tokens[0, position], position,
                                 tables[0])
        np.testing.assert_allclose(np.asarray(logits), expected[0][position],
                                   atol=TOLERANCE, rtol=0)


def test_mixed_ragged_step_matches_transformers(world):
    _, config, params, tokens, expected, tables, steps = world
    _, kv = prefill_prompt(steps["prefill"], params, empty_kv(config), tokens[1], tables[1],
                           SLOTS[1])
    # Sequence 0's first 13 tokens as the chunk, sequence 1's token 37 as a decode row.
    chunk = np.zeros(CHUNK, np.int32)
    chunk[:13] = tokens[0, :13]
    batch = RaggedBatch(
        chunk_tokens=jnp.asarray(chunk), chunk_start=jnp.int32(0), chunk_len=jnp.int32(13),
        chunk_table=jnp.asarray(tables[0]),
        row_tokens=jnp.asarray([tokens[1, PROMPT_LEN], 0], jnp.int32),
        row_src=jnp.full(2, FROM_HOST, jnp.int32),
        row_positions=jnp.asarray([PROMPT_LEN, 0], jnp.int32),
        row_tables=jnp.asarray(np.stack([tables[1], np.full(WIDTH, DUMMY_PAGE, np.int32)])),
        chunk_state_slot=jnp.int32(SLOTS[0]), row_state_slots=jnp.asarray([SLOTS[1], 0],
                                                                           jnp.int32))
    logits, _ = steps["ragged"](params, kv, batch, None)
    np.testing.assert_allclose(np.asarray(logits[0]), expected[0][12], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(np.asarray(logits[1]), expected[1][PROMPT_LEN],
                               atol=TOLERANCE, rtol=0)


def test_greedy_decoding_equals_transformers_generate(world):
    model, config, params, tokens, _, tables, steps = world
    logits, kv = prefill_prompt(steps["prefill"], params, empty_kv(config), tokens[0],
                                tables[0])
    ours = [int(np.argmax(logits))]
    for position in range(PROMPT_LEN, PROMPT_LEN + NUM_DECODE - 1):
        logits, kv = decode_rows(steps["decode"], params, kv, ours[-1], position, tables[0])
        ours.append(int(np.argmax(logits)))
    with torch.no_grad():
        theirs = model.generate(torch.tensor([list(tokens[0, :PROMPT_LEN])]), do_sample=False,
                                max_new_tokens=NUM_DECODE, pad_token_id=0)[0, PROMPT_LEN:]
    assert ours == theirs.tolist()
