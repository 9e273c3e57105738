"""Pure-jnp reference twin of the paged attention kernels (the CPU path and the test oracle).

Cache layout (owned by this op; the page pool asks `get_kv_cache_shape`, `cache_specs`):
    k_cache, v_cache: [P, K, S, D]  P pages, K kv heads, S tokens per page, D head dim
    or, for 8-bit pages, ScaledPages(codes [P, K, S, D] float8_e4m3fn or int8, scale [P, K, S]
    f32): each token's head vector is stored as codes * scale with scale = its absmax / the
    code's largest value (448 for e4m3, 127 for int8), so the codes span the vector's own
    range (with a unit scale, fp8 pages lost the default model's greedy text after 5 tokens);
    or, for 4-bit pages (FourBitPages: nvfp4's keys and values, k8v4's values), two 4-bit
    codes per byte [P, K, S, D/2] uint8 (element 2i in the low nibble), an e4m3 scale per 16
    elements [P, K, S, D/16] and a float32 scale per token and kv head [P, K, S] (NVFP4's
    two-level scaling, with the tensor's global scale per token since pages are written a
    token at a time). `--kv-dtype k8v4` stores int8 ScaledPages keys and Int4Pages values,
    `nvfp4` E2M1Pages keys and values.
A token at sequence position t lives in page `page_table[t // S]`, slot `t % S`.
Page DUMMY_PAGE is never owned by a sequence: padding rows write there and padded page-table
entries point there, so every index stays in bounds without a branch.
Shape letters: B batch rows, T chunk tokens, H query heads, G = H // K, W page-table width,
N pages per block.

Both entry points walk the page table in blocks of N pages with an online softmax and stop
after the block holding the last key any query may see (decode: the longest row; prefill: the
chunk's last position). Their cost therefore follows the real context lengths, not the padded
width W: on XLA CPU a single pass over a table padded to 64 pages cost up to 10x more (see
docs/benchmarks.md, "CPU serving"), and the runner can compile one width instead of several.
With a sliding `window` (Gemma's local layers) a query at position p sees keys
p - window + 1 .. p only, and the walk also starts at the first block the earliest query may
see (decode: the shortest row, so a padding row of length 1 keeps it at block 0).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

DUMMY_PAGE = 0
# 8-bit page codes and the largest value each stores (what a vector's absmax maps to).
CODE_MAX = {jnp.dtype(jnp.float8_e4m3fn): 448.0, jnp.dtype(jnp.int8): 127.0}
# 4-bit pages: elements per e4m3 block scale (NVFP4's 16) and that scale's largest value.
FOUR_BIT_BLOCK = 16
BLOCK_SCALE_MAX = 448.0
# Keys per block: big enough that the loop runs few iterations (each costs a fixed overhead on
# CPU), small enough that the last block wastes little past the last real key.
BLOCK_TOKENS = 64


class ScaledPages(NamedTuple):
    """8-bit pages with one float32 scale per (page, kv head, token); a pytree of two arrays."""
    codes: jax.Array  # [P, K, S, D] float8_e4m3fn or int8
    scale: jax.Array  # [P, K, S] float32

    @property
    def shape(self):
        return self.codes.shape


class FourBitPages(NamedTuple):
    """4-bit pages: codes two per byte, an e4m3 scale per FOUR_BIT_BLOCK elements and a
    float32 scale per (page, kv head, token). Element = level(code) * block_scale * scale.
    Subclasses say which 16 levels the codes index (a pytree's type is static)."""
    codes: jax.Array  # [P, K, S, D/2] uint8
    block_scale: jax.Array  # [P, K, S, D/16] float8_e4m3fn
    scale: jax.Array  # [P, K, S] float32

    @property
    def shape(self):
        return (*self.codes.shape[:3], 2 * self.codes.shape[3])


class E2M1Pages(FourBitPages):
    """nvfp4: each code is an E2M1 float (sign bit, then 0 0.5 1 1.5 2 3 4 6 by its 3 bits)."""
    __slots__ = ()


class Int4Pages(FourBitPages):
    """k8v4's values: each code a two's-complement int4 in -7..7."""
    __slots__ = ()


# Each 4-bit code's value, indexed by the nibble; the largest magnitude each stores.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FOUR_BIT_LEVELS = {E2M1Pages: E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES),
                   Int4Pages: tuple(range(8)) + tuple(range(-8, 0))}
FOUR_BIT_MAX = {E2M1Pages: 6.0, Int4Pages: 7.0}


