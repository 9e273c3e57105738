"""Pure-jnp reference twin of the paged attention kernels (the CPU path and the test oracle).

Cache layout (owned by this op; the page pool asks `get_kv_cache_shape`):
    k_cache, v_cache: [P, K, S, D]  P pages, K kv heads, S tokens per page, D head dim
A token at sequence position t lives in page `page_table[t // S]`, slot `t % S`.
Page DUMMY_PAGE is never owned by a sequence: padding rows write there and padded page-table
entries point there, so every index stays in bounds without a branch.
Shape letters: B batch rows, T chunk tokens, H query heads, G = H // K, W page-table width,
N pages per block.

Decode walks the page table in blocks of N pages with an online softmax and stops after the
block holding the longest row's last key, so its cost follows the real context lengths rather
than the padded width W (on XLA CPU a static pass over W pages cost up to 10x more for a table
padded to 64 pages; see docs/benchmarks.md, "CPU serving").
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

DUMMY_PAGE = 0
# Keys per decode block: big enough that the loop runs few iterations (each costs a fixed
# overhead on CPU), small enough that the last block wastes little past the longest row.
DECODE_BLOCK_TOKENS = 64


def get_kv_cache_shape(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int):
    return (num_pages, num_kv_heads, page_size, head_dim)


def write_kv(k_cache, v_cache, k_new, v_new, slots):
    """Store k_new/v_new [N, K, D] at flat slots [N] (page * S + offset)."""
    page_size = k_cache.shape[2]
    pages, offsets = slots // page_size, slots % page_size
    k_cache = k_cache.at[pages, :, offsets, :].set(k_new.astype(k_cache.dtype))
    v_cache = v_cache.at[pages, :, offsets, :].set(v_new.astype(v_cache.dtype))
    return k_cache, v_cache


def _gather(cache, page_table):
    """[P, K, S, D] gathered by page_table [..., W] -> [..., K, W*S, D]."""
    pages = cache[page_table]  # [..., W, K, S, D]
    pages = jnp.moveaxis(pages, -3, -4)  # [..., K, W, S, D]
    shape = pages.shape
    return pages.reshape(*shape[:-3], shape[-3] * shape[-2], shape[-1])


def paged_decode_attention(q, k_cache, v_cache, page_table, lengths, *, scale: float):
    """One query token per row. q [B, H, D]; page_table [B, W]; lengths [B] valid keys per row
    (the row's own token included, already written; at least 1). Returns [B, H, D] in q's
    dtype. Pages past the longest row are never read."""
    B, H, D = q.shape
    K, page_size = k_cache.shape[1], k_cache.shape[2]
    pages_per_block = max(1, min(DECODE_BLOCK_TOKENS // page_size, page_table.shape[1]))
    block_tokens = pages_per_block * page_size
    table = _pad_width(page_table, pages_per_block)
    qg = q.reshape(B, K, H // K, D).astype(jnp.float32) * scale

    def attend_block(index, state):
        pages = jax.lax.dynamic_slice_in_dim(table, index * pages_per_block, pages_per_block,
                                             axis=1)  # [B, N]
        k = jnp.take(k_cache, pages, axis=0, mode="clip").astype(jnp.float32)  # [B, N, K, S, D]
        v = jnp.take(v_cache, pages, axis=0, mode="clip").astype(jnp.float32)
        scores = jnp.einsum("bkgd,bnksd->bkgns", qg, k)
        positions = index * block_tokens + jnp.arange(block_tokens).reshape(pages_per_block,
                                                                           page_size)
        valid = positions[None] < lengths[:, None, None]  # [B, N, S]
        scores = jnp.where(valid[:, None, None], scores, -jnp.inf)
        return _online_softmax_step(state, scores, v)

    num_blocks = (jnp.max(lengths) + block_tokens - 1) // block_tokens
    state = (jnp.full((B, K, H // K), -jnp.inf, jnp.float32),  # running max
             jnp.zeros((B, K, H // K), jnp.float32),  # running sum of exp
             jnp.zeros((B, K, H // K, D), jnp.float32))  # running weighted values
    _, total, weighted = jax.lax.fori_loop(0, num_blocks, attend_block, state)
    return (weighted / total[..., None]).reshape(B, H, D).astype(q.dtype)


def _online_softmax_step(state, scores, v):
    """Fold one block into the running softmax. scores [B, K, G, N, S] (masked keys -inf),
    v [B, N, K, S, D]. Every row has a valid key in block 0, so the running max is finite
    from then on and exp(-inf - max) is an exact 0 for masked keys."""
    running_max, total, weighted = state
    new_max = jnp.maximum(running_max, jnp.max(scores, axis=(3, 4)))
    probs = jnp.exp(scores - new_max[..., None, None])
    rescale = jnp.exp(running_max - new_max)
    total = total * rescale + jnp.sum(probs, axis=(3, 4))
    weighted = weighted * rescale[..., None] + jnp.einsum("bkgns,bnksd->bkgd", probs, v)
    return new_max, total, weighted


def _pad_width(page_table, multiple: int):
    """page_table [B, W] padded with DUMMY_PAGE to a multiple of `multiple` columns, so every
    block slice is in bounds (a clamped slice would pair pages with the wrong positions)."""
    extra = -page_table.shape[1] % multiple
    if extra == 0:
        return page_table
    return jnp.pad(page_table, ((0, 0), (0, extra)), constant_values=DUMMY_PAGE)


def paged_prefill_attention(q, k_cache, v_cache, page_table, start, *, scale: float):
    """Causal attention for one sequence's chunk. q [T, H, D] holds positions start..start+T-1
    (their K/V already written); page_table [W] covers every position up to start+T-1.
    Rows past the real chunk length are padding: their output is unspecified."""
    T, H, D = q.shape
    K = k_cache.shape[1]
    k = _gather(k_cache, page_table).astype(jnp.float32)  # [K, W*S, D]
    v = _gather(v_cache, page_table).astype(jnp.float32)
    qg = q.reshape(T, K, H // K, D).astype(jnp.float32)
    scores = jnp.einsum("tkgd,ksd->kgts", qg, k) * scale
    q_pos = start + jnp.arange(T)
    causal = jnp.arange(k.shape[1])[None, :] <= q_pos[:, None]  # [T, W*S]
    scores = jnp.where(causal[None, None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("kgts,ksd->tkgd", probs, v)
    return out.reshape(T, H, D).astype(q.dtype)
