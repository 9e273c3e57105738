"""Paged attention: reference vs a by-hand oracle, the Pallas decode kernel and the two-part
prefill vs the reference over a parameter grid (interpret mode on CPU, native on a GPU)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.kernels import dispatch
from ninfer_jax.kernels.paged_attention import kernel, prefill, reference
from ninfer_jax.kernels.paged_attention.tuning import DecodeTuning, decode_tuning
from kernel_testkit import cpu_only, lowers_for_cuda, needs_gpu, paged_setup, relative_error

reference_decode = jax.jit(reference.paged_decode_attention, static_argnames="scale")
reference_prefill = jax.jit(reference.paged_prefill_attention, static_argnames="scale")
two_part_xla = jax.jit(functools.partial(prefill.paged_prefill_attention, implementation="xla"),
                       static_argnames="scale")


def naive_attention(q, keys, values, scale):
    """softmax(q k^T * scale) v for one query head: q [D], keys/values [L, D] (float64)."""
    logits = keys @ q * scale
    weights = np.exp(logits - logits.max())
    return weights @ values / weights.sum()


def test_reference_decode_matches_a_by_hand_softmax_over_each_rows_pages():
    rng = np.random.default_rng(1)
    k, v, table, lengths = paged_setup(rng, batch=2, lengths=[5, 19], num_kv_heads=2,
                                       head_dim=8, page_size=4)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    with jax.default_matmul_precision("float32"):  # GPUs default to TF32 for f32 matmuls
        out = np.asarray(reference.paged_decode_attention(jnp.asarray(q), k, v, table, lengths,
                                                          scale=0.3))
    kn, vn = np.asarray(k, np.float64), np.asarray(v, np.float64)
    for b in range(2):
        n = int(lengths[b])
        pages = np.asarray(table[b])[np.arange(n) // 4]
        for h in range(4):
            kv_head = h // 2
            keys = kn[pages, kv_head, np.arange(n) % 4]
            values = vn[pages, kv_head, np.arange(n) % 4]
            np.testing.assert_allclose(out[b, h], naive_attention(q[b, h], keys, values, 0.3),
                                       rtol=1e-5, atol=1e-5)


def by_hand_decode(q, k, v, table, lengths, scale):
    """naive_attention for every row and head of a decode batch (float64 numpy)."""
    q, kn, vn = np.asarray(q, np.float64), np.asarray(k, np.float64), np.asarray(v, np.float64)
    table, page_size = np.asarray(table), kn.shape[2]
    group = q.shape[1] // kn.shape[1]
    out = np.zeros(q.shape)
    for b, n in enumerate(np.asarray(lengths)):
        pages, slots = table[b][np.arange(n) // page_size], np.arange(n) % page_size
        for h in range(q.shape[1]):
            out[b, h] = naive_attention(q[b, h], kn[pages, h // group, slots],
                                        vn[pages, h // group, slots], scale)
    return out


# (page size, lengths): decode blocks of 16, 4 and 1 pages; rows several blocks apart; a row
# of one token; a width that is not a whole number of blocks.
BLOCK_GRID = [(4, [70, 3, 1]), (16, [150, 17, 64, 65]), (64, [129, 5])]


@pytest.mark.parametrize("page_size,lengths", BLOCK_GRID)
def test_reference_decode_over_several_blocks_matches_by_hand(page_size, lengths):
    rng = np.random.default_rng(page_size)
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths, num_kv_heads=2,
                                    head_dim=16, page_size=page_size)
    # Extra DUMMY_PAGE columns, as the runner pads a table to its width bucket.
    table = jnp.pad(table, ((0, 0), (0, 3)), constant_values=reference.DUMMY_PAGE)
    q = jnp.asarray(rng.standard_normal((len(lengths), 6, 16)), jnp.float32)
    with jax.default_matmul_precision("float32"):
        out = reference_decode(q, k, v, table, lens, scale=0.25)
    np.testing.assert_allclose(np.asarray(out), by_hand_decode(q, k, v, table, lens, 0.25),
                               rtol=1e-5, atol=1e-5)


def test_reference_decode_never_reads_blocks_past_the_longest_row():
    """Table columns past the longest row's last block point at a NaN page: not read, so the
    output is finite and the same as with a short table."""
    rng = np.random.default_rng(7)
    page_size = 16  # blocks of 4 pages
    k, v, table, lens = paged_setup(rng, batch=2, lengths=[50, 20], num_kv_heads=1,
                                    head_dim=8, page_size=page_size)
    owned = set(np.asarray(table).ravel().tolist()) | {reference.DUMMY_PAGE}
    poison = next(page for page in range(k.shape[0]) if page not in owned)
    k, v = k.at[poison].set(jnp.nan), v.at[poison].set(jnp.nan)
    clean = jnp.pad(table, ((0, 0), (0, 4 - table.shape[1])), constant_values=reference.DUMMY_PAGE)
    poisoned = jnp.pad(clean, ((0, 0), (0, 12)), constant_values=poison)
    q = jnp.asarray(rng.standard_normal((2, 2, 8)), jnp.float32)
    with jax.default_matmul_precision("float32"):
        short = reference_decode(q, k, v, clean, lens, scale=0.3)
        wide = reference_decode(q, k, v, poisoned, lens, scale=0.3)
    assert np.all(np.isfinite(np.asarray(wide)))
    np.testing.assert_allclose(np.asarray(wide), np.asarray(short), rtol=1e-6, atol=1e-6)


def by_hand_prefill(q, k, v, table, start, scale):
    """naive_attention for every chunk row (position start + t sees keys 0..start + t)."""
    q, kn, vn = np.asarray(q, np.float64), np.asarray(k, np.float64), np.asarray(v, np.float64)
    table, page_size = np.asarray(table), kn.shape[2]
    group = q.shape[1] // kn.shape[1]
    out = np.zeros(q.shape)
    for t in range(q.shape[0]):
        n = start + t + 1
        pages, slots = table[np.arange(n) // page_size], np.arange(n) % page_size
        for h in range(q.shape[1]):
            out[t, h] = naive_attention(q[t, h], kn[pages, h // group, slots],
                                        vn[pages, h // group, slots], scale)
    return out


# (page size, start, chunk): blocks of 16, 4 and 1 pages; chunks at 0, mid-page, several
# blocks in, and one crossing a block boundary.
PREFILL_BLOCK_GRID = [(4, 0, 70), (16, 37, 100), (16, 128, 9), (64, 60, 10)]


@pytest.mark.parametrize("page_size,start,chunk", PREFILL_BLOCK_GRID)
def test_reference_prefill_over_several_blocks_matches_by_hand(page_size, start, chunk):
    rng = np.random.default_rng(start + chunk)
    k, v, table, _ = paged_setup(rng, batch=1, lengths=[start + chunk], num_kv_heads=2,
                                 head_dim=16, page_size=page_size)
    table = jnp.pad(table[0], (0, 3), constant_values=reference.DUMMY_PAGE)
    q = jnp.asarray(rng.standard_normal((chunk, 6, 16)), jnp.float32)
    with jax.default_matmul_precision("float32"):
        out = reference_prefill(q, k, v, table, jnp.int32(start), scale=0.25)
    np.testing.assert_allclose(np.asarray(out), by_hand_prefill(q, k, v, table, start, 0.25),
                               rtol=1e-5, atol=1e-5)


def test_reference_prefill_padding_rows_past_the_table_leave_real_rows_exact():
    """A chunk bucket longer than the real chunk: the table covers only the real positions
    (its width is not a whole number of blocks) and the real rows stay exact."""
    rng = np.random.default_rng(3)
    start, real, bucket = 20, 5, 64  # positions 20..24 real, 25..83 padding
    k, v, table, _ = paged_setup(rng, batch=1, lengths=[start + real], num_kv_heads=1,
                                 head_dim=8, page_size=4)  # 7 pages, blocks of 16
    q = jnp.asarray(rng.standard_normal((bucket, 2, 8)), jnp.float32)
    with jax.default_matmul_precision("float32"):
        out = reference_prefill(q, k, v, table[0], jnp.int32(start), scale=0.5)
    expected = by_hand_prefill(q[:real], k, v, table[0], start, 0.5)
    np.testing.assert_allclose(np.asarray(out)[:real], expected, rtol=1e-5, atol=1e-5)


def test_reference_prefill_never_reads_blocks_past_the_chunk():
    rng = np.random.default_rng(8)
    k, v, table, _ = paged_setup(rng, batch=1, lengths=[40], num_kv_heads=1, head_dim=8,
                                 page_size=16)  # 3 pages: one block of 4
    owned = set(np.asarray(table).ravel().tolist()) | {reference.DUMMY_PAGE}
    poison = next(page for page in range(k.shape[0]) if page not in owned)
    k, v = k.at[poison].set(jnp.nan), v.at[poison].set(jnp.nan)
    clean = jnp.pad(table[0], (0, 1), constant_values=reference.DUMMY_PAGE)
    poisoned = jnp.pad(clean, (0, 8), constant_values=poison)
    q = jnp.asarray(rng.standard_normal((8, 2, 8)), jnp.float32)
    with jax.default_matmul_precision("float32"):
        short = reference_prefill(q, k, v, clean, jnp.int32(32), scale=0.3)
        wide = reference_prefill(q, k, v, poisoned, jnp.int32(32), scale=0.3)
    assert np.all(np.isfinite(np.asarray(wide)))
    np.testing.assert_allclose(np.asarray(wide), np.asarray(short), rtol=1e-6, atol=1e-6)


# (heads, kv heads, head dim, page size, lengths): GQA ratios 1/4/8, head dims 64/128/256,
# odd lengths, a one-token row, a row ending exactly on a page boundary.
DECODE_GRID = [
    (4, 4, 64, 8, [1, 13, 40]),
    (8, 2, 128, 16, [33, 7]),
    (8, 1, 64, 4, [29, 16, 3]),
    (16, 2, 256, 8, [21, 8]),
]


@cpu_only
@pytest.mark.parametrize("merge", ["vector", "loop", "xla"])
@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size,lengths", DECODE_GRID)
def test_decode_kernel_in_interpret_mode_matches_reference(heads, kv_heads, head_dim,
                                                           page_size, lengths, merge,
                                                           monkeypatch):
    # Every merge: the kernel's two forms (empty splits store nothing) and XLA's (every split
    # stores).
    monkeypatch.setattr(kernel, "MERGE_KERNEL_MIN_SPLITS", 10**6 if merge == "xla" else 1)
    monkeypatch.setenv(kernel.MERGE_VECTOR_ENV, "1" if merge == "vector" else "0")
    rng = np.random.default_rng(len(lengths) * head_dim + heads)
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths,
                                    num_kv_heads=kv_heads, head_dim=head_dim,
                                    page_size=page_size)
    q = jnp.asarray(rng.standard_normal((len(lengths), heads, head_dim)), jnp.float32)
    # Small blocks and several splits so the loop, the masking and the merge all run.
    pages_per_block = 2 if page_size < 16 else 1
    tuning = DecodeTuning(pages_per_block=pages_per_block, pages_per_split=2 * pages_per_block,
                          num_splits=-(-table.shape[1] // (2 * pages_per_block)))
    scale = head_dim ** -0.5
    run = jax.jit(functools.partial(kernel.paged_decode_attention, scale=scale, tuning=tuning,
                                    interpret=True))
    out = run(q, k, v, table, lens)
    ref = reference_decode(q, k, v, table, lens, scale=scale)
    assert relative_error(out, ref) < 1e-5


@cpu_only
@pytest.mark.parametrize("merge", ["vector", "loop", "xla"])
@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size,lengths", DECODE_GRID + [
    (8, 2, 64, 4, [0, 1, 61, 64, 5]),  # a row with no key; rows past and on every split
])
def test_decode_kernel_splits_following_the_length_match_reference(heads, kv_heads, head_dim,
                                                                   page_size, lengths, merge,
                                                                   monkeypatch):
    """DecodeTuning.follow_length: each row's blocks shared by the splits (the table far
    wider than the rows, as a server's max context), with every merge."""
    monkeypatch.setattr(kernel, "MERGE_KERNEL_MIN_SPLITS", 10**6 if merge == "xla" else 1)
    monkeypatch.setenv(kernel.MERGE_VECTOR_ENV, "1" if merge == "vector" else "0")
    rng = np.random.default_rng(len(lengths) * head_dim + heads + 1)
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths,
                                    num_kv_heads=kv_heads, head_dim=head_dim,
                                    page_size=page_size)
    table = jnp.pad(table, ((0, 0), (0, 3 * table.shape[1])))  # the dummy page beyond
    q = jnp.asarray(rng.standard_normal((len(lengths), heads, head_dim)), jnp.float32)
    tuning = decode_tuning(batch=len(lengths), num_kv_heads=kv_heads, page_size=page_size,
                           table_width=table.shape[1], block_tokens=2 * page_size,
                           target_programs=4 * len(lengths) * kv_heads, min_split_tokens=1,
                           follow_length=True)
    assert tuning.num_splits >= 3
    scale = head_dim ** -0.5
    run = jax.jit(functools.partial(kernel.paged_decode_attention, scale=scale, tuning=tuning,
                                    interpret=True))
    out = run(q, k, v, table, lens)
    ref = reference_decode(q, k, v, table, lens, scale=scale)
    keyed = np.asarray(lengths) > 0  # the reference divides by a row's empty sum (NaN)
    assert relative_error(out[keyed], ref[keyed]) < 1e-5
    assert np.all(np.asarray(out[~keyed]) == 0)  # a padding row: no key, zeros