@dataclasses.dataclass(frozen=True)
class KVFormat:
    """A KV page format whose keys and values are not one numpy dtype (`--kv-dtype k8v4`,
    `nvfp4`); `name` is what logs and inspect show, as a dtype's name is for the others."""
    name: str
    key: object  # int8 (ScaledPages) or a FourBitPages subclass
    value: object


K8V4 = KVFormat("k8v4", jnp.dtype(jnp.int8), Int4Pages)
NVFP4 = KVFormat("nvfp4", E2M1Pages, E2M1Pages)


def kv_format(kv_dtype):
    """A KVFormat as it is, anything else as its numpy dtype."""
    return kv_dtype if isinstance(kv_dtype, KVFormat) else jnp.dtype(kv_dtype)


def get_kv_cache_shape(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int):
    return (num_pages, num_kv_heads, page_size, head_dim)


def cache_specs(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, kv_dtype):
    """One layer's (k, v) caches as jax.ShapeDtypeStruct leaves: arrays, ScaledPages for the
    8-bit codes (fp8, int8), FourBitPages for 4-bit ones (a KVFormat's keys and values)."""
    kv_dtype = kv_format(kv_dtype)
    if isinstance(kv_dtype, KVFormat):
        return tuple(_spec(num_pages, page_size, num_kv_heads, head_dim, part)
                     for part in (kv_dtype.key, kv_dtype.value))
    spec = _spec(num_pages, page_size, num_kv_heads, head_dim, kv_dtype)
    return spec, spec


