"""Paged DECODE attention as a Pallas kernel (GPU), same signature as reference.py.

Lowering: Pallas' Triton backend. Why not Mosaic GPU: the kernel's core is a gather of whole
pages through a page table, which Triton expresses as pointer arithmetic and pipelines with
cp.async; Mosaic GPU would want one TMA copy per page plus explicit barriers, and its CPU
interpreter on JAX 0.10 cannot simulate those copies, so it could not be tested in CI. The
Triton path is tested in interpret mode on CPU and natively on the H200.

Work split (flash-decoding): one program per (row b, kv head h, context split s). A program
walks its split's pages `pages_per_block` at a time, keeping an online softmax for the G query
heads that share kv head h, and writes an unnormalised partial output plus its running max and
sum, and a merge combines the splits. The split count follows the page table's width (the
server's max context), not the rows' lengths: at 8 rows and a 4k table there are 32 splits,
of which 3 hold keys at a 384-token context, and an XLA merge over all of them moved 1.2 GB of
partials per step (0.34 ms of a 5.2 ms step, run 18). Past MERGE_KERNEL_MIN_SPLITS splits a
second Pallas kernel merges each (row, kv head) reading only the splits that hold its keys,
and empty splits store nothing; with few splits the XLA merge is cheaper than one more launch
(about 5 us per layer, run 18) and every split stores its partials. Query heads are padded
to 16 rows (the minimum Triton matmul tile) as the kernel loads them (a masked load: no XLA
pad); the padding rows are zeros, and the merge kernels store only the real rows (after the
XLA merge a slice drops them, inside its fusion).
Layout: k_cache, v_cache [P, K, S, D], 8-bit ScaledPages or 4-bit E2M1Pages / Int4Pages
(reference.py; a block of 4-bit codes is widened in registers: nibbles split and interleaved
by a join, levels by integer arithmetic, times the block's e4m3 scales); partials
o [NS, B, K, Gp, D] f32, m and l [NS, B, K, Gp] f32, where NS = number of splits and Gp the padded group size.
fp8 (e4m3) codes widen to q's dtype or, with FP8_WIDEN = "float16", to float16 with both dots
fed float16 operands; the "e4m3" choices widen nothing and feed the codes to e4m3 dots
(FP8_WIDEN says why and when).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels import dispatch
from ninfer_jax.kernels.paged_attention.reference import (DUMMY_PAGE, E2M1Pages, Int4Pages,
                                                          ScaledPages)
from ninfer_jax.kernels.paged_attention.tuning import DecodeTuning, decode_tuning
from ninfer_jax.kernels.tiling import next_power_of_2

MIN_DOT_ROWS = 16  # Triton's smallest matmul tile along M
# Query rows of one context-attention program at head dim 128 (fewer at wider heads): its
# float32 accumulator stays at 64 x 128, the size of the decode kernel's own at Gemma's
# head dim 512 (16 x 512).
MAX_CONTEXT_ROWS = 64
# Finite stand-in for -inf: masked logits and empty splits use it, so exp() of differences
# never sees inf - inf.
MASK_VALUE = -1e30
# From this many context splits on, the merge kernel replaces the XLA merge (run 18: at 4 splits
# the XLA merge was 0.19 ms a step faster at batch 1, at 32 splits 0.34 ms slower at batch 8).
MERGE_KERNEL_MIN_SPLITS = 8
# The merge moves a few KiB per program; more warps only add synchronisation.
NUM_MERGE_WARPS = 2
# Whether the merge kernel folds all of a (row, kv head)'s splits at once: each program loads
# every used split's partials of a slice of the head dim in one masked load and reduces over
# the split axis, where the loop folds one split per iteration, each iteration's loads
# waiting for the previous one's (num_stages=1). Why: at batch 1 the merge is latency, not
# bytes: run 20's 8B step spent 0.245 ms in 36 merges (6.8 us each, as long as the decode
# kernel itself) and run 57's 35B-A3B step 9.2 us per merge for 8 splits.
# On since run 64 (H100, with the prologue and add + norm kernels: the 8B step at 1 row
# 159.3 -> 166.7 tok/s, at 8 rows 1,195 -> 1,241; its native tests passed); NINFER_DECODE_
# MERGE_VECTOR ("1" / "0") overrides it while tracing.
MERGE_VECTOR = True
MERGE_VECTOR_ENV = "NINFER_DECODE_MERGE_VECTOR"
# Whether the context splits divide each row's own blocks rather than the page table's
# (DecodeTuning.follow_length). Why: the split count follows the table's width (the server's
# max context), so at 64 rows and a 4k table there are 4 splits of 1,024 tokens, of which a
# 384-token row fills one: 512 programs each walking 6 blocks one after another, and run
# 21's profile had paged decode at 2.5 TB/s there (1.49 ms of a 6.99 ms step); at one row
# with a 1k context 8 of 32 splits hold keys, 2 blocks each. Following the length, a row's
# blocks are shared evenly by the splits (3 of 4 splits of 2 blocks at 64 rows; 16 of 32 of
# one block at one row), so more programs stream at once and none walks the empty table.
# Measured (runs 65-66, H100, the 8B step at a 4k table and 384 / 1,024-token rows): one
# row (padded to two) 165.8 -> 168.5 and 166.2 -> 167.9 tok/s (the same arm twice: within
# 0.3%), 8 rows 1,233 -> 1,217, 64 rows 7,472 -> 7,383, 256 rows 17,642 -> 17,576; the
# kernel alone (kernel_bench `splits`) within its noise at every shape. So the splits
# follow the length where the grid has at most FOLLOW_LENGTH_MAX_PAIRS (row, kv head)
# pairs; NINFER_DECODE_FOLLOW_LENGTH ("1" / "0") overrides it at every shape while tracing.
FOLLOW_LENGTH_MAX_PAIRS = 16
FOLLOW_LENGTH_ENV = "NINFER_DECODE_FOLLOW_LENGTH"
# Whether a call of one split (many rows: 256 rows of the 8B at a 4k table) stores its
# output directly, normalised, in q's dtype and only the group's real rows, instead of
# float32 partials for XLA's merge. Why: run 66's 256-row profile (H100) has per layer the
# partials o [1, 256, 8, 16, 128] f32 (16.8 MB) written and read back, then two XLA fusions
# (the merge's max / exp, 1.8 us, and the slice to the real rows, 3.0 us): about 15 us of a
# 14.5 ms step's 36 layers each. Off until a GPU measures it; NINFER_DECODE_DIRECT_OUTPUT
# ("1" / "0") overrides it while tracing.
DIRECT_OUTPUT = False
DIRECT_OUTPUT_ENV = "NINFER_DECODE_DIRECT_OUTPUT"
# Partial values one vector-merge program holds (splits x query rows x head-dim slice): 16
# float32 registers per thread at 4 warps.
MERGE_VECTOR_ELEMENTS = 2048
NUM_MERGE_VECTOR_WARPS = 4
# What the decode kernel widens e4m3 (fp8) page codes to, read while tracing (so a benchmark
# can set the module's value before it jits): "bfloat16" widens them to q's dtype, as every
# other page kind (bfloat16 in the served models); "float16" widens them to float16 and feeds
# both dots float16 operands (the query, scaled per row by a power of two, and the
# probabilities), products still summed in float32. Why: Hopper turns a pair of e4m3 codes into
# float16 in one instruction (cvt.rn.f16x2.e4m3x2), and Triton reaches bfloat16 only through a
# further conversion per code, while int8 codes widen with cheap integer tricks (run 40: int8
# pages 1.44x bf16's at 32k x 8, fp8 1.24x). Default "float16" since run 40's last calls
# (kernel_bench kv4 on an H100, records tagged "widen"): 344.7 against 377.3 us at 32k x 8
# (1.34x bf16 pages instead of 1.23x) and 66.9 against 71.3 us at 4k x 1, the same error.
# The e4m3 choices widen no code: the dots multiply the key and value codes as stored
# (Hopper's e4m3 x e4m3 -> f32 MMA) by our operand (the query, the probabilities times the
# value scales) rounded to e4m3 per row after a power-of-two scale. Issue 14 (fp8 >= 1.7x
# bf16 pages at 32k x 8) needs the widening gone: "float16" still spends the kernel's time
# converting codes (1.36x). "e4m3": our operand as one e4m3 term, 4 significant bits (error
# 0.01-0.04 against the reference in interpret mode, "float16" 0.0001-0.0003); "e4m3x2": as
# two, hi + lo / E4M3_LO_SCALE, about 8 bits (error 0.0002-0.0009) for a second MMA per dot
# (the query's split is made once per program, the probabilities' once per block);
# "e4m3qk": the score dot as "e4m3x2", the values widened to float16 as "float16" does.
# Measured (run 49, H200, kernel_bench kv8, 32k x 8): none pays. bf16 pages 399.5 us,
# "float16" 323.5 (1.23x), "e4m3" 342.9, "e4m3qk" 436.1, "e4m3x2" 505.8; at 64 x 384 "e4m3"
# 56.5 against 62.3 but 25x the error. Triton's 16-row MMA tiles are likely not Hopper's
# wgmma; the widening is not the whole cost either. Kept for the A/B on other cards.
FP8_WIDEN = "float16"
FP8_WIDEN_CHOICES = ("bfloat16", "float16", "e4m3", "e4m3x2", "e4m3qk")
# Each choice's (score dot, value dot) operand over e4m3 pages: None widens the codes to q's
# dtype, "float16" to float16; "e4m3" and "e4m3x2" keep them (one or two terms of ours).
FP8_DOT_OPERANDS = {"bfloat16": (None, None), "float16": ("float16", "float16"),
                    "e4m3": ("e4m3", "e4m3"), "e4m3x2": ("e4m3x2", "e4m3x2"),
                    "e4m3qk": ("e4m3x2", "float16")}
OPERAND_DTYPE = {"float16": jnp.float16, "e4m3": jnp.float8_e4m3fn,
                 "e4m3x2": jnp.float8_e4m3fn}
# A row's largest magnitude after its power-of-two scale lands in (peak / 2, peak]. float16:
# far below its 65504, and every value within 2^-27 of it stays a normal number. e4m3: below
# its 448 even rounded up, values within 2^-14 of it normal (2^-17 subnormal).
ROW_PEAK = {"float16": 2.0 ** 14, "e4m3": 2.0 ** 8, "e4m3x2": 2.0 ** 8}
# The second e4m3 term holds the first's rounding error (at most half a step: 8 below 256)
# times this, so it stays below ROW_PEAK (e4m3fn has no infinity: overflow is NaN).
E4M3_LO_SCALE = 16.0


# How the kernel reads each cache (static): plain pages, 8-bit codes with a scale per token
# ("scaled"), or 4-bit codes two per byte with an e4m3 scale per 16 elements and one per token
# ("e2m1", "int4").
PLAIN, SCALED, E2M1, INT4 = "plain", "scaled", "e2m1", "int4"


def cache_kind(cache) -> str:
    if isinstance(cache, E2M1Pages):
        return E2M1
    if isinstance(cache, Int4Pages):
        return INT4
    return SCALED if isinstance(cache, ScaledPages) else PLAIN


def cache_leaves(cache) -> list:
    """The arrays a cache passes to the kernel: codes, then the e4m3 block scales of 4-bit
    pages; the per-token scale of scaled and 4-bit pages comes after both caches' leaves."""
    kind = cache_kind(cache)
    if kind == PLAIN:
        return [cache]
    return [cache.codes] + ([cache.block_scale] if kind in (E2M1, INT4) else [])


