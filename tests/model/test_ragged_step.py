"""The ragged step (one prefill chunk plus row tokens in one compiled call) on tiny random
models: it matches transformers' full-sequence logits, the existing prefill_step/decode_step
token for token and cache for cache, reads fed-back tokens from prev_out, and jits with
config/page_size static and the caches donated, as the runner compiles its steps.

Four sequences live on shuffled pages of one pool: A gets a prefill chunk (positions 16..26,
padded to a bucket of 16), B and C one decode row each, D a 3-token verify row (positions
30..32); a padding row sits among the rows.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hf_reference import reference_logits, saved_tiny_model
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner_api import SampleSpec
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE, get_kv_cache_shape
from ninfer_jax.model import llama, sampling, steps
from ninfer_jax.model.steps import FROM_HOST, RaggedBatch

PAGE_SIZE = 4
WIDTH = 16  # pages per table: 64 positions
NUM_PAGES = 1 + 4 * WIDTH
MAX_ROWS = 8
SEQUENCE_LEN = 48
CHUNK_START, CHUNK_LEN, CHUNK_BUCKET = 16, 11, 16
# (sequence, position) of each row token; None is a padding row.
ROWS = [(1, 21), (2, 9), (None, 0), (3, 30), (3, 31), (3, 32)]
# Positions already in the cache per sequence before the step.
CACHED = [CHUNK_START, 21, 9, 30]
TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def exact_f32_matmuls():
    """On the GPU, XLA's default f32 matmuls round through TF32 (run 9: the mixed-step checks
    missed 1e-5 there with the same tokens); the comparisons here are of f32 arithmetic."""
    with jax.default_matmul_precision("highest"):
        yield
STATIC = dict(static_argnames=("config", "page_size"), donate_argnames=("kv",))
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=123)


class World:
    """One tiny model, four token sequences with their page tables, a pool holding each
    sequence's first CACHED positions (host copy), and transformers' logits per sequence."""

    def __init__(self, architecture, tmp_path):
        model, tiny = saved_tiny_model(architecture, tmp_path, seed=4)
        self.config = tiny.config
        self.params = jax.tree_util.tree_map(jnp.asarray, tiny.params)
        rng = np.random.default_rng(6)
        self.tokens = rng.integers(0, self.config.vocab_size, (4, SEQUENCE_LEN)).astype(np.int32)
        self.expected = [reference_logits(model, seq) for seq in self.tokens]
        pages = rng.permutation(np.arange(1, NUM_PAGES)).astype(np.int32).reshape(4, WIDTH)
        self.tables = pages
        self.prefill = jax.jit(steps.prefill_step, **STATIC)
        self.decode = jax.jit(steps.decode_step, **STATIC)
        self.ragged = jax.jit(steps.ragged_step, **STATIC)
        kv = self.empty_kv()
        # Module-scoped, so built before the autouse precision fixture is entered (run 11:
        # the cached pages came out of TF32 products and every later check missed by 1e-3).
        with jax.default_matmul_precision("highest"):
            for sequence, cached in enumerate(CACHED):
                for start in range(0, cached, CHUNK_BUCKET):
                    num = min(CHUNK_BUCKET, cached - start)
                    _, kv = self.run_prefill(kv, sequence, start, num)
        self.base_kv = jax.tree_util.tree_map(np.asarray, kv)

    def empty_kv(self):
        shape = get_kv_cache_shape(NUM_PAGES, PAGE_SIZE, self.config.num_kv_heads,
                                   self.config.head_dim)
        return [(jnp.zeros(shape), jnp.zeros(shape)) for _ in range(self.config.num_layers)]

    def kv(self):
        """A fresh device copy of the pool (the steps donate theirs)."""
        return jax.tree_util.tree_map(jnp.asarray, self.base_kv)

    def sampling(self, specs, rows):
        return sampling.host_batch(specs, rows, self.config.vocab_size)

    def run_prefill(self, kv, sequence, start, num, spec=None):
        chunk = np.zeros(CHUNK_BUCKET, np.int32)
        chunk[:num] = self.tokens[sequence, start:start + num]
        token, kv = self.prefill(self.params, kv, chunk, np.int32(start), np.int32(num),
                                 self.tables[sequence], self.sampling([spec], 1),
                                 config=self.config, page_size=PAGE_SIZE)
        return int(token[0]), kv

    def row_arrays(self, rows, tokens=None):
        """(tokens [B], positions [B], tables [B, W]) of row specs; padding rows use the
        dummy page at position 0."""
        row_tokens = np.zeros(len(rows), np.int32)
        positions = np.zeros(len(rows), np.int32)
        tables = np.full((len(rows), WIDTH), DUMMY_PAGE, np.int32)
        for i, (sequence, position) in enumerate(rows):
            if sequence is not None:
                row_tokens[i] = self.tokens[sequence, position]
                positions[i], tables[i] = position, self.tables[sequence]
        return (row_tokens if tokens is None else tokens), positions, tables

    def batch(self, *, with_chunk=True, rows=ROWS, row_src=None, row_tokens=None):
        tokens, positions, tables = self.row_arrays(rows, row_tokens)
        C = CHUNK_BUCKET if with_chunk else 0
        chunk = np.zeros(C, np.int32)
        if with_chunk:
            chunk[:CHUNK_LEN] = self.tokens[0, CHUNK_START:CHUNK_START + CHUNK_LEN]
        src = np.full(len(rows), FROM_HOST, np.int32) if row_src is None else row_src
        return RaggedBatch(chunk, np.int32(CHUNK_START), np.int32(CHUNK_LEN if C else 0),
                           self.tables[0], tokens, np.asarray(src, np.int32), positions, tables)

    def run_ragged(self, kv, batch, specs=(), prev_out=None):
        prev = jnp.zeros(1 + MAX_ROWS, jnp.int32) if prev_out is None else prev_out
        rows = 1 + batch.row_tokens.shape[0]
        out, kv = self.ragged(self.params, kv, prev, batch, self.sampling(list(specs), rows),
                              config=self.config, page_size=PAGE_SIZE)
        return np.asarray(out), kv


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def world(request, tmp_path_factory):
    return World(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def llama_world(tmp_path_factory):
    return World("llama", tmp_path_factory.mktemp("llama-only"))


def pages_of(kv):
    """Every layer's K and V without the dummy page (which padding overwrites freely)."""
    return [np.asarray(cache)[DUMMY_PAGE + 1:] for layer in kv for cache in layer]


