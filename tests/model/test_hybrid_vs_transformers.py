"""The hybrid families (qwen3_5, qwen3_5_moe, qwen3_next) against transformers in f32.

Tiny random models (tests/model/hf_hybrid_reference.py) with every norm weight, A_log and
dt_bias randomised. Each logit row must match the HF full-sequence forward within 1e-4:
  - one prefill chunk of a 70-token prompt (padded to 72; two 64-token DeltaNet blocks);
  - a prompt in chunks at odd offsets (13, 30; a padded last chunk), the Gated DeltaNet state
    and the KV carried across them, then 16 decode steps beside padding rows on slot 0;
  - three sequences of different lengths on their own pages and state slots: a mixed ragged
    step (one sequence's chunk plus the others' decode rows), then decode batches whose rows
    sit at different positions, with padding rows between them;
  - the GPU's chunked delta rule (kernels/gated_delta/wy.py, forced here) on the 70-token
    prompt in two chunks split at 29, the state carried (qwen3_5 only: the rule is shared).
Every sequence gets shuffled pages and a state slot other than DUMMY_STATE_SLOT.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hf_hybrid_reference import (ARCHITECTURES, load_params, model_config_from_hf,
                                 reference_logits, tiny_hybrid_model)
from ninfer_jax.kernels import gated_delta
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE
from ninfer_jax.model import hybrid, llama, steps
from ninfer_jax.model.ragged_batch import DUMMY_STATE_SLOT, FROM_HOST, RaggedBatch

PAGE_SIZE = 4
WIDTH = 20  # pages per table: 80 positions
NUM_PAGES = 1 + 3 * WIDTH
NUM_STATE_SLOTS = 5
CHUNK = 17  # the chunk bucket: chunks of 13 and 17 tokens, and a padded 7
PROMPT_LEN = 37
NUM_DECODE = 16
LONG_PROMPT = 70  # one chunk, two Gated DeltaNet blocks of 64 inside it
NUM_ROWS = 4
TOLERANCE = 1e-4


@pytest.fixture(autouse=True)
def exact_f32_matmuls():
    with jax.default_matmul_precision("highest"):
        yield


class World:
    """One tiny model, three sequences with their pages and transformers' logits, and the
    jitted steps (compiled once per shape for the whole module)."""

    def __init__(self, architecture):
        model = tiny_hybrid_model(architecture)
        self.config = model_config_from_hf(model.config)
        self.params = jax.tree_util.tree_map(jnp.asarray, load_params(model, self.config))
        rng = np.random.default_rng(1)
        self.tokens = rng.integers(0, self.config.vocab_size, (3, LONG_PROMPT))
        self.expected = [reference_logits(model, seq) for seq in self.tokens]
        pages = rng.permutation(np.arange(1, NUM_PAGES)).astype(np.int32)
        self.tables = pages.reshape(3, WIDTH)
        static = dict(config=self.config, page_size=PAGE_SIZE)
        self.ragged = jax.jit(functools.partial(hybrid.ragged, **static))
        self.prefill = jax.jit(functools.partial(hybrid.prefill, **static))
        self.decode = jax.jit(functools.partial(hybrid.decode, **static))

    def empty_caches(self):
        return hybrid.init_caches(self.config, num_pages=NUM_PAGES, page_size=PAGE_SIZE,
                                  num_state_slots=NUM_STATE_SLOTS, dtype=jnp.float32,
                                  kv_dtype=jnp.float32)

    def batch(self, chunk=None, rows=()):
        """A RaggedBatch: chunk = (sequence, start, length, slot) padded to CHUNK tokens (or
        None: C = 0); rows = (sequence, position, slot), or None for a padding row, padded to
        NUM_ROWS rows (so every chunk step has one compiled shape, C = CHUNK and B = NUM_ROWS,
        as the runner pads its steps)."""
        C = CHUNK if chunk else 0
        chunk_tokens = np.zeros(C, np.int32)
        chunk_start, chunk_len, chunk_table, chunk_slot = 0, 0, np.zeros(WIDTH), 0
        if chunk:
            seq, chunk_start, chunk_len, chunk_slot = chunk
            chunk_tokens[:chunk_len] = self.tokens[seq, chunk_start:chunk_start + chunk_len]
            chunk_table = self.tables[seq]
        rows = list(rows) + [None] * (NUM_ROWS - len(rows))
        row_tokens, positions, tables, slots = [], [], [], []
        for row in rows:
            seq, position, slot = row if row else (None, 0, DUMMY_STATE_SLOT)
            row_tokens.append(self.tokens[seq, position] if row else 0)
            positions.append(position)
            tables.append(self.tables[seq] if row else np.full(WIDTH, DUMMY_PAGE))
            slots.append(slot)
        ints = functools.partial(jnp.asarray, dtype=jnp.int32)
        return RaggedBatch(ints(chunk_tokens), ints(chunk_start), ints(chunk_len),
                           ints(chunk_table), ints(row_tokens), ints([FROM_HOST] * len(rows)),
                           ints(positions), ints(np.reshape(tables, (len(rows), WIDTH))),
                           chunk_state_slot=ints(chunk_slot), row_state_slots=ints(slots))

    def check(self, logits, seq, position):
        np.testing.assert_allclose(np.asarray(logits), self.expected[seq][position],
                                   atol=TOLERANCE, rtol=0)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def world(request):
    return World(request.param)


def test_params_follow_the_config_contract(world):
    shapes = {"embed": world.params["embed"].shape,
              "final_norm": world.params["final_norm"].shape}
    if "lm_head" in world.params:
        shapes["lm_head"] = world.params["lm_head"].shape
    for i, layer in enumerate(world.params["layers"]):
        shapes.update({f"layers.{i}.{name}": leaf.shape for name, leaf in layer.items()})
    assert shapes == world.config.expected_shapes()
    assert steps.FAMILIES[world.config.architecture] is hybrid


def test_one_chunk_prefill_matches_transformers(world):
    tokens = np.zeros(72, np.int32)
    tokens[:LONG_PROMPT] = world.tokens[0, :LONG_PROMPT]
    logits, _ = world.prefill(world.params, world.empty_caches(), tokens, np.int32(0),
                              np.int32(LONG_PROMPT), world.tables[0], np.int32(3))
    world.check(logits, 0, LONG_PROMPT - 1)


def test_the_chunked_wy_path_matches_transformers(world, monkeypatch):
    if world.config.architecture != "qwen3_5":
        pytest.skip("the delta rule is the same in every family; one is enough")
    monkeypatch.setattr(gated_delta, "prefill_path", lambda: "wy")
    prefill = jax.jit(functools.partial(hybrid.prefill, config=world.config,
                                        page_size=PAGE_SIZE))  # traced with the path forced
    kv, slot = world.empty_caches(), 3
    for start, end in ((0, 29), (29, LONG_PROMPT)):
        tokens = np.zeros(72, np.int32)
        tokens[:end - start] = world.tokens[0, start:end]
        logits, kv = prefill(world.params, kv, tokens, np.int32(start), np.int32(end - start),
                             world.tables[0], np.int32(slot))
        world.check(logits, 0, end - 1)


def test_chunks_at_odd_offsets_then_decode_match_transformers(world):
    kv, slot = world.empty_caches(), 2
    for start, end in ((0, 13), (13, 30), (30, PROMPT_LEN)):
        logits, kv = world.ragged(world.params, kv,
                                  world.batch(chunk=(1, start, end - start, slot)), None)
        world.check(logits[0], 1, end - 1)
    for position in range(PROMPT_LEN, PROMPT_LEN + NUM_DECODE):
        tokens = np.zeros(NUM_ROWS, np.int32)
        tokens[1] = world.tokens[1, position]
        positions = np.zeros(NUM_ROWS, np.int32)
        positions[1] = position
        tables = np.full((NUM_ROWS, WIDTH), DUMMY_PAGE, np.int32)
        tables[1] = world.tables[1]
        slots = np.array([DUMMY_STATE_SLOT, slot, DUMMY_STATE_SLOT, DUMMY_STATE_SLOT], np.int32)
        logits, kv = world.decode(world.params, kv, tokens, positions, tables, slots)
        world.check(logits[1], 1, position)


def test_mixed_step_and_decode_rows_of_different_lengths_match_transformers(world):
    """Sequence 0 (prompt 9, slot 1) and 1 (prompt 22, slot 4) decode while sequence 2
    (slot 3, reused) prefills; then all three decode together at different positions."""
    kv = world.empty_caches()
    # Slot 3 first holds another sequence's state: a chunk at position 0 must not read it.
    # Sequence 0's 2-token chunk keeps part of its conv state from the chunk before.
    for chunk in ((1, 0, 17, 3), (0, 0, 7, 1), (0, 7, 2, 1), (1, 0, 17, 4), (1, 17, 5, 4),
                  (2, 0, 17, 3)):
        _, kv = world.ragged(world.params, kv, world.batch(chunk=chunk), None)
    slots = {0: 1, 1: 4, 2: 3}
    mixed = world.batch(chunk=(2, 17, 12, 3), rows=[(1, 22, 4), None, (0, 9, 1)])
    logits, kv = world.ragged(world.params, kv, mixed, None)
    world.check(logits[0], 2, 28)
    world.check(logits[1], 1, 22)
    world.check(logits[3], 0, 9)
    lengths = {0: 10, 1: 23, 2: 29}
    for _ in range(3):
        order = [2, None, 0, 1]
        batch = world.batch(rows=[(s, lengths[s], slots[s]) if s is not None else None
                                  for s in order])
        logits, kv = world.decode(world.params, kv, batch.row_tokens, batch.row_positions,
                                  batch.row_tables, batch.row_state_slots)
        for i, seq in enumerate(order):
            if seq is not None:
                world.check(logits[i], seq, lengths[seq])
                lengths[seq] += 1


@pytest.mark.parametrize("family", [hybrid, llama])
def test_cache_shapes_and_dtypes(family, world):
    config = world.config if family is hybrid else llama_config()
    specs = family.cache_shapes(config, num_pages=7, page_size=4, num_state_slots=3,
                                dtype=jnp.bfloat16, kv_dtype=jnp.float16)
    caches = family.init_caches(config, num_pages=7, page_size=4, num_state_slots=3,
                                dtype=jnp.bfloat16, kv_dtype=jnp.float16)
    assert len(caches) == config.num_layers
    for i, (spec, cache) in enumerate(zip(specs, caches)):
        assert jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), cache) == \
            jax.tree_util.tree_map(lambda s: (s.shape, s.dtype), spec)
        kinds = config.layer_types or ("full_attention",) * config.num_layers
        if kinds[i] == "full_attention":
            assert cache[0].shape == (7, config.num_kv_heads, 4, config.head_dim)
            assert cache[0].dtype == jnp.float16
        else:
            K, conv_dim = config.linear_conv_kernel_dim, config.linear_conv_dim
            assert cache["conv"].shape == (3, K - 1, conv_dim)
            assert cache["conv"].dtype == jnp.bfloat16
            assert cache["recurrent"].shape == (3, config.linear_num_value_heads,
                                                config.linear_key_head_dim,
                                                config.linear_value_head_dim)
            assert cache["recurrent"].dtype == jnp.float32
        assert not any(np.any(np.asarray(leaf)) for leaf in jax.tree_util.tree_leaves(cache))


def llama_config():
    from ninfer_jax.model.config import ModelConfig
    return ModelConfig(architecture="llama", vocab_size=32, hidden_size=16, intermediate_size=24,
                       num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8)


def test_bf16_step_keeps_every_cache_shape_and_dtype(world):
    """The GPU dtypes: conv state and KV in bf16, the recurrent state in f32; a mixed step
    must hand back every cache leaf as it came (donation reuses the buffers). Traced only."""
    params = steps.cast_params(world.params, jnp.bfloat16)
    kv = hybrid.cache_shapes(world.config, num_pages=NUM_PAGES, page_size=PAGE_SIZE,
                             num_state_slots=NUM_STATE_SLOTS, dtype=jnp.bfloat16,
                             kv_dtype=jnp.bfloat16)
    batch = world.batch(chunk=(1, 0, 17, 2), rows=[(0, 9, 1)])
    logits, new_kv = jax.eval_shape(functools.partial(
        hybrid.ragged, config=world.config, page_size=PAGE_SIZE), params, kv, batch, None)
    assert jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), new_kv) == \
        jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), kv)
    assert (logits.shape, logits.dtype) == ((1 + NUM_ROWS, world.config.vocab_size),
                                            jnp.float32)