def _four_bit_values(codes, block_scale, kind: str, dtype):
    """codes [T, D/2] uint8 (element 2i in the low nibble), block_scale [T, D/16] e4m3 ->
    [T, D] in `dtype`: level(code) x its block's scale (the per-token scale is applied to the
    logits or probabilities). Levels by arithmetic, no table: int4 by sign extension, E2M1 as
    0.5 * mantissa below exponent 1, else (2 + mantissa) * 2^exponent / 4."""
    T, half = codes.shape
    codes = codes.astype(jnp.int32)
    nibbles = jnp.stack([codes & 15, codes >> 4], axis=-1).reshape(T, 2 * half)
    if kind == INT4:
        levels = ((nibbles ^ 8) - 8).astype(jnp.float32)
    else:
        exponent, mantissa = (nibbles >> 1) & 3, (nibbles & 1).astype(jnp.float32)
        magnitude = jnp.where(exponent == 0, 0.5 * mantissa,
                              (2.0 + mantissa) * (1 << exponent).astype(jnp.float32) * 0.25)
        levels = jnp.where(nibbles >= 8, -magnitude, magnitude)
    blocks = block_scale.shape[1]
    scales = jnp.broadcast_to(block_scale.astype(jnp.float32)[:, :, None],
                              (T, blocks, 2 * half // blocks)).reshape(T, 2 * half)
    return (levels * scales).astype(dtype)


def dot_operands(k_cache, v_cache) -> tuple:
    """(score dot's, value dot's) operand (FP8_DOT_OPERANDS) as FP8_WIDEN says for e4m3 pages;
    None (the codes widen to q's dtype) for other pages. Read while tracing."""
    if FP8_WIDEN not in FP8_WIDEN_CHOICES:
        raise ValueError(f"FP8_WIDEN={FP8_WIDEN!r}: expected one of {FP8_WIDEN_CHOICES}")
    return tuple(operand if cache_kind(cache) == SCALED
                 and cache.codes.dtype == jnp.float8_e4m3fn else None
                 for cache, operand in zip((k_cache, v_cache), FP8_DOT_OPERANDS[FP8_WIDEN]))


def _operand_rows(x, operand: str):
    """x [R, C] -> (terms, 2^e [R, 1] float32), x / 2^e = sum(terms[i] / E4M3_LO_SCALE^i) but
    for rounding. Each row is scaled by a power of two (exact) so its peak lies near
    ROW_PEAK[operand], whatever the row's magnitude (a query of 1e5 would overflow float16,
    one of 1e-6 lose its bits to subnormals, a block of probabilities far below the running
    max its bits to e4m3's); then one term in the operand's dtype or, "e4m3x2", two. An
    all-zero row stays zero."""
    x = x.astype(jnp.float32)
    peak = jnp.maximum(jnp.abs(x).max(axis=1, keepdims=True), 1e-30)
    exponent = jnp.ceil(jnp.log2(peak / ROW_PEAK[operand]))
    x = x * jnp.exp2(-exponent)
    terms = [x.astype(OPERAND_DTYPE[operand])]
    if operand == "e4m3x2":
        rest = (x - terms[0].astype(jnp.float32)) * E4M3_LO_SCALE
        terms.append(rest.astype(jnp.float8_e4m3fn))
    return terms, jnp.exp2(exponent)


def _dot_terms(terms, b, *, trans_b: bool = False):
    """sum(dot(terms[i], b) / E4M3_LO_SCALE^i) in float32."""
    out = pltriton.dot(terms[0], b, trans_b=trans_b)
    for i, term in enumerate(terms[1:], 1):
        out = out + pltriton.dot(term, b, trans_b=trans_b) * E4M3_LO_SCALE ** -i
    return out


def split_blocks(length, *, block_tokens: int, num_splits: int):
    """(blocks each split of a row covers, splits that hold keys) when the splits follow the
    row's length: its ceil(length / block_tokens) blocks shared evenly, the last split
    shorter. A row with no key has no split with keys."""
    blocks = (length + block_tokens - 1) // block_tokens
    per_split = jnp.maximum((blocks + num_splits - 1) // num_splits, 1)
    return per_split, (blocks + per_split - 1) // per_split


def used_splits(length, *, split_tokens: int, num_splits: int, follow_length: bool,
                block_tokens: int):
    """How many of a row's splits hold keys (the merges read only those)."""
    if follow_length:
        return split_blocks(length, block_tokens=block_tokens, num_splits=num_splits)[1]
    return jnp.clip((length + split_tokens - 1) // split_tokens, 0, num_splits)


def follows_length(batch: int, num_kv_heads: int) -> bool:
    """Whether a decode call of this grid splits each row's own blocks (FOLLOW_LENGTH_MAX_
    PAIRS; the environment's override first). Read while tracing."""
    return dispatch.switch(FOLLOW_LENGTH_ENV, batch * num_kv_heads <= FOLLOW_LENGTH_MAX_PAIRS)


def _decode_kernel(length_ref, table_ref, q_ref, *refs, scale: float,
                   page_size: int, pages_per_block: int, pages_per_split: int,
                   store_empty: bool, k_kind: str, v_kind: str, k_dot, v_dot,
                   dot_rows: int | None = None, num_splits: int | None = None,
                   direct: bool = False):
    """One (row, kv head, split) program. table_ref holds this split's pages only, or with
    `num_splits` (the splits follow the row's length: split_blocks) the whole table [B, W'],
    of which the program reads its row's blocks. With `direct` (one split) the program
    stores its normalised output rows instead of partials. refs: each
    cache's leaves (cache_leaves: codes, then 4-bit pages' block scales), then the key's and
    the value's per-token scale [P, K, S] when they have one, then the outputs. A key's
    per-token scale multiplies its logit column and a value's its probability, so the
    products run on the widened codes (times their block scales for 4-bit pages) and no
    fully dequantized tile is formed. k_dot / v_dot (dot_operands): how that cache's e4m3
    codes meet their dot (FP8_DOT_OPERANDS); the query's per-row power of two joins the
    logit scale. float16 values: the probabilities are divided by the block's largest
    per-token scale (so they stay in [0, 1]) and the product multiplied by it; e4m3 values:
    each row of probabilities times value scales gets its own power of two, undone on the
    product."""
    refs = list(refs)
    k_leaves = [refs.pop(0) for _ in range(1 + (k_kind in (E2M1, INT4)))]
    v_leaves = [refs.pop(0) for _ in range(1 + (v_kind in (E2M1, INT4)))]
    ks_ref = refs.pop(0) if k_kind != PLAIN else None
    vs_ref = refs.pop(0) if v_kind != PLAIN else None
    if direct:
        (out_ref,) = refs
    else:
        o_ref, m_ref, l_ref = refs
    head, split = pl.program_id(1), pl.program_id(2)
    block_tokens = pages_per_block * page_size
    length = length_ref[0]
    if num_splits is None:
        first_block = 0  # table_ref starts at the split's first page
        first_token = split * pages_per_split * page_size
        num_tokens = jnp.clip(length - first_token, 0, pages_per_split * page_size)
        num_blocks = (num_tokens + block_tokens - 1) // block_tokens
        read_pages = lambda start: table_ref[pl.ds(start, pages_per_block)]  # noqa: E731
    else:
        per_split, _ = split_blocks(length, block_tokens=block_tokens, num_splits=num_splits)
        first_block = split * per_split
        first_token = first_block * block_tokens
        total = (length + block_tokens - 1) // block_tokens
        num_blocks = jnp.clip(total - first_block, 0, per_split)
        row = pl.program_id(0)
        read_pages = lambda start: table_ref[row, pl.ds(start, pages_per_block)]  # noqa: E731
    if dot_rows is None:  # q_ref is the program's [Gp, D] block
        q = q_ref[...]
    else:  # q_ref is q [B, K, G, D] whole: its G rows, zeros up to the dot's Gp
        rows = lax.broadcasted_iota(jnp.int32, (dot_rows, q_ref.shape[3]), 0)
        q = pltriton.load(q_ref.at[pl.program_id(0), head, pl.ds(0, dot_rows), :],
                          mask=rows < q_ref.shape[2], other=0.0)
    num_rows, head_dim = q.shape
    q_terms, logit_scale = [q], scale
    if k_dot is not None:  # made once per program: the query is the same for every block
        q_terms, row_scale = _operand_rows(q, k_dot)
        logit_scale = row_scale * scale  # [Gp, 1]

    def _widened(leaves, kind, page_ids, operand):
        """A block's keys or values [block, D] in q's dtype or the operand's (codes widened,
        e4m3 ones kept; 4-bit codes times their block scales)."""
        codes = leaves[0][page_ids, head]
        codes = codes.reshape(block_tokens, codes.shape[-1])
        if kind in (E2M1, INT4):
            block_scale = leaves[1][page_ids, head]
            block_scale = block_scale.reshape(block_tokens, block_scale.shape[-1])
            return _four_bit_values(codes, block_scale, kind, q.dtype)
        return codes.astype(OPERAND_DTYPE[operand] if operand else q.dtype)

    def body(i, carry):
        acc, running_max, running_sum = carry
        page_ids = read_pages((first_block + i) * pages_per_block)
        # Pages past the row's length may hold anything; read the dummy page instead.
        page_start = first_token + (i * pages_per_block + jnp.arange(pages_per_block)) * page_size
        page_ids = jnp.where(page_start < length, page_ids, DUMMY_PAGE)
        k, v = (_widened(leaves, kind, page_ids, operand) for leaves, kind, operand in
                ((k_leaves, k_kind, k_dot), (v_leaves, v_kind, v_dot)))
        logits = _dot_terms(q_terms, k, trans_b=True) * logit_scale  # [Gp, block] f32
        if ks_ref is not None:
            logits = logits * ks_ref[page_ids, head].reshape(block_tokens)[None, :]
        token = first_token + i * block_tokens + jnp.arange(block_tokens)
        logits = jnp.where((token < length)[None, :], logits, MASK_VALUE)
        new_max = jnp.maximum(running_max, logits.max(axis=1))
        correction = jnp.exp(running_max - new_max)
        probs = jnp.exp(logits - new_max[:, None])
        running_sum = running_sum * correction + probs.sum(axis=1)
        value_scale = vs_ref[page_ids, head].reshape(block_tokens) if vs_ref is not None \
            else None
        if v_dot == "float16":
            # weights in [0, 1]: float16 neither overflows (a scale of 2^16 is a value of
            # 2.9e7) nor drops small scales' probabilities into its subnormals
            peak_scale = jnp.maximum(value_scale.max(), 1e-30)
            weights = probs * (value_scale / peak_scale)[None, :]
            update = pltriton.dot(weights.astype(jnp.float16), v) * peak_scale
        elif v_dot is not None:
            # e4m3's 2^-14 normal range is too narrow for [0, 1]: a block far below the
            # running max would lose its probabilities to subnormals, so each row's own peak
            # is brought to ROW_PEAK
            terms, row_scale = _operand_rows(probs * value_scale[None, :], v_dot)
            update = _dot_terms(terms, v) * row_scale
        else:
            weights = probs * value_scale[None, :] if value_scale is not None else probs
            update = pltriton.dot(weights.astype(v.dtype), v)
        acc = acc * correction[:, None] + update
        return acc, new_max, running_sum

    init = (jnp.zeros((num_rows, head_dim), jnp.float32),
            jnp.full((num_rows,), MASK_VALUE, jnp.float32),
            jnp.zeros((num_rows,), jnp.float32))
    acc, running_max, running_sum = lax.fori_loop(0, num_blocks, body, init)

    if direct:  # out_ref [B, K, G, D] whole: the G real rows of the Gp (masked)
        rows = lax.broadcasted_iota(jnp.int32, acc.shape, 0)
        pltriton.store(out_ref.at[pl.program_id(0), head, pl.ds(0, num_rows), :],
                       (acc / jnp.maximum(running_sum, 1e-30)[:, None]).astype(out_ref.dtype),
                       mask=rows < out_ref.shape[2])
        return

    def store():
        o_ref[...] = acc
        m_ref[...] = running_max
        l_ref[...] = running_sum

    if store_empty:  # the XLA merge reads every split
        store()
    else:  # the merge kernel reads only splits that hold keys
        pl.when(num_blocks > 0)(store)


def _merge_kernel(length_ref, o_ref, m_ref, l_ref, out_ref, *, used_of):
    """One (row, kv head) program: fold the partials of the splits that hold its keys
    (`used_of(length)`: used_splits). out_ref [B, K, G, D] whole: the group's G real rows of
    the Gp merged are stored (masked), so no slice follows."""
    row, head = pl.program_id(0), pl.program_id(1)
    used = used_of(length_ref[0])
    num_rows, head_dim = o_ref.shape[3:]

    def body(split, carry):
        acc, running_max, running_sum = carry
        part_max = m_ref[split, row, head]  # [Gp]
        new_max = jnp.maximum(running_max, part_max)
        old_weight = jnp.exp(running_max - new_max)
        part_weight = jnp.exp(part_max - new_max)
        running_sum = running_sum * old_weight + l_ref[split, row, head] * part_weight
        acc = acc * old_weight[:, None] + o_ref[split, row, head] * part_weight[:, None]
        return acc, new_max, running_sum

    init = (jnp.zeros((num_rows, head_dim), jnp.float32),
            jnp.full((num_rows,), MASK_VALUE, jnp.float32),
            jnp.zeros((num_rows,), jnp.float32))
    acc, _, running_sum = lax.fori_loop(0, used, body, init)
    rows = lax.broadcasted_iota(jnp.int32, (num_rows, head_dim), 0)
    pltriton.store(out_ref.at[row, head, pl.ds(0, num_rows), :],
                   (acc / jnp.maximum(running_sum, 1e-30)[:, None]).astype(out_ref.dtype),
                   mask=rows < out_ref.shape[2])


def supports(k_cache, v_cache) -> bool:
    """Plain pages for both caches, or quantized pages (8-bit ScaledPages, 4-bit E2M1Pages or
    Int4Pages, as --kv-dtype fp8, int8, k8v4 and nvfp4 pair them) for both."""
    return (cache_kind(k_cache) == PLAIN) == (cache_kind(v_cache) == PLAIN)


def paged_decode_attention(q, k_cache, v_cache, page_table, lengths, *, scale: float,
                           tuning: DecodeTuning | None = None, interpret: bool = False):
    """One query token per row. q [B, H, D]; page_table [B, W]; lengths [B] valid keys per row.
    Returns [B, H, D] in q's dtype (see reference.py for the contract)."""
    if not supports(k_cache, v_cache):
        raise ValueError(f"the Pallas decode kernel does not read {type(k_cache).__name__} / "
                         f"{type(v_cache).__name__} pages (use the reference)")
    B, H, D = q.shape
    _, K, S, _ = k_cache.shape  # ScaledPages has the codes' shape
    G = H // K
    W = page_table.shape[1]
    if tuning is None:
        tuning = decode_tuning(batch=B, num_kv_heads=K, page_size=S, table_width=W,
                               follow_length=follows_length(B, K))
    padded_width = tuning.num_splits * tuning.pages_per_split
    table = jnp.pad(page_table.astype(jnp.int32), ((0, 0), (0, padded_width - W)),
                    constant_values=DUMMY_PAGE)
    qg = q.reshape(B, K, G, D)  # the kernel pads the group to Gp rows as it loads it
    lengths = lengths.astype(jnp.int32)
    if tuning.num_splits == 1 and dispatch.switch(DIRECT_OUTPUT_ENV, DIRECT_OUTPUT):
        out = _decode_call(qg, k_cache, v_cache, table, lengths, scale=scale, tuning=tuning,
                           store_empty=False, interpret=interpret, output_dtype=q.dtype)
        return out.reshape(B, H, D)
    merge_kernel = tuning.num_splits >= MERGE_KERNEL_MIN_SPLITS
    vector = merge_kernel and dispatch.switch(MERGE_VECTOR_ENV, MERGE_VECTOR)
    o, m, l = _decode_call(qg, k_cache, v_cache, table, lengths, scale=scale, tuning=tuning,
                           store_empty=not merge_kernel, interpret=interpret,
                           split_slots=next_power_of_2(tuning.num_splits) if vector else None)
    splits = dict(split_tokens=tuning.pages_per_split * S, follow_length=tuning.follow_length,
                  block_tokens=tuning.pages_per_block * S)
    if vector:
        out = _vector_merge_call(o, m, l, lengths, num_splits=tuning.num_splits, rows=G,
                                 dtype=q.dtype, interpret=interpret, **splits)
    elif merge_kernel:
        out = _merge_call(o, m, l, lengths, rows=G, dtype=q.dtype, interpret=interpret,
                          **splits)
    else:
        out = merge_splits(o, m, l).astype(q.dtype)
    return out[:, :, :G, :].reshape(B, H, D)  # a merge kernel wrote the G rows: no-op


def paged_context_attention(q, k_cache, v_cache, page_table, lengths, *, scale: float,
                            tuning: DecodeTuning | None = None, interpret: bool = False):
    """T queries per row that all see the row's paged keys 0..lengths-1 (the DFlash drafter's
    block, reference.paged_block_attention's paged part). q [B, T, H, D] -> (out [B, T, H, D]
    f32, log-sum-exp [B, T, H] f32; a row with no key gets ~MASK_VALUE, so a merge weighs it
    0). The T queries join the G heads of their kv head as T * G dot rows, so a page is read
    once per row and kv head for up to MAX_CONTEXT_ROWS * 128 / D of them; more rows run as
    further programs of the same call (the decode kernel's grid over rows, the row's table
    repeated), which keeps a program's accumulator within the decode kernel's largest."""
    if not supports(k_cache, v_cache):
        raise ValueError(f"the Pallas decode kernel does not read {type(k_cache).__name__} / "
                         f"{type(v_cache).__name__} pages (use the reference)")
    B, T, H, D = q.shape
    _, K, S, _ = k_cache.shape
    G = H // K
    R = T * G
    per_program = max(MIN_DOT_ROWS, min(next_power_of_2(R), MAX_CONTEXT_ROWS * 128 // D))
    C = -(-R // per_program)  # programs per (row, kv head)
    W = page_table.shape[1]
    if tuning is None:
        tuning = decode_tuning(batch=B * C, num_kv_heads=K, page_size=S, table_width=W)
    padded_width = tuning.num_splits * tuning.pages_per_split
    table = jnp.pad(page_table.astype(jnp.int32), ((0, 0), (0, padded_width - W)),
                    constant_values=DUMMY_PAGE)
    qg = jnp.moveaxis(q.reshape(B, T, K, G, D), 1, 2).reshape(B, K, R, D)
    qg = jnp.pad(qg, ((0, 0), (0, 0), (0, C * per_program - R), (0, 0)))
    qg = jnp.moveaxis(qg.reshape(B, K, C, per_program, D), 2, 1)
    o, m, l = _decode_call(qg.reshape(B * C, K, per_program, D), k_cache, v_cache,
                           jnp.repeat(table, C, axis=0),
                           jnp.repeat(lengths.astype(jnp.int32), C), scale=scale,
                           tuning=tuning, store_empty=True, interpret=interpret)
    peak = m.max(axis=0)
    total = (jnp.exp(m - peak[None]) * l).sum(axis=0)
    out, lse = merge_splits(o, m, l), peak + jnp.log(jnp.maximum(total, 1e-30))

    def unfold(a):  # [B*C, K, per_program, ...] -> [B, T, H, ...]
        a = jnp.moveaxis(a.reshape(B, C, K, per_program, *a.shape[3:]), 1, 2)
        a = a.reshape(B, K, C * per_program, *a.shape[4:])[:, :, :R]
        return jnp.moveaxis(a.reshape(B, K, T, G, *a.shape[3:]), 2, 1).reshape(
            B, T, H, *a.shape[3:])

    return unfold(out), unfold(lse)


def merge_splits(o, m, l):
    """Combine per-split partials o [NS, ..., D], m/l [NS, ...] into the normalised output."""
    global_max = m.max(axis=0)
    weight = jnp.exp(m - global_max[None])  # empty splits: exp(-1e30 - x) = 0
    total = (weight * l).sum(axis=0)
    out = (weight[..., None] * o).sum(axis=0)
    return out / jnp.maximum(total, 1e-30)[..., None]


def _decode_call(qg, k_cache, v_cache, table, lengths, *, scale, tuning: DecodeTuning,
                 store_empty: bool, interpret: bool, split_slots: int | None = None,
                 output_dtype=None):
    """Partials o [NS', B, K, Gp, D], m, l [NS', B, K, Gp] with NS' = split_slots (at least
    the splits; the slots past them are never written) or the splits; with `output_dtype`
    (one split only) the output [B, K, G, D] in that dtype instead. qg [B, K, G, D]: G
    query rows per kv head, padded to the dot's Gp >= MIN_DOT_ROWS (a power of two) as the
    kernel loads them, where an XLA pad would be a kernel of its own per layer."""
    B, K, G, D = qg.shape
    Gp = max(MIN_DOT_ROWS, next_power_of_2(G))
    NS = split_slots or tuning.num_splits
    k_kind, v_kind = cache_kind(k_cache), cache_kind(v_cache)
    k_dot, v_dot = dot_operands(k_cache, v_cache)
    kernel = functools.partial(_decode_kernel, scale=scale, page_size=k_cache.shape[2],
                               pages_per_block=tuning.pages_per_block,
                               pages_per_split=tuning.pages_per_split,
                               store_empty=store_empty, k_kind=k_kind, v_kind=v_kind,
                               k_dot=k_dot, v_dot=v_dot, dot_rows=None if G == Gp else Gp,
                               num_splits=tuning.num_splits if tuning.follow_length else None,
                               direct=output_dtype is not None)
    whole = lambda a: pl.BlockSpec(a.shape, lambda b, h, s: (0,) * a.ndim)  # noqa: E731
    caches = cache_leaves(k_cache) + cache_leaves(v_cache) + [
        cache.scale for cache in (k_cache, v_cache) if cache_kind(cache) != PLAIN]
    if output_dtype is not None:
        if tuning.num_splits != 1:
            raise ValueError(f"a direct output needs one split, not {tuning.num_splits}")
        out = jax.ShapeDtypeStruct((B, K, G, D), output_dtype)
        out_specs, out_shape = whole(out), out
    else:
        out_specs = [
            pl.BlockSpec((None, None, None, Gp, D), lambda b, h, s: (s, b, h, 0, 0)),
            pl.BlockSpec((None, None, None, Gp), lambda b, h, s: (s, b, h, 0)),
            pl.BlockSpec((None, None, None, Gp), lambda b, h, s: (s, b, h, 0)),
        ]
        out_shape = [
            jax.ShapeDtypeStruct((NS, B, K, Gp, D), jnp.float32),
            jax.ShapeDtypeStruct((NS, B, K, Gp), jnp.float32),
            jax.ShapeDtypeStruct((NS, B, K, Gp), jnp.float32),
        ]
    return pl.pallas_call(
        kernel,
        grid=(B, K, tuning.num_splits),
        in_specs=[
            pl.BlockSpec((1,), lambda b, h, s: (b,)),
            whole(table) if tuning.follow_length
            else pl.BlockSpec((None, tuning.pages_per_split), lambda b, h, s: (b, s)),
            pl.BlockSpec((None, None, Gp, D), lambda b, h, s: (b, h, 0, 0)) if G == Gp
            else whole(qg),
            *[whole(cache) for cache in caches],
        ],
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=pltriton.CompilerParams(num_warps=tuning.num_warps,
                                                num_stages=tuning.num_stages),
        interpret=interpret,
        name="ninfer_paged_decode",
    )(lengths, table, qg, *caches)


def _merge_call(o, m, l, lengths, *, split_tokens: int, rows: int, dtype, interpret: bool,
                follow_length: bool = False, block_tokens: int = 0):
    """Partials [NS, B, K, Gp, D] -> [B, K, rows, D]: the first `rows` (<= Gp) merged rows.
    The splits hold `split_tokens` each, or follow each row's length in blocks of
    `block_tokens` (used_splits)."""
    NS, B, K, Gp, D = o.shape
    kernel = functools.partial(_merge_kernel, used_of=functools.partial(
        used_splits, split_tokens=split_tokens, num_splits=NS, follow_length=follow_length,
        block_tokens=block_tokens))
    whole = lambda a: pl.BlockSpec(a.shape, lambda b, h: (0,) * a.ndim)  # noqa: E731
    out_shape = jax.ShapeDtypeStruct((B, K, rows, D), dtype)
    return pl.pallas_call(
        kernel,
        grid=(B, K),
        in_specs=[pl.BlockSpec((1,), lambda b, h: (b,)), whole(o), whole(m), whole(l)],
        out_specs=whole(out_shape),
        out_shape=out_shape,
        compiler_params=pltriton.CompilerParams(num_warps=NUM_MERGE_WARPS, num_stages=1),
        interpret=interpret,
        name="ninfer_paged_decode_merge",
    )(lengths, o, m, l)


def _vector_merge_kernel(length_ref, o_ref, m_ref, l_ref, out_ref, *, used_of):
    """One (row, kv head, head-dim slice) program: every split that holds the row's keys
    folded at once. o_ref [NS', R, Dc], m_ref / l_ref [NS', R] (R query rows, NS' split slots;
    the slots from `used_of(length)` (used_splits) on were never stored and are masked out of
    every load); out_ref [B, K, G, D] whole, of which the program stores its G real rows'
    slice (masked)."""
    used = used_of(length_ref[0])
    slots, rows = m_ref.shape
    held = lax.broadcasted_iota(jnp.int32, (slots, rows), 0) < used
    part_max = pltriton.load(m_ref, mask=held, other=MASK_VALUE)
    part_sum = pltriton.load(l_ref, mask=held, other=0.0)
    peak = jnp.max(part_max, axis=0)  # [R]; a row with no key: MASK_VALUE
    weight = jnp.where(held, jnp.exp(part_max - peak[None, :]), 0.0)
    total = jnp.sum(weight * part_sum, axis=0)
    parts = pltriton.load(o_ref, mask=held[:, :, None], other=0.0)  # [NS', R, Dc]
    acc = jnp.sum(parts * weight[:, :, None], axis=0)
    width = acc.shape[1]
    columns = pl.ds(pl.multiple_of(pl.program_id(2) * width, width), width)
    real = lax.broadcasted_iota(jnp.int32, (rows, width), 0) < out_ref.shape[2]
    pltriton.store(out_ref.at[pl.program_id(0), pl.program_id(1), pl.ds(0, rows), columns],
                   (acc / jnp.maximum(total, 1e-30)[:, None]).astype(out_ref.dtype),
                   mask=real)


def _vector_merge_call(o, m, l, lengths, *, split_tokens: int, num_splits: int, rows: int,
                       dtype, interpret: bool, follow_length: bool = False,
                       block_tokens: int = 0):
    """Partials in NS' (a power of two) split slots -> [B, K, rows, D] (`rows` <= Gp: the
    real query rows of a kv head). R, the rows each program folds, is `rows` when a power of
    two (the padding rows' partials are not read), else Gp. Splits as _merge_call's."""
    slots, B, K, Gp, D = o.shape
    R = rows if rows == next_power_of_2(rows) else Gp
    Dc = min(D, max(1, MERGE_VECTOR_ELEMENTS // (slots * R)))
    kernel = functools.partial(_vector_merge_kernel, used_of=functools.partial(
        used_splits, split_tokens=split_tokens, num_splits=num_splits,
        follow_length=follow_length, block_tokens=block_tokens))
    return pl.pallas_call(
        kernel,
        grid=(B, K, D // Dc),
        in_specs=[pl.BlockSpec((1,), lambda b, h, d: (b,)),
                  pl.BlockSpec((slots, None, None, R, Dc), lambda b, h, d: (0, b, h, 0, d)),
                  pl.BlockSpec((slots, None, None, R), lambda b, h, d: (0, b, h, 0)),
                  pl.BlockSpec((slots, None, None, R), lambda b, h, d: (0, b, h, 0))],
        out_specs=pl.BlockSpec((B, K, rows, D), lambda b, h, d: (0, 0, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((B, K, rows, D), dtype),
        compiler_params=pltriton.CompilerParams(num_warps=NUM_MERGE_VECTOR_WARPS,
                                                num_stages=1),
        interpret=interpret,
        name="ninfer_paged_decode_merge",
    )(lengths, o, m, l)


def decode_bytes(batch_lengths, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Fewest bytes a decode call must read: every valid key and value once (for benchmarks)."""
    return int(sum(batch_lengths)) * num_kv_heads * head_dim * itemsize * 2