def assert_same_pages(kv_a, kv_b):
    for a, b in zip(pages_of(kv_a), pages_of(kv_b)):
        np.testing.assert_allclose(a, b, atol=TOLERANCE, rtol=0)


def test_mixed_step_logits_match_transformers(world):
    """One step: A's chunk, rows of B and C, D's verify row, a padding row; every sampled
    row's logits equal transformers' full-sequence logits at that position."""
    forward = jax.jit(functools.partial(llama.ragged, config=world.config, page_size=PAGE_SIZE))
    logits, _ = forward(world.params, world.kv(), world.batch(), None)
    logits = np.asarray(logits)
    assert logits.shape == (1 + len(ROWS), world.config.vocab_size)
    np.testing.assert_allclose(logits[0], world.expected[0][CHUNK_START + CHUNK_LEN - 1],
                               atol=1e-4, rtol=0)
    for i, (sequence, position) in enumerate(ROWS):
        if sequence is not None:
            np.testing.assert_allclose(logits[1 + i], world.expected[sequence][position],
                                       atol=1e-4, rtol=0)


def test_mixed_step_equals_prefill_step_and_decode_steps_run_separately(world):
    """Same tokens (a seeded sampled row included), same logits, same cache pages as A's
    chunk through prefill_step, then B and C through decode_step, then D's verify tokens one
    decode_step at a time."""
    specs = [SampleSpec(SamplingParams(temperature=0.0), 0), SampleSpec(SEEDED, 5)]
    out, mixed_kv = world.run_ragged(world.kv(), world.batch(), specs)
    assert out.shape == (1 + MAX_ROWS,) and not out[1 + len(ROWS):].any()

    kv = world.kv()
    chunk_token, kv = world.run_prefill(kv, 0, CHUNK_START, CHUNK_LEN, specs[0])
    separate = {}
    for group in ([0, 1], [3], [4], [5]):  # B and C together, then D token by token
        tokens, positions, tables = world.row_arrays([ROWS[i] for i in group])
        group_specs = [specs[1 + i] if 1 + i < len(specs) else None for i in group]
        sampled, kv = world.decode(world.params, kv, tokens, positions, tables,
                                   world.sampling(group_specs, len(group)),
                                   config=world.config, page_size=PAGE_SIZE)
        separate.update(zip(group, np.asarray(sampled).tolist()))
    assert out[0] == chunk_token
    assert [out[1 + i] for i in sorted(separate)] == [separate[i] for i in sorted(separate)]
    assert_same_pages(mixed_kv, kv)

    ragged = jax.jit(functools.partial(llama.ragged, config=world.config, page_size=PAGE_SIZE))
    prefill = jax.jit(functools.partial(llama.prefill, config=world.config,
                                        page_size=PAGE_SIZE))
    decode = jax.jit(functools.partial(llama.decode, config=world.config, page_size=PAGE_SIZE))
    mixed_logits, _ = ragged(world.params, world.kv(), world.batch(), None)
    chunk = np.zeros(CHUNK_BUCKET, np.int32)
    chunk[:CHUNK_LEN] = world.tokens[0, CHUNK_START:CHUNK_START + CHUNK_LEN]
    chunk_logits, kv = prefill(world.params, world.kv(), chunk, np.int32(CHUNK_START),
                               np.int32(CHUNK_LEN), world.tables[0])
    row_logits, _ = decode(world.params, kv, *world.row_arrays(ROWS))
    np.testing.assert_allclose(mixed_logits[0], chunk_logits, atol=TOLERANCE, rtol=0)
    real = [1 + i for i, (sequence, _) in enumerate(ROWS) if sequence is not None]
    np.testing.assert_allclose(np.asarray(mixed_logits)[real],
                               np.asarray(row_logits)[np.array(real) - 1],
                               atol=TOLERANCE, rtol=0)