@cpu_only
@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size,lengths", DECODE_GRID + [
    (8, 2, 64, 4, [0, 1, 61, 64, 5]),
])
@pytest.mark.parametrize("follow", [False, True])
def test_one_split_stores_the_output_directly_and_matches_reference(heads, kv_heads, head_dim,
                                                                    page_size, lengths, follow,
                                                                    monkeypatch):
    """NINFER_DECODE_DIRECT_OUTPUT: a call of one split stores its normalised rows in q's
    dtype (no partials, no merge); a row with no key gets zeros."""
    monkeypatch.setenv(kernel.DIRECT_OUTPUT_ENV, "1")
    rng = np.random.default_rng(len(lengths) * head_dim + heads + 2)
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths,
                                    num_kv_heads=kv_heads, head_dim=head_dim,
                                    page_size=page_size)
    q = jnp.asarray(rng.standard_normal((len(lengths), heads, head_dim)), jnp.float32)
    tuning = DecodeTuning(pages_per_block=1, pages_per_split=table.shape[1], num_splits=1,
                          follow_length=follow)
    scale = head_dim ** -0.5
    run = jax.jit(functools.partial(kernel.paged_decode_attention, scale=scale, tuning=tuning,
                                    interpret=True))
    merges = []
    for merge in ("_merge_call", "_vector_merge_call", "merge_splits"):
        monkeypatch.setattr(kernel, merge, lambda *a, **kw: merges.append(a))
    out = run(q, k, v, table, lens)
    assert merges == []  # no merge of any kind after it
    ref = reference_decode(q, k, v, table, lens, scale=scale)
    keyed = np.asarray(lengths) > 0
    assert out.dtype == q.dtype
    assert relative_error(out[keyed], ref[keyed]) < 1e-5
    assert np.all(np.asarray(out[~keyed]) == 0)
    monkeypatch.setenv(kernel.DIRECT_OUTPUT_ENV, "0")
    wide = DecodeTuning(pages_per_block=1, pages_per_split=1, num_splits=table.shape[1])
    with pytest.raises(ValueError, match="one split"):
        kernel._decode_call(q.reshape(len(lengths), kv_heads, -1, head_dim), k, v, table,
                            lens, scale=scale, tuning=wide, store_empty=False,
                            interpret=True, output_dtype=jnp.float32)


