"""The dense decoder families `llama` and `qwen3` (QK-norm) as two pure steps over paged KV.

    prefill(params, kv, tokens[T], start, num_tokens, page_table[W]) -> (logits_last[V], kv)
    decode(params, kv, tokens[B], positions[B], page_tables[B, W])   -> (logits[B, V], kv)

`params` is the pytree documented in model/config.py; `kv` is a list with one (k, v) pair per
layer, each shaped by `paged_attention.get_kv_cache_shape`. Attention and cache writes go through
the kernels.paged_attention entry points only, so the GPU kernels plug in there. Activations
run in the params' dtype (f32 on CPU, bf16 on GPU); norms, RoPE and logits are computed in f32.

Layers are a Python loop (unrolled in the compiled step) over per-layer cache arrays: each cache
is donated and updated in place, which a lax.scan over stacked caches cannot do (see
docs/architecture.md, "Compiled steps", for the measurements behind this choice).
Shape letters: N rows of a step (T chunk tokens or B batch rows), W page-table width, S page size.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp

from ninfer_jax.kernels import paged_attention
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.layers import (apply_rope, embed, linear, rms_norm, rope_inverse_frequencies,
                                     rope_tables, swiglu_mlp)


def prefill(params, kv, tokens, start, num_tokens, page_table, *, config: ModelConfig,
            page_size: int):
    """One chunk of one sequence at positions start..start+T-1. Rows >= num_tokens are padding:
    their KV goes to the dummy page and their outputs are ignored. Returns the f32 logits of the
    last real token and the updated caches."""
    T = tokens.shape[0]
    positions = start + jnp.arange(T, dtype=jnp.int32)
    pages = jnp.take(page_table, positions // page_size, mode="clip")
    pages = jnp.where(jnp.arange(T) < num_tokens, pages, paged_attention.DUMMY_PAGE)
    slots = pages * page_size + positions % page_size
    attend = functools.partial(paged_attention.paged_prefill_attention, page_table=page_table,
                               start=start, scale=config.head_dim ** -0.5)
    x, kv = _layers(params, kv, embed(params["embed"], tokens), positions, slots, attend, config)
    last = jnp.take(x, num_tokens - 1, axis=0)
    return _logits(params, last, config), kv


def decode(params, kv, tokens, positions, page_tables, *, config: ModelConfig, page_size: int):
    """One new token per row. Padding rows carry DUMMY_PAGE page tables (and position 0), so
    their cache writes land in the dummy page. Returns f32 logits [B, V] and the caches."""
    row_pages = jnp.take_along_axis(page_tables, (positions // page_size)[:, None], axis=1)[:, 0]
    slots = row_pages * page_size + positions % page_size
    attend = functools.partial(paged_attention.paged_decode_attention, page_table=page_tables,
                               lengths=positions + 1, scale=config.head_dim ** -0.5)
    x, kv = _layers(params, kv, embed(params["embed"], tokens), positions, slots, attend, config)
    return _logits(params, x, config), kv


def _layers(params, kv, x, positions, slots, attend, config: ModelConfig):
    """Run every decoder layer over rows x [N, H]; returns the final residual and new caches."""
    inv_freq = rope_inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    cos, sin = rope_tables(positions, inv_freq)
    new_kv = []
    for layer, (k_cache, v_cache) in zip(params["layers"], kv):
        h = rms_norm(x, layer["attn_norm"], config.rms_norm_eps)
        attn_out, k_cache, v_cache = _attention(h, layer, k_cache, v_cache, cos, sin, slots,
                                                attend, config)
        x = x + attn_out
        x = x + swiglu_mlp(rms_norm(x, layer["mlp_norm"], config.rms_norm_eps), layer)
        new_kv.append((k_cache, v_cache))
    return x, new_kv


def _attention(h, layer, k_cache, v_cache, cos, sin, slots, attend, config: ModelConfig):
    """GQA self-attention of rows h [N, H]: project, (qwen3) per-head norm, rotate, store the
    new K/V at `slots`, attend over the paged cache, project back."""
    N, D = h.shape[0], config.head_dim
    q = linear(h, layer["wq"]).reshape(N, config.num_heads, D)
    k = linear(h, layer["wk"]).reshape(N, config.num_kv_heads, D)
    v = linear(h, layer["wv"]).reshape(N, config.num_kv_heads, D)
    if config.qk_norm:
        q = rms_norm(q, layer["q_norm"], config.rms_norm_eps)
        k = rms_norm(k, layer["k_norm"], config.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache, v_cache = paged_attention.write_kv(k_cache, v_cache, k, v, slots)
    out = attend(q, k_cache, v_cache)
    return linear(out.reshape(N, config.num_heads * D), layer["wo"]), k_cache, v_cache


def _logits(params, x, config: ModelConfig):
    """Final norm and the (tied or untied) output projection, in f32."""
    h = rms_norm(x, params["final_norm"], config.rms_norm_eps)
    head = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
    return linear(h, head, out_dtype=jnp.float32).astype(jnp.float32)