def _spec(num_pages, page_size, num_kv_heads, head_dim, stored):
    shape = get_kv_cache_shape(num_pages, page_size, num_kv_heads, head_dim)
    if isinstance(stored, type) and issubclass(stored, FourBitPages):
        if head_dim % FOUR_BIT_BLOCK:
            raise ValueError(f"4-bit KV pages need a head dim that is a multiple of "
                             f"{FOUR_BIT_BLOCK}, not {head_dim}")
        return stored(jax.ShapeDtypeStruct((*shape[:3], head_dim // 2), jnp.uint8),
                      jax.ShapeDtypeStruct((*shape[:3], head_dim // FOUR_BIT_BLOCK),
                                           jnp.float8_e4m3fn),
                      jax.ShapeDtypeStruct(shape[:3], jnp.float32))
    if jnp.dtype(stored) in CODE_MAX:
        return ScaledPages(jax.ShapeDtypeStruct(shape, stored),
                           jax.ShapeDtypeStruct(shape[:3], jnp.float32))
    return jax.ShapeDtypeStruct(shape, stored)


def cache_bytes_per_token(num_kv_heads: int, head_dim: int, kv_dtype) -> int:
    """Bytes one token takes in one layer's k and v caches together (codes and scales)."""
    leaves = jax.tree.leaves(cache_specs(1, 1, num_kv_heads, head_dim, kv_dtype))
    return sum(int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize for leaf in leaves)


def write_kv(k_cache, v_cache, k_new, v_new, slots):
    """Store k_new/v_new [N, K, D] at flat slots [N] (page * S + offset)."""
    page_size = k_cache.shape[2]
    pages, offsets = slots // page_size, slots % page_size
    return _write(k_cache, k_new, pages, offsets), _write(v_cache, v_new, pages, offsets)


def _write(cache, new, pages, offsets):
    if isinstance(cache, FourBitPages):
        stored = quantize_four_bit(type(cache), new)
        return type(cache)(*(leaf.at[pages, :, offsets].set(part)
                             for leaf, part in zip(cache, stored)))
    if not isinstance(cache, ScaledPages):
        return cache.at[pages, :, offsets, :].set(new.astype(cache.dtype))
    new = new.astype(jnp.float32)
    code_max = CODE_MAX[jnp.dtype(cache.codes.dtype)]
    scale = jnp.max(jnp.abs(new), axis=-1) / code_max  # [N, K]
    # An all-zero vector keeps scale 0 and codes 0; dividing by 1 avoids 0/0.
    codes = new / jnp.where(scale > 0, scale, 1.0)[..., None]
    if jnp.issubdtype(cache.codes.dtype, jnp.integer):
        codes = jnp.clip(jnp.round(codes), -code_max, code_max)
    return ScaledPages(cache.codes.at[pages, :, offsets, :].set(codes.astype(cache.codes.dtype)),
                       cache.scale.at[pages, :, offsets].set(scale))


def quantize_four_bit(kind, new):
    """new [..., D] -> kind's (codes [..., D/2] uint8, block_scale [..., D/16] e4m3,
    scale [...] f32). The token's largest block maps to block scale 448 and level max; each
    element rounds to the nearest level (ties to even, as ml_dtypes' float4_e2m1fn and
    np.round do) and saturates at the largest."""
    new = new.astype(jnp.float32)
    level_max = FOUR_BIT_MAX[kind]
    blocks = new.reshape(*new.shape[:-1], -1, FOUR_BIT_BLOCK)
    block_max = jnp.max(jnp.abs(blocks), axis=-1)  # [..., D/16]
    scale = jnp.max(block_max, axis=-1) / (level_max * BLOCK_SCALE_MAX)  # [...]
    # An all-zero vector (block) keeps scale 0 and codes 0; dividing by 1 avoids 0/0.
    block_scale = (block_max / level_max / jnp.where(scale > 0, scale, 1.0)[..., None]
                   ).astype(jnp.float8_e4m3fn)
    step = block_scale.astype(jnp.float32) * scale[..., None]
    x = blocks / jnp.where(step > 0, step, 1.0)[..., None]
    if kind is E2M1Pages:
        magnitude = jnp.abs(x)
        index = jnp.zeros(x.shape, jnp.uint8)
        levels = E2M1_MAGNITUDES
        for upper in range(1, len(levels)):  # ties go to the even index (an even mantissa)
            middle = (levels[upper - 1] + levels[upper]) / 2
            index += (magnitude >= middle if upper % 2 == 0 else magnitude > middle
                      ).astype(jnp.uint8)
        nibbles = index | jnp.where(jnp.signbit(x) & (index > 0), 8, 0).astype(jnp.uint8)
    else:
        nibbles = jnp.clip(jnp.round(x), -level_max, level_max).astype(jnp.int8)
        nibbles = nibbles.astype(jnp.uint8) & 15
    nibbles = nibbles.reshape(*new.shape[:-1], -1, 2)
    codes = nibbles[..., 0] | (nibbles[..., 1] << 4)
    return codes, block_scale, scale


def widen_four_bit(cache, dtype=jnp.float32):
    """FourBitPages (or any leading slice of them) -> [..., D] values of `dtype`."""
    levels = jnp.asarray(FOUR_BIT_LEVELS[type(cache)], jnp.float32)
    nibbles = jnp.stack([cache.codes & 15, cache.codes >> 4], axis=-1)
    values = jnp.take(levels, nibbles.astype(jnp.int32))  # [..., D/2, 2]
    values = values.reshape(*values.shape[:-2], -1, FOUR_BIT_BLOCK)
    values = values * cache.block_scale.astype(jnp.float32)[..., None]
    values = values.reshape(*values.shape[:-2], -1) * cache.scale[..., None]
    return values.astype(dtype)


def widen(cache, dtype=jnp.float32):
    """A cache (or a gathered slice of one, any leading shape) as plain values of `dtype`."""
    if isinstance(cache, FourBitPages):
        return widen_four_bit(cache, dtype)
    if isinstance(cache, ScaledPages):
        return (cache.codes.astype(jnp.float32) * cache.scale[..., None]).astype(dtype)
    return cache.astype(dtype)


def take_pages(cache, pages):
    """Rows of a cache for page ids `pages` (any shape), still stored (codes and scales)."""
    return jax.tree.map(lambda leaf: jnp.take(leaf, pages, axis=0, mode="clip"), cache)


def paged_decode_attention(q, k_cache, v_cache, page_table, lengths, *, scale: float,
                           window: int | None = None):
    """One query token per row. q [B, H, D]; page_table [B, W]; lengths [B] valid keys per row
    (the row's own token included, already written; at least 1); `window`: each row sees only
    its last `window` keys. Returns [B, H, D] in q's dtype. Pages past the longest row's block
    (and, windowed, before the earliest row's window) are never read."""
    B, H, D = q.shape
    K, page_size = k_cache.shape[1], k_cache.shape[2]
    pages_per_block, table = _block_table(page_table, page_size)
    qg = q.reshape(B, K, H // K, D).astype(jnp.float32) * scale

    def attend_block(index, state):
        pages = jax.lax.dynamic_slice_in_dim(table, index * pages_per_block, pages_per_block,
                                             axis=1)  # [B, N]
        k, v = _take_pages(k_cache, pages), _take_pages(v_cache, pages)  # [B, N, K, S, D]
        scores = jnp.einsum("bkgd,bnksd->bkgns", qg, k)
        keys = _key_positions(index, pages_per_block, page_size)[None]
        valid = keys < lengths[:, None, None]
        if window is not None:
            valid &= keys >= (lengths - window)[:, None, None]
        scores = jnp.where(valid[:, None, None], scores, -jnp.inf)
        return _fold_block(state, scores, lambda probs: jnp.einsum("bkgns,bnksd->bkgd", probs, v))

    num_blocks = _num_blocks(jnp.max(lengths), pages_per_block, page_size, table)
    first = _first_block(jnp.min(lengths) - 1, window, pages_per_block, page_size)
    state = _empty_state((B, K, H // K), D)
    _, total, weighted = jax.lax.fori_loop(first, num_blocks, attend_block, state)
    return (weighted / total[..., None]).reshape(B, H, D).astype(q.dtype)


def paged_prefill_attention(q, k_cache, v_cache, page_table, start, *, scale: float,
                            window: int | None = None):
    """Causal attention for one sequence's chunk. q [T, H, D] holds positions start..start+T-1
    (their K/V already written); page_table [W] covers every position up to start+T-1;
    `window`: each query sees only its last `window` keys (itself included).
    Rows past the real chunk length are padding: their output is unspecified."""
    T, H, D = q.shape
    K, page_size = k_cache.shape[1], k_cache.shape[2]
    pages_per_block, table = _block_table(page_table, page_size)
    qg = q.reshape(T, K, H // K, D).astype(jnp.float32) * scale
    query_positions = start + jnp.arange(T)

    def attend_block(index, state):
        pages = jax.lax.dynamic_slice_in_dim(table, index * pages_per_block, pages_per_block)
        k, v = _take_pages(k_cache, pages), _take_pages(v_cache, pages)  # [N, K, S, D]
        scores = jnp.einsum("tkgd,nksd->kgtns", qg, k)
        keys = _key_positions(index, pages_per_block, page_size)[None]
        causal = keys <= query_positions[:, None, None]  # [T, N, S]
        if window is not None:
            causal &= keys > (query_positions - window)[:, None, None]
        scores = jnp.where(causal[None, None], scores, -jnp.inf)
        return _fold_block(state, scores, lambda probs: jnp.einsum("kgtns,nksd->kgtd", probs, v))

    num_blocks = _num_blocks(start + T, pages_per_block, page_size, table)
    first = _first_block(start, window, pages_per_block, page_size)
    state = _empty_state((K, H // K, T), D)
    _, total, weighted = jax.lax.fori_loop(first, num_blocks, attend_block, state)
    out = weighted / total[..., None]  # [K, G, T, D]
    return jnp.moveaxis(out, 2, 0).reshape(T, H, D).astype(q.dtype)


def paged_block_attention(q, k_block, v_block, k_cache, v_cache, page_table, lengths, *,
                          scale: float, window: int | None = None, causal: bool = False):
    """A block of T queries per row over the row's paged keys 0..lengths-1 and the block's
    own T keys, which are not in the pages (the DFlash drafter, model/dflash.py). q [B, T, H,
    D], k_block / v_block [B, T, K, D]; query t sits at position lengths + t. Block keys are
    all visible to every query (`causal`: only keys t' <= t); `window`: a query at position p
    sees paged keys p - window + 1 .. only. Returns [B, T, H, D] in q's dtype."""
    B, T, H, D = q.shape
    K, page_size = k_cache.shape[1], k_cache.shape[2]
    pages_per_block, table = _block_table(page_table, page_size)
    qg = jnp.moveaxis(q.reshape(B, T, K, H // K, D), 1, 3).astype(jnp.float32) * scale
    query_positions = lengths[:, None] + jnp.arange(T)[None]  # [B, T]

    def attend_block(index, state):
        pages = jax.lax.dynamic_slice_in_dim(table, index * pages_per_block, pages_per_block,
                                             axis=1)  # [B, N]
        k, v = _take_pages(k_cache, pages), _take_pages(v_cache, pages)  # [B, N, K, S, D]
        scores = jnp.einsum("bkgtd,bnksd->bkgtns", qg, k)
        keys = _key_positions(index, pages_per_block, page_size)[None, None]  # [1, 1, N, S]
        valid = keys < lengths[:, None, None, None]
        if window is not None:
            valid &= keys > (query_positions - window)[:, :, None, None]
        valid = jnp.broadcast_to(valid, (B, T, *keys.shape[2:]))
        scores = jnp.where(valid[:, None, None], scores, -jnp.inf)
        return _fold_block(state, scores,
                           lambda probs: jnp.einsum("bkgtns,bnksd->bkgtd", probs, v))

    num_blocks = _num_blocks(jnp.max(lengths), pages_per_block, page_size, table)
    first = _first_block(jnp.min(lengths), window, pages_per_block, page_size)
    state = _empty_state((B, K, H // K, T), D)
    state = jax.lax.fori_loop(first, num_blocks, attend_block, state)
    # the block's own keys as one more block (N = 1, S = T)
    kb, vb = k_block.astype(jnp.float32), v_block.astype(jnp.float32)
    scores = jnp.einsum("bkgtd,bskd->bkgts", qg, kb)[..., None, :]
    if causal:
        scores = jnp.where(jnp.tril(jnp.ones((T, T), bool))[:, None, :], scores, -jnp.inf)
    _, total, weighted = _fold_block(
        state, scores, lambda probs: jnp.einsum("bkgts,bskd->bkgtd", probs[..., 0, :], vb))
    out = weighted / total[..., None]  # [B, K, G, T, D]
    return jnp.moveaxis(out, 3, 1).reshape(B, T, H, D).astype(q.dtype)


# ----------------------------------------------------------------------------- blocks


def _block_table(page_table, page_size: int):
    """(N, page_table padded with DUMMY_PAGE to a whole number of N-page blocks on its last
    axis), so every block slice is in bounds: a clamped slice would pair pages with the wrong
    positions."""
    width = page_table.shape[-1]
    pages_per_block = max(1, min(BLOCK_TOKENS // page_size, width))
    extra = -width % pages_per_block
    if extra:
        padding = [(0, 0)] * (page_table.ndim - 1) + [(0, extra)]
        page_table = jnp.pad(page_table, padding, constant_values=DUMMY_PAGE)
    return pages_per_block, page_table


def _num_blocks(num_keys, pages_per_block: int, page_size: int, table):
    """Blocks holding keys 0..num_keys-1, never more than the (padded) table has."""
    block_tokens = pages_per_block * page_size
    return jnp.minimum((num_keys + block_tokens - 1) // block_tokens,
                       table.shape[-1] // pages_per_block)


def _first_block(earliest_query, window: int | None, pages_per_block: int, page_size: int):
    """The first block holding a key that the earliest query may see: 0 unless windowed."""
    if window is None:
        return 0
    first_key = jnp.maximum(earliest_query - window + 1, 0)
    return first_key // (pages_per_block * page_size)


def _take_pages(cache, pages):
    """cache [P, K, S, D] rows for page ids [...] -> [..., K, S, D] in f32."""
    return widen(take_pages(cache, pages))


def _key_positions(index, pages_per_block: int, page_size: int):
    """Sequence positions of block `index`'s keys -> int32 [N, S]."""
    offsets = jnp.arange(pages_per_block * page_size).reshape(pages_per_block, page_size)
    return index * pages_per_block * page_size + offsets


def _empty_state(rows_shape, head_dim: int):
    """(running max, running sum of exp, running weighted values) for query rows
    `rows_shape`, before any key."""
    return (jnp.full(rows_shape, -jnp.inf, jnp.float32), jnp.zeros(rows_shape, jnp.float32),
            jnp.zeros(rows_shape + (head_dim,), jnp.float32))


def _fold_block(state, scores, weigh_values):
    """Fold one block into the running softmax. scores [..., N, S] with masked keys at -inf;
    weigh_values(probs [..., N, S]) -> [..., D]. A row may have seen no valid key yet (a
    windowed row whose window starts in a later block): its max stays -inf, and the shift
    below is 0 there so its masked keys weigh exactly 0 instead of exp(-inf + inf)."""
    running_max, total, weighted = state
    new_max = jnp.maximum(running_max, jnp.max(scores, axis=(-2, -1)))
    shift = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
    probs = jnp.exp(scores - shift[..., None, None])
    rescale = jnp.exp(running_max - shift)
    total = total * rescale + jnp.sum(probs, axis=(-2, -1))
    weighted = weighted * rescale[..., None] + weigh_values(probs)
    return new_max, total, weighted


def _gather(cache, page_table, dtype):
    """[P, K, S, D] gathered by page_table [..., W] -> [..., K, W*S, D] in `dtype` (the whole
    table at once; the GPU prefill in prefill.py uses it)."""
    pages = widen(take_pages(cache, page_table), dtype)  # [..., W, K, S, D]
    pages = jnp.moveaxis(pages, -3, -4)  # [..., K, W, S, D]
    shape = pages.shape
    return pages.reshape(*shape[:-3], shape[-3] * shape[-2], shape[-1])
