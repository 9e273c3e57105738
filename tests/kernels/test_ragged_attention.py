"""Ragged paged attention (a prefill chunk plus independent row tokens in one call): the
reference against a dense by-hand softmax, and the GPU composition (Pallas decode in interpret
mode, the two-part prefill through XLA) against the reference, over a grid of odd chunk
lengths, chunk starts, permuted page tables, verify rows and padding rows. A segmented chunk
region (several sequences' chunks, chunk_table [G, W]) on every path: the reference against
each segment alone and a dense softmax, the two-part prefill's segment batch over plain,
8-bit and 4-bit pages, the interpret-mode composition, the CPU dispatcher's chunk-as-rows,
and a one-segment table against the 1-D one."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_testkit import ON_GPU, cpu_only, needs_gpu, paged_setup, relative_error
from ninfer_jax.kernels import dispatch, ragged_attention
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE, NVFP4, cpu, prefill
from ninfer_jax.kernels.paged_attention import reference as paged_reference
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


# ------------------------------------------------------------------- segmented chunk region


def segmented_case(rng, *, page_size, segments, per_segment, row_specs, heads, kv_heads,
                   head_dim, dtype=jnp.float32):
    """A chunk region of G = len(segments) segments of `per_segment` queries each, then rows.
    segments lists (start, real tokens) per segment, or None for a padding segment (all
    DUMMY_PAGE table, start 0); each real segment has its own sequence of start + real tokens
    (the prefix before `start` already in the cache), its queries past `real` padding. Two
    more sequences (23 and 9 tokens) serve the rows: row_specs lists (row sequence 0 or 1,
    position), or (None, 0) for a padding row. Returns (q, k, v, args, real) as ragged_case."""
    real_segments = [s for s in segments if s is not None]
    lengths = [start + real for start, real in real_segments] + [23, 9]
    k, v, tables, _ = paged_setup(rng, batch=len(lengths), lengths=lengths,
                                  num_kv_heads=kv_heads, head_dim=head_dim,
                                  page_size=page_size, dtype=dtype)
    tables = np.pad(np.asarray(tables), ((0, 0), (0, 2)), constant_values=DUMMY_PAGE)
    chunk_table = np.full((len(segments), tables.shape[1]), DUMMY_PAGE, np.int32)
    chunk_start = np.zeros(len(segments), np.int32)
    real = []
    owners = iter(range(len(real_segments)))
    for g, segment in enumerate(segments):
        start, num_real = segment if segment is not None else (0, 0)
        if segment is not None:
            chunk_table[g], chunk_start[g] = tables[next(owners)], start
        real.append(np.arange(per_segment) < num_real)
    row_tables = np.full((len(row_specs), tables.shape[1]), DUMMY_PAGE, np.int32)
    row_lengths = np.ones(len(row_specs), np.int32)
    for i, (sequence, position) in enumerate(row_specs):
        if sequence is not None:
            row_tables[i] = tables[len(real_segments) + sequence]
            row_lengths[i] = position + 1
    num_chunk_tokens = len(segments) * per_segment
    q = jnp.asarray(rng.standard_normal((num_chunk_tokens + len(row_specs), heads, head_dim)),
                    dtype)
    args = dict(chunk_table=jnp.asarray(chunk_table), chunk_start=jnp.asarray(chunk_start),
                row_tables=jnp.asarray(row_tables), row_lengths=jnp.asarray(row_lengths),
                scale=head_dim ** -0.5, num_chunk_tokens=num_chunk_tokens)
    return q, k, v, args, np.concatenate(real + [np.ones(len(row_specs), bool)])


SEGMENT_ROWS = [(0, 20), (0, 21), (None, 0), (1, 8)]
# (page size, queries per segment, segments): a first chunk at 0 with padding, a chunk after a
# 13-token prefix filling its segment, a padding segment; then a chunk after a prefix ending
# on a page boundary with one real token, a padding segment first, a full chunk at 0 and a
# one-token chunk.
SEGMENT_GRID = [
    (4, 8, [(0, 5), (13, 8), None]),
    (8, 6, [None, (16, 1), (0, 6), (21, 2)]),
]


def segment_oracle(q, k, v, args, segments, per_segment):
    """Every real segment query's dense float64 attention over its sequence's keys 0..its
    position -> {query row: [H, D]}."""
    qn, kn, vn = (np.asarray(a, np.float64) for a in (q, k, v))
    expected = {}
    for g, segment in enumerate(segments):
        if segment is None:
            continue
        start, num_real = segment
        for t in range(num_real):
            row = g * per_segment + t
            expected[row] = dense_attention(qn[row], kn, vn, args["chunk_table"][g],
                                            start + t + 1, args["scale"])
    return expected


@pytest.mark.parametrize("page_size,per_segment,segments", SEGMENT_GRID)
def test_segmented_reference_matches_each_segment_alone_and_dense(page_size, per_segment,
                                                                  segments):
    rng = np.random.default_rng(page_size * 31 + per_segment)
    q, k, v, args, real = segmented_case(rng, page_size=page_size, segments=segments,
                                         per_segment=per_segment, row_specs=SEGMENT_ROWS,
                                         heads=6, kv_heads=2, head_dim=16)
    with jax.default_matmul_precision("float32"):
        out = np.asarray(reference_ragged(q, k, v, **args))
        for g in range(len(segments)):  # each segment as today's one-chunk call
            alone = dict(args, chunk_table=args["chunk_table"][g],
                         chunk_start=args["chunk_start"][g], num_chunk_tokens=per_segment,
                         row_tables=args["row_tables"][:0], row_lengths=args["row_lengths"][:0])
            span = slice(g * per_segment, (g + 1) * per_segment)
            single = np.asarray(reference_ragged(q[span], k, v, **alone))
            keep = real[span]
            np.testing.assert_allclose(out[span][keep], single[keep], rtol=1e-6, atol=1e-6)
    assert np.all(np.isfinite(out))  # padding segment and padding queries: finite, unused
    for row, expected in segment_oracle(q, k, v, args, segments, per_segment).items():
        np.testing.assert_allclose(out[row], expected, rtol=1e-5, atol=1e-5)
    qn, kn, vn = (np.asarray(a, np.float64) for a in (q, k, v))
    for i, (sequence, position) in enumerate(SEGMENT_ROWS):
        if sequence is not None:
            row = args["num_chunk_tokens"] + i
            expected = dense_attention(qn[row], kn, vn, args["row_tables"][i], position + 1,
                                       args["scale"])
            np.testing.assert_allclose(out[row], expected, rtol=1e-5, atol=1e-5)


def test_segments_must_split_the_chunk_evenly():
    q = jnp.zeros((7, 2, 8))
    k = jnp.zeros((4, 1, 4, 8))
    with pytest.raises(ValueError, match="equal segments"):
        reference.ragged_paged_attention(
            q, k, k, chunk_table=jnp.zeros((3, 2), jnp.int32), chunk_start=jnp.zeros(3, jnp.int32),
            row_tables=jnp.zeros((0, 2), jnp.int32), row_lengths=jnp.zeros(0, jnp.int32),
            scale=1.0, num_chunk_tokens=6 + 1)


def page_format(k, v, name):
    """f32 caches as `name` pages: plain f32 or bf16, 8-bit ScaledPages (fp8, int8) or nvfp4,
    each written token by token through write_kv."""
    from test_four_bit_pages import written
    from test_fp8_pages import scaled_copy
    if name in ("float32", "bfloat16"):
        return k.astype(name), v.astype(name)
    if name == "nvfp4":
        return written((k, v), NVFP4)
    codes = {"fp8": jnp.float8_e4m3fn, "int8": jnp.int8}[name]
    return scaled_copy(k, codes), scaled_copy(v, codes)


@pytest.mark.parametrize("name", ["float32", "bfloat16", "fp8", "int8", "nvfp4"])
@pytest.mark.parametrize("page_size,per_segment,segments", SEGMENT_GRID)
def test_two_part_prefill_takes_segments_as_one_batch(page_size, per_segment, segments, name):
    """The GPU prefill's segment batch (through XLA here) against the reference run segment
    by segment over the same pages: each segment's own keys and context stay its own."""
    rng = np.random.default_rng(page_size + len(name))
    q, k, v, args, real = segmented_case(rng, page_size=page_size, segments=segments,
                                         per_segment=per_segment, row_specs=[], heads=8,
                                         kv_heads=2, head_dim=32)
    k, v = page_format(k, v, name)
    G = len(segments)
    batched = jax.jit(functools.partial(prefill.paged_prefill_attention, implementation="xla"),
                      static_argnames="scale")
    with jax.default_matmul_precision("float32"):
        out = batched(q.reshape(G, per_segment, *q.shape[1:]), k, v, args["chunk_table"],
                      args["chunk_start"], scale=args["scale"])
        want = [paged_reference.paged_prefill_attention(
            q[g * per_segment:(g + 1) * per_segment], k, v, args["chunk_table"][g],
            args["chunk_start"][g], scale=args["scale"]) for g in range(G)]
    out, want = np.asarray(out).reshape(q.shape), np.concatenate(want)
    assert relative_error(out[real], want[real]) < 1e-5
    assert np.all(np.isfinite(out))