def test_splits_follow_the_length_for_a_few_rows_unless_overridden(monkeypatch):
    monkeypatch.delenv(kernel.FOLLOW_LENGTH_ENV, raising=False)
    assert kernel.follows_length(2, 8)  # one real row of an 8-kv-head model, padded to two
    assert kernel.follows_length(8, 2)
    assert not kernel.follows_length(8, 8) and not kernel.follows_length(64, 8)
    monkeypatch.setenv(kernel.FOLLOW_LENGTH_ENV, "1")
    assert kernel.follows_length(256, 8)
    monkeypatch.setenv(kernel.FOLLOW_LENGTH_ENV, "0")
    assert not kernel.follows_length(2, 8)


def test_splits_following_the_length_share_a_rows_blocks_evenly():
    for length in range(0, 200):
        per_split, used = (int(x) for x in kernel.split_blocks(jnp.int32(length),
                                                               block_tokens=16, num_splits=4))
        blocks = -(-length // 16)
        assert used <= 4 and per_split >= 1
        assert used * per_split >= blocks > (used - 1) * per_split or used == blocks == 0
        assert per_split == max(1, -(-blocks // 4))  # as even as whole blocks allow


@cpu_only
@pytest.mark.parametrize("form,rows", [("loop", 16), ("loop", 6), ("vector", 4),
                                       ("vector", 6), ("vector", 16)])
def test_merge_reads_only_the_splits_that_hold_a_rows_keys(form, rows):
    """Splits past a row's length are never stored by the decode kernel (nor the split slots
    past the splits, which the vector form allocates up to a power of two), so neither merge
    may read them: NaN there must not reach the output, and the result is the by-hand merge.
    Both write only the group's real query rows."""
    rng = np.random.default_rng(rows)
    splits, slots, batch, kv_heads, padded, dim, split_tokens = 3, 4, 3, 2, 16, 32, 32
    lengths = np.array([1, 40, 96], np.int32)  # 1, 2 and 3 splits hold keys
    used = -(-lengths // split_tokens)
    o = rng.standard_normal((slots, batch, kv_heads, padded, dim)).astype(np.float32)
    m = rng.standard_normal((slots, batch, kv_heads, padded)).astype(np.float32)
    l = rng.uniform(0.5, 2.0, (slots, batch, kv_heads, padded)).astype(np.float32)
    for b, n in enumerate(used):
        o[n:, b], m[n:, b], l[n:, b] = np.nan, np.nan, np.nan
    partials = (jnp.asarray(o), jnp.asarray(m), jnp.asarray(l), jnp.asarray(lengths))
    if form == "loop":
        out = kernel._merge_call(*partials, split_tokens=split_tokens, rows=rows,
                                 dtype=jnp.float32, interpret=True)
    else:
        out = kernel._vector_merge_call(*partials, split_tokens=split_tokens,
                                        num_splits=splits, rows=rows, dtype=jnp.float32,
                                        interpret=True)
    out = np.asarray(out)
    assert out.shape == (batch, kv_heads, rows, dim)
    for b, n in enumerate(used):
        weight = np.exp(m[:n, b] - m[:n, b].max(axis=0))
        want = (weight[..., None] * o[:n, b]).sum(0) / (weight * l[:n, b]).sum(0)[..., None]
        np.testing.assert_allclose(out[b], want[:, :rows], rtol=1e-5, atol=1e-6)


def test_decode_tuning_covers_the_table_and_splits_long_contexts():
    crowded = decode_tuning(batch=256, num_kv_heads=8, page_size=16, table_width=64)
    assert crowded.num_splits == 1 and crowded.pages_per_split >= 64
    long = decode_tuning(batch=8, num_kv_heads=8, page_size=16, table_width=2048)
    assert long.num_splits > 1
    assert long.num_splits * long.pages_per_split >= 2048
    assert long.pages_per_split % long.pages_per_block == 0
    # No split is left without pages.
    assert (long.num_splits - 1) * long.pages_per_split < 2048


# (heads, kv heads, head dim, page size, start, chunk): chunks at the start, mid-page,
# on a page boundary; GQA 1/4/8; head dims 64/128/256.
PREFILL_GRID = [
    (4, 4, 64, 8, 0, 13),
    (8, 2, 128, 16, 21, 11),
    (8, 1, 64, 4, 16, 16),
    (16, 2, 256, 8, 5, 30),
]


@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size,start,chunk", PREFILL_GRID)
def test_two_part_prefill_matches_reference(heads, kv_heads, head_dim, page_size, start, chunk):
    rng = np.random.default_rng(start * 7 + chunk)
    k, v, table, _ = paged_setup(rng, batch=1, lengths=[start + chunk], num_kv_heads=kv_heads,
                                 head_dim=head_dim, page_size=page_size)
    q = jnp.asarray(rng.standard_normal((chunk, heads, head_dim)), jnp.float32)
    scale = head_dim ** -0.5
    with jax.default_matmul_precision("float32"):  # GPUs default to TF32 for f32 matmuls
        out = two_part_xla(q, k, v, table[0], jnp.int32(start), scale=scale)
        ref = reference_prefill(q, k, v, table[0], jnp.int32(start), scale=scale)
    assert relative_error(out, ref) < 1e-5


def test_dispatch_prefers_kernels_on_gpu_unless_forced(monkeypatch):
    monkeypatch.setattr(dispatch.jax, "default_backend", lambda: "gpu")
    monkeypatch.delenv(dispatch.FORCE_REFERENCE_ENV, raising=False)
    assert dispatch.use_kernels()
    monkeypatch.setenv(dispatch.FORCE_REFERENCE_ENV, "1")
    assert not dispatch.use_kernels()
    monkeypatch.setenv(dispatch.FORCE_REFERENCE_ENV, "0")
    assert dispatch.use_kernels()
    monkeypatch.setattr(dispatch.jax, "default_backend", lambda: "cpu")
    assert not dispatch.use_kernels()


@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size", [(32, 8, 128, 16), (16, 2, 256, 8),
                                                                (9, 3, 64, 64)])
@pytest.mark.parametrize("merge_min_splits,vector,follow", [(1, "1", "0"), (1, "0", "0"),
                                                             (10**6, "1", "0"), (1, "1", "1"),
                                                             (1, "0", "1"), (10**6, "1", "1")])
def test_decode_kernel_lowers_for_cuda(heads, kv_heads, head_dim, page_size, merge_min_splits,
                                       vector, follow, monkeypatch):
    """The Triton lowering accepts every tile the tuning picks, with every merge and either
    split (checked without a GPU)."""
    monkeypatch.setattr(kernel, "MERGE_KERNEL_MIN_SPLITS", merge_min_splits)
    monkeypatch.setenv(kernel.MERGE_VECTOR_ENV, vector)
    monkeypatch.setenv(kernel.FOLLOW_LENGTH_ENV, follow)
    rng = np.random.default_rng(0)
    k, v, table, lens = paged_setup(rng, batch=3, lengths=[300, 5, 77], num_kv_heads=kv_heads,
                                    head_dim=head_dim, page_size=page_size, dtype=jnp.bfloat16)
    q = jnp.zeros((3, heads, head_dim), jnp.bfloat16)
    text = lowers_for_cuda(lambda *a: kernel.paged_decode_attention(*a, scale=0.1),
                           q, k, v, table, lens)
    assert "ninfer_paged_decode" in text
    assert ("ninfer_paged_decode_merge" in text) == (merge_min_splits == 1)


@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size", [(32, 8, 128, 16), (16, 2, 256, 8),
                                                                (9, 3, 64, 64)])