def test_a_chunk_alone_gives_prefill_steps_token_and_cache(llama_world):
    world = llama_world
    padding_row = [(None, 0)]
    out, ragged_kv = world.run_ragged(world.kv(), world.batch(rows=padding_row))
    token, prefill_kv = world.run_prefill(world.kv(), 0, CHUNK_START, CHUNK_LEN)
    assert out[0] == token
    assert_same_pages(ragged_kv, prefill_kv)


def test_rows_alone_give_decode_steps_tokens_and_cache(llama_world):
    world = llama_world
    out, ragged_kv = world.run_ragged(world.kv(), world.batch(with_chunk=False))
    sampled, decode_kv = world.decode(world.params, world.kv(), *world.row_arrays(ROWS),
                                      world.sampling([], len(ROWS)), config=world.config,
                                      page_size=PAGE_SIZE)
    np.testing.assert_array_equal(out[1:1 + len(ROWS)], np.asarray(sampled))
    assert_same_pages(ragged_kv, decode_kv)


def test_row_src_reads_tokens_from_prev_out(llama_world):
    """Rows naming prev_out entries decode exactly as if the host had sent those tokens."""
    world = llama_world
    host = world.batch()
    prev_out = np.arange(100, 101 + MAX_ROWS, dtype=np.int32)
    src = np.array([3, FROM_HOST, FROM_HOST, 0, FROM_HOST, 8], np.int32)
    fed = np.where(src >= 0, prev_out[np.maximum(src, 0)], host.row_tokens)
    garbage = np.full(len(ROWS), 7, np.int32)  # must be ignored where src >= 0
    garbage[src < 0] = host.row_tokens[src < 0]
    via_prev, _ = world.run_ragged(world.kv(), world.batch(row_src=src, row_tokens=garbage),
                                   prev_out=jnp.asarray(prev_out))
    via_host, _ = world.run_ragged(world.kv(), world.batch(row_tokens=fed))
    np.testing.assert_array_equal(via_prev, via_host)
    unfed, _ = world.run_ragged(world.kv(), world.batch(row_tokens=garbage))
    assert not np.array_equal(unfed, via_host)  # the fed-back tokens do change the result


def test_back_to_back_steps_feed_samples_on_device(llama_world):
    """Step 1 ends A's prompt (chunk) and decodes B; step 2 decodes A and B from step 1's
    device output without the host reading it: same tokens as sending them from the host."""
    world = llama_world
    first = world.batch(rows=[(1, 21)])
    out1, kv = world.run_ragged(world.kv(), first)
    out1_device = jnp.asarray(out1)
    a_next, b_next = CHUNK_START + CHUNK_LEN, 22
    second = RaggedBatch(np.zeros(0, np.int32), np.int32(0), np.int32(0),
                         np.full(WIDTH, DUMMY_PAGE, np.int32), np.zeros(2, np.int32),
                         np.array([0, 1], np.int32), np.array([a_next, b_next], np.int32),
                         world.tables[:2])
    via_device, _ = world.run_ragged(kv, second, prev_out=out1_device)

    _, kv = world.run_ragged(world.kv(), first)
    by_host = RaggedBatch(*[getattr(second, f) for f in ("chunk_tokens", "chunk_start",
                                                          "chunk_len", "chunk_table")],
                          out1[:2].copy(), np.full(2, FROM_HOST, np.int32),
                          second.row_positions, second.row_tables)
    via_host, _ = world.run_ragged(kv, by_host)
    np.testing.assert_array_equal(via_device, via_host)


def test_jits_with_static_config_and_donated_caches(llama_world):
    """One compile per shape (new values reuse it); the caches passed in are donated."""
    world = llama_world
    traces = []

    def traced_step(params, kv, prev_out, batch, sampling_batch, *, config, page_size):
        traces.append(batch.chunk_tokens.shape)
        return steps.ragged_step(params, kv, prev_out, batch, sampling_batch, config=config,
                                 page_size=page_size)

    ragged = jax.jit(traced_step, **STATIC)
    kv = world.kv()
    prev = jnp.zeros(1 + MAX_ROWS, jnp.int32)
    batch = world.batch()
    args = (world.sampling([], 1 + len(ROWS)),)
    out, new_kv = ragged(world.params, kv, prev, batch, *args, config=world.config,
                         page_size=PAGE_SIZE)
    assert kv[0][0].is_deleted()
    moved = RaggedBatch(batch.chunk_tokens[::-1].copy(), np.int32(4), np.int32(9),
                        batch.chunk_table, batch.row_tokens, batch.row_src,
                        batch.row_positions, batch.row_tables)
    ragged(world.params, new_kv, out, moved, *args, config=world.config, page_size=PAGE_SIZE)
    assert len(traces) == 1
    with pytest.raises(ValueError, match="max_rows"):
        ragged(world.params, world.kv(), jnp.zeros(len(ROWS), jnp.int32), batch, *args,
               config=world.config, page_size=PAGE_SIZE)