def test_two_part_prefill_makes_two_attention_calls_for_any_number_of_segments(monkeypatch):
    """Each cuDNN call is a launch per layer: segments ride the batch axis of the two parts."""
    calls = []
    attention = jax.nn.dot_product_attention

    def counted(query, *rest, **kwargs):
        calls.append(query.shape[0])
        return attention(query, *rest, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", counted)
    rng = np.random.default_rng(0)
    q, k, v, args, _ = segmented_case(rng, page_size=4, segments=SEGMENT_GRID[0][2],
                                      per_segment=8, row_specs=[], heads=4, kv_heads=2,
                                      head_dim=16)
    prefill.paged_prefill_attention(q.reshape(3, 8, 4, 16), k, v, args["chunk_table"],
                                    args["chunk_start"], scale=0.25, implementation="xla")
    assert calls == [3, 3]


def decode_tuning_for(args):
    width = args["row_tables"].shape[1]
    return DecodeTuning(pages_per_block=1, pages_per_split=2, num_splits=-(-width // 2))


@cpu_only
@pytest.mark.parametrize("page_size,per_segment,segments", SEGMENT_GRID)
def test_kernel_composition_in_interpret_mode_runs_segments(page_size, per_segment, segments):
    rng = np.random.default_rng(5 * page_size + per_segment)
    q, k, v, args, real = segmented_case(rng, page_size=page_size, segments=segments,
                                         per_segment=per_segment, row_specs=SEGMENT_ROWS,
                                         heads=8, kv_heads=2, head_dim=64)
    run = jax.jit(functools.partial(kernel.ragged_paged_attention, interpret=True,
                                    prefill_implementation="xla",
                                    decode_tuning=decode_tuning_for(args)),
                  static_argnames=STATIC)
    with jax.default_matmul_precision("float32"):
        out = np.asarray(run(q, k, v, **args))
    for row, expected in segment_oracle(q, k, v, args, segments, per_segment).items():
        np.testing.assert_allclose(out[row], expected, rtol=1e-4, atol=1e-4)
    with jax.default_matmul_precision("float32"):
        ref = np.asarray(reference_ragged(q, k, v, **args))
    assert relative_error(out[real], ref[real]) < 1e-5


@pytest.mark.parametrize("page_size,chunk_start,chunk_len,chunk_bucket,rows",
                         [case for case in GRID if case[3] > 0])
def test_one_segment_table_equals_the_one_chunk_table(page_size, chunk_start, chunk_len,
                                                      chunk_bucket, rows):
    """chunk_table [1, W] with chunk_start [1] gives today's 1-D result on every path the
    backend runs: the reference, the dispatcher, and (CPU) the kernel composition."""
    rng = np.random.default_rng(page_size + chunk_len)
    q, k, v, args, real = ragged_case(rng, page_size=page_size, chunk_start=chunk_start,
                                      chunk_len=chunk_len, chunk_bucket=chunk_bucket,
                                      row_specs=rows, heads=8, kv_heads=2, head_dim=64)
    one = dict(args, chunk_table=args["chunk_table"][None],
               chunk_start=jnp.reshape(args["chunk_start"], (1,)))
    paths = [reference.ragged_paged_attention, ragged_attention.ragged_paged_attention]
    if not ON_GPU:
        paths.append(functools.partial(kernel.ragged_paged_attention, interpret=True,
                                       prefill_implementation="xla",
                                       decode_tuning=decode_tuning_for(args)))
    for path in paths:
        run = jax.jit(path, static_argnames=STATIC)
        with jax.default_matmul_precision("float32"):
            out, want = np.asarray(run(q, k, v, **one)), np.asarray(run(q, k, v, **args))
        np.testing.assert_array_equal(out[real], want[real])


def test_chunk_as_rows_gives_each_segment_its_table_and_lengths():
    table = jnp.array([[1, 2], [0, 0], [3, 4]], jnp.int32)
    tables, lengths = ragged_attention.chunk_as_rows(table, jnp.array([5, 0, 6], jnp.int32),
                                                     6, page_size=4)
    np.testing.assert_array_equal(tables, [[1, 2], [1, 2], [0, 0], [0, 0], [3, 4], [3, 4]])
    np.testing.assert_array_equal(lengths, [6, 7, 1, 2, 7, 8])
    tables, lengths = ragged_attention.chunk_as_rows(jnp.array([1, 2], jnp.int32),
                                                     jnp.int32(5), 4, page_size=4)
    np.testing.assert_array_equal(tables, [[1, 2]] * 4)
    np.testing.assert_array_equal(lengths, [6, 7, 8, 8])  # clipped to the table's keys


@pytest.mark.skipif(not cpu.available() or ON_GPU, reason="the CPU decode attention (C++)")
@pytest.mark.parametrize("page_size,per_segment,segments", SEGMENT_GRID)
def test_cpu_dispatch_runs_segments_as_rows(page_size, per_segment, segments):
    rng = np.random.default_rng(3 * page_size + per_segment)
    q, k, v, args, real = segmented_case(rng, page_size=page_size, segments=segments,
                                         per_segment=per_segment, row_specs=SEGMENT_ROWS,
                                         heads=6, kv_heads=2, head_dim=16)
    dispatched = jax.jit(ragged_attention.ragged_paged_attention, static_argnames=STATIC)
    assert cpu.TARGET in dispatched.lower(q, k, v, **args).as_text()
    out = np.asarray(dispatched(q, k, v, **args))
    for row, expected in segment_oracle(q, k, v, args, segments, per_segment).items():
        np.testing.assert_allclose(out[row], expected, rtol=1e-5, atol=1e-5)
    with jax.default_matmul_precision("float32"):
        ref = np.asarray(reference_ragged(q, k, v, **args))
    np.testing.assert_allclose(out[real], ref[real], rtol=2e-6, atol=2e-6)


def test_windowed_path_refuses_segments(monkeypatch):
    monkeypatch.delenv(dispatch.FORCE_REFERENCE_ENV, raising=False)
    rng = np.random.default_rng(1)
    q, k, v, args, _ = segmented_case(rng, page_size=4, segments=SEGMENT_GRID[0][2],
                                      per_segment=8, row_specs=[], heads=4, kv_heads=2,
                                      head_dim=16)
    with pytest.raises(NotImplementedError, match="segments"):
        ragged_attention.ragged_paged_attention(q, k, v, window=8, **args)


@needs_gpu
@pytest.mark.parametrize("page_size,per_segment,segments", SEGMENT_GRID + [
    (16, 256, [(0, 200), (700, 256), None, (33, 17)])])
def test_kernel_composition_on_gpu_runs_segments(page_size, per_segment, segments):
    rng = np.random.default_rng(page_size + per_segment)
    q, k, v, args, real = segmented_case(rng, page_size=page_size, segments=segments,
                                         per_segment=per_segment, row_specs=SEGMENT_ROWS,
                                         heads=32, kv_heads=8, head_dim=128,
                                         dtype=jnp.bfloat16)
    out = jax.jit(kernel.ragged_paged_attention, static_argnames=STATIC)(q, k, v, **args)
    ref = reference_ragged(q, k, v, **args)
    assert relative_error(np.asarray(out)[real], np.asarray(ref)[real]) < 2e-2