@pytest.mark.parametrize("follow", [False, True])
def test_direct_output_lowers_for_cuda(heads, kv_heads, head_dim, page_size, follow,
                                       monkeypatch):
    monkeypatch.setenv(kernel.DIRECT_OUTPUT_ENV, "1")
    rng = np.random.default_rng(0)
    k, v, table, lens = paged_setup(rng, batch=3, lengths=[300, 5, 77], num_kv_heads=kv_heads,
                                    head_dim=head_dim, page_size=page_size, dtype=jnp.bfloat16)
    q = jnp.zeros((3, heads, head_dim), jnp.bfloat16)
    one = decode_tuning(batch=3, num_kv_heads=kv_heads, page_size=page_size,
                        table_width=table.shape[1], target_programs=1, follow_length=follow)
    assert one.num_splits == 1
    text = lowers_for_cuda(lambda *a: kernel.paged_decode_attention(*a, scale=0.1, tuning=one),
                           q, k, v, table, lens)
    assert "ninfer_paged_decode" in text and "ninfer_paged_decode_merge" not in text


# ---------------------------------------------------------------------------- native GPU


@needs_gpu
@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size,lengths", DECODE_GRID + [
    (32, 8, 128, 16, [1, 1000, 4097, 333, 2048, 17, 64, 999]),
    (32, 8, 128, 16, [4000, 1]), (16, 2, 128, 16, [3000, 300]),  # batch-1 shapes, 21 splits
])
@pytest.mark.parametrize("vector,follow", [("1", "0"), ("0", "0"), ("1", "1"), ("0", "1")])
def test_decode_kernel_on_gpu_matches_reference(heads, kv_heads, head_dim, page_size, lengths,
                                                vector, follow, monkeypatch):
    monkeypatch.setenv(kernel.MERGE_VECTOR_ENV, vector)
    monkeypatch.setenv(kernel.FOLLOW_LENGTH_ENV, follow)
    rng = np.random.default_rng(sum(lengths))
    k, v, table, lens = paged_setup(rng, batch=len(lengths), lengths=lengths,
                                    num_kv_heads=kv_heads, head_dim=head_dim,
                                    page_size=page_size, dtype=jnp.bfloat16)
    q = jnp.asarray(rng.standard_normal((len(lengths), heads, head_dim)), jnp.bfloat16)
    scale = head_dim ** -0.5
    out = kernel.paged_decode_attention(q, k, v, table, lens, scale=scale)
    ref = reference.paged_decode_attention(q, k, v, table, lens, scale=scale)
    assert relative_error(out, ref) < 2e-2


