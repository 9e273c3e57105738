"""Pure-jnp reference twin of the paged attention kernels (the CPU path and the test oracle).

Cache layout (owned by this op; the page pool asks `get_kv_cache_shape`):
    k_cache, v_cache: [P, K, S, D]  P pages, K kv heads, S tokens per page, D head dim
A token at sequence position t lives in page `page_table[t // S]`, slot `t % S`.
Page DUMMY_PAGE is never owned by a sequence: padding rows write there and padded page-table
entries point there, so every index stays in bounds without a branch.
Shape letters: B batch rows, T chunk tokens, H query heads, G = H // K, W page-table width.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

DUMMY_PAGE = 0


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
    (the row's own token included, already written). Returns [B, H, D] in q's dtype."""
    B, H, D = q.shape
    K = k_cache.shape[1]
    k = _gather(k_cache, page_table).astype(jnp.float32)  # [B, K, W*S, D]
    v = _gather(v_cache, page_table).astype(jnp.float32)
    qg = q.reshape(B, K, H // K, D).astype(jnp.float32)
    scores = jnp.einsum("bkgd,bktd->bkgt", qg, k) * scale
    valid = jnp.arange(k.shape[2])[None, :] < lengths[:, None]  # [B, W*S]
    scores = jnp.where(valid[:, None, None, :], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgt,bktd->bkgd", probs, v)
    return out.reshape(B, H, D).astype(q.dtype)


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
