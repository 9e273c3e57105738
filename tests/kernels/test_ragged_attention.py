"""Ragged paged attention (a prefill chunk plus independent row tokens in one call): the
reference against a dense by-hand softmax, and the GPU composition (Pallas decode in interpret
mode, the two-part prefill through XLA) against the reference, over a grid of odd chunk
lengths, chunk starts, permuted page tables, verify rows and padding rows."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_testkit import cpu_only, needs_gpu, paged_setup, relative_error
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE
from ninfer_jax.kernels.paged_attention.tuning import DecodeTuning
from ninfer_jax.kernels.ragged_attention import kernel, reference

STATIC = ("scale", "num_chunk_tokens")
reference_ragged = jax.jit(reference.ragged_paged_attention, static_argnames=STATIC)


def dense_attention(q, k, v, table, num_keys, scale):
    """softmax(q K^T * scale) V for every head of one query q [H, D] over the sequence's
    first num_keys keys, gathered position by position through `table` (float64)."""
    page_size, group = k.shape[2], q.shape[0] // k.shape[1]
    positions = np.arange(num_keys)
    pages, slots = np.asarray(table)[positions // page_size], positions % page_size
    out = np.zeros(q.shape)
    for h in range(q.shape[0]):
        keys, values = k[pages, h // group, slots], v[pages, h // group, slots]
        logits = keys @ q[h] * scale
        weights = np.exp(logits - logits.max())
        out[h] = weights @ values / weights.sum()
    return out


def ragged_case(rng, *, page_size, chunk_start, chunk_len, chunk_bucket, row_specs, heads,
                kv_heads, head_dim, dtype=jnp.float32):
    """Caches holding four sequences on shuffled pages: sequence 0 is the chunk's (real
    positions chunk_start..chunk_start+chunk_len-1, then chunk_bucket - chunk_len padding
    queries), sequences 1..3 the rows'. row_specs lists (sequence, position) per row token;
    sequence None is a padding row (all-dummy table, length 1). Returns (q, k, v, args, real):
    `real` marks the query rows whose output is specified."""
    lengths = [chunk_start + chunk_len, 23, 9, 41]
    k, v, tables, _ = paged_setup(rng, batch=4, lengths=lengths, num_kv_heads=kv_heads,
                                  head_dim=head_dim, page_size=page_size, dtype=dtype)
    tables = jnp.pad(tables, ((0, 0), (0, 2)), constant_values=DUMMY_PAGE)  # a wider bucket
    row_tables = np.full((len(row_specs), tables.shape[1]), DUMMY_PAGE, np.int32)
    row_lengths = np.ones(len(row_specs), np.int32)
    for i, (sequence, position) in enumerate(row_specs):
        if sequence is not None:
            row_tables[i], row_lengths[i] = tables[sequence], position + 1
    num_queries = chunk_bucket + len(row_specs)
    q = jnp.asarray(rng.standard_normal((num_queries, heads, head_dim)), dtype)
    args = dict(chunk_table=tables[0], chunk_start=jnp.int32(chunk_start),
                row_tables=jnp.asarray(row_tables), row_lengths=jnp.asarray(row_lengths),
                scale=head_dim ** -0.5, num_chunk_tokens=chunk_bucket)
    real = np.r_[np.arange(chunk_bucket) < chunk_len, np.ones(len(row_specs), bool)]
    return q, k, v, args, real


VERIFY_AND_PADDING = [(1, 20), (1, 21), (1, 22), (3, 40), (None, 0), (2, 8)]
# (page size, chunk start, real chunk tokens, chunk bucket, row tokens): a chunk at 0 with
# padding, a chunk mid-page after context, one starting on a block boundary with no padding,
# rows alone (C = 0), a chunk alone (B = 0). Rows hold a 3-token verify row of sequence 1, a
# single token, a padding row between real rows.
GRID = [
    (4, 0, 7, 8, VERIFY_AND_PADDING),
    (8, 13, 11, 16, VERIFY_AND_PADDING),
    (16, 64, 5, 5, [(2, 3), (None, 0)]),
    (8, 0, 0, 0, VERIFY_AND_PADDING),
    (4, 30, 3, 4, []),
]


@pytest.mark.parametrize("page_size,chunk_start,chunk_len,chunk_bucket,rows", GRID)
def test_reference_matches_dense_attention(page_size, chunk_start, chunk_len, chunk_bucket,
                                           rows):
    rng = np.random.default_rng(page_size + chunk_start + chunk_len)
    q, k, v, args, _ = ragged_case(rng, page_size=page_size, chunk_start=chunk_start,
                                   chunk_len=chunk_len, chunk_bucket=chunk_bucket,
                                   row_specs=rows, heads=6, kv_heads=2, head_dim=16)
    with jax.default_matmul_precision("float32"):  # GPUs default to TF32 for f32 matmuls
        out = np.asarray(reference_ragged(q, k, v, **args))
    assert out.shape == q.shape
    qn, kn, vn = (np.asarray(a, np.float64) for a in (q, k, v))
    scale = args["scale"]
    for t in range(chunk_len):  # chunk token t sees positions 0..chunk_start + t
        expected = dense_attention(qn[t], kn, vn, args["chunk_table"], chunk_start + t + 1, scale)
        np.testing.assert_allclose(out[t], expected, rtol=1e-5, atol=1e-5)
    for i, (sequence, position) in enumerate(rows):
        row = chunk_bucket + i
        if sequence is None:  # a padding row reads only the dummy page: finite, unused
            assert np.all(np.isfinite(out[row]))
            continue
        expected = dense_attention(qn[row], kn, vn, args["row_tables"][i], position + 1, scale)
        np.testing.assert_allclose(out[row], expected, rtol=1e-5, atol=1e-5)


def test_reference_refuses_a_chunk_longer_than_the_queries():
    q = jnp.zeros((3, 2, 8))
    k = jnp.zeros((4, 1, 4, 8))
    with pytest.raises(ValueError, match="num_chunk_tokens"):
        reference.ragged_paged_attention(
            q, k, k, chunk_table=jnp.zeros(2, jnp.int32), chunk_start=0,
            row_tables=jnp.zeros((0, 2), jnp.int32), row_lengths=jnp.zeros(0, jnp.int32),
            scale=1.0, num_chunk_tokens=4)


@cpu_only
@pytest.mark.parametrize("page_size,chunk_start,chunk_len,chunk_bucket,rows", GRID)
def test_kernel_composition_in_interpret_mode_matches_reference(page_size, chunk_start,
                                                                chunk_len, chunk_bucket, rows):
    rng = np.random.default_rng(7 * page_size + chunk_len)
    q, k, v, args, real = ragged_case(rng, page_size=page_size, chunk_start=chunk_start,
                                      chunk_len=chunk_len, chunk_bucket=chunk_bucket,
                                      row_specs=rows, heads=8, kv_heads=2, head_dim=64)
    width = args["row_tables"].shape[1]
    # Blocks of one page and splits of two so the decode loop, masking and merge all run.
    tuning = DecodeTuning(pages_per_block=1, pages_per_split=2, num_splits=-(-width // 2))
    run = jax.jit(functools.partial(kernel.ragged_paged_attention, interpret=True,
                                    prefill_implementation="xla", decode_tuning=tuning),
                  static_argnames=STATIC)
    with jax.default_matmul_precision("float32"):
        out = run(q, k, v, **args)
        ref = reference_ragged(q, k, v, **args)
    assert relative_error(np.asarray(out)[real], np.asarray(ref)[real]) < 1e-5


@needs_gpu
@pytest.mark.parametrize("page_size,chunk_start,chunk_len,chunk_bucket,rows", GRID)
def test_kernel_composition_on_gpu_matches_reference(page_size, chunk_start, chunk_len,
                                                     chunk_bucket, rows):
    rng = np.random.default_rng(page_size + chunk_bucket)
    q, k, v, args, real = ragged_case(rng, page_size=page_size, chunk_start=chunk_start,
                                      chunk_len=chunk_len, chunk_bucket=chunk_bucket,
                                      row_specs=rows, heads=32, kv_heads=8, head_dim=128,
                                      dtype=jnp.bfloat16)
    out = jax.jit(kernel.ragged_paged_attention, static_argnames=STATIC)(q, k, v, **args)
    ref = reference_ragged(q, k, v, **args)
    assert relative_error(np.asarray(out)[real], np.asarray(ref)[real]) < 2e-2