@needs_gpu
@pytest.mark.parametrize("follow", ["0", "1"])
def test_direct_output_on_gpu_matches_reference(follow, monkeypatch):
    """256 rows of the 8B's heads: the default tuning makes one split, which stores its
    output directly with NINFER_DECODE_DIRECT_OUTPUT=1."""
    monkeypatch.setenv(kernel.DIRECT_OUTPUT_ENV, "1")
    monkeypatch.setenv(kernel.FOLLOW_LENGTH_ENV, follow)
    rng = np.random.default_rng(256)
    lengths = list(rng.integers(1, 600, 256))
    k, v, table, lens = paged_setup(rng, batch=256, lengths=lengths, num_kv_heads=8,
                                    head_dim=128, page_size=16, dtype=jnp.bfloat16)
    assert decode_tuning(batch=256, num_kv_heads=8, page_size=16,
                         table_width=table.shape[1]).num_splits == 1
    q = jnp.asarray(rng.standard_normal((256, 32, 128)), jnp.bfloat16)
    out = kernel.paged_decode_attention(q, k, v, table, lens, scale=128 ** -0.5)
    ref = reference.paged_decode_attention(q, k, v, table, lens, scale=128 ** -0.5)
    assert out.dtype == jnp.bfloat16 and relative_error(out, ref) < 2e-2


@needs_gpu
@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size,start,chunk", PREFILL_GRID + [
    (32, 8, 128, 16, 0, 1024), (32, 8, 128, 16, 700, 300)])
def test_cudnn_prefill_on_gpu_matches_reference(heads, kv_heads, head_dim, page_size, start,
                                                chunk):
    rng = np.random.default_rng(start + chunk)
    k, v, table, _ = paged_setup(rng, batch=1, lengths=[start + chunk], num_kv_heads=kv_heads,
                                 head_dim=head_dim, page_size=page_size, dtype=jnp.bfloat16)
    q = jnp.asarray(rng.standard_normal((chunk, heads, head_dim)), jnp.bfloat16)
    scale = head_dim ** -0.5
    out = prefill.paged_prefill_attention(q, k, v, table[0], jnp.int32(start), scale=scale)
    ref = reference.paged_prefill_attention(q, k, v, table[0], start, scale=scale)
    assert relative_error(out, ref) < 2e-2

