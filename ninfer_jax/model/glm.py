"""The GLM MoE family `glm4_moe` (GLM-4.5 / 4.6 / Air) as pure steps over paged KV.

    ragged(params, kv, batch: RaggedBatch, prev_out) -> (logits[1 + B, V], kv)
    prefill(params, kv, tokens[T], start, num_tokens, page_table[W]) -> (logits_last[V], kv)
    decode(params, kv, tokens[B], positions[B], page_tables[B, W])   -> (logits[B, V], kv)

The contract, caches and dtypes of model/llama.py (no recurrent state, so the engine treats it
as a dense family). Each layer: RMSNorm, GQA attention with optional q/k/v biases and
per-head q/k RMSNorm, RoPE over the first head_dim * partial_rotary_factor dims of each head
(rotate_half within them), then RMSNorm and a dense SwiGLU MLP on the first layers
(config.mlp_only_layers, HF's first_k_dense_replace) or the MoE MLP of model/moe_mlp.py with
the grouped sigmoid router and ungated shared experts. Params: model/config.py.
Shape letters: N rows of a step, NH query heads, NK kv heads, D head dim, W page-table width.
"""
from __future__ import annotations


import jax.numpy as jnp

from ninfer_jax.kernels import paged_attention
from ninfer_jax.model import ragged_batch, tensor_parallel
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.layers import (apply_partial_rope, embed, linear, rms_norm,
                                     rope_inverse_frequencies, rope_tables, swiglu_mlp)
from ninfer_jax.model.llama import _logits, cache_shapes, init_caches  # noqa: F401 (interface)
from ninfer_jax.model.moe_mlp import moe_mlp


def ragged(params, kv, batch: ragged_batch.RaggedBatch, prev_out, *, config: ModelConfig,
           page_size: int, mesh=None):
    """One ragged step (see llama.ragged): the f32 logits of the 1 + B sampled rows and the
    caches."""
    x, kv = _forward(params, kv, batch, ragged_batch.step_tokens(batch, prev_out), config,
                     page_size, mesh)
    return ragged_batch.sampled_logits(x, batch, lambda rows: _logits(params, rows, config)), kv


def prefill(params, kv, tokens, start, num_tokens, page_table, *, config: ModelConfig,
            page_size: int, mesh=None):
    """One chunk of one sequence (see llama.prefill): logits of the last real token."""
    batch = ragged_batch.chunk_only(tokens, start, num_tokens, page_table)
    x, kv = _forward(params, kv, batch, ragged_batch.step_tokens(batch), config, page_size,
                     mesh)
    return _logits(params, jnp.take(x, num_tokens - 1, axis=0), config), kv


def decode(params, kv, tokens, positions, page_tables, *, config: ModelConfig, page_size: int,
           mesh=None):
    """One new token per row (see llama.decode): f32 logits [B, V] and the caches."""
    batch = ragged_batch.rows_only(tokens, positions, page_tables)
    x, kv = _forward(params, kv, batch, ragged_batch.step_tokens(batch), config, page_size,
                     mesh)
    return _logits(params, x, config), kv


def _forward(params, kv, batch, tokens, config: ModelConfig, page_size: int, mesh):
    """The decoder over the step's rows `tokens`; returns the final residual [N, H]."""
    attend = tensor_parallel.attention_op(batch, scale=config.head_dim ** -0.5, mesh=mesh)
    groups = tensor_parallel.num_groups(mesh)
    rotary_dim = int(config.head_dim * config.partial_rotary_factor)
    inv_freq = rope_inverse_frequencies(rotary_dim, config.rope_theta, config.rope_scaling)
    rope = rope_tables(ragged_batch.step_positions(batch), inv_freq)
    slots = ragged_batch.step_slots(batch, page_size)
    live = ragged_batch.live_rows(slots, page_size)
    x = embed(params["embed"], tokens)
    new_kv = []
    for i, (layer, cache) in enumerate(zip(params["layers"], kv)):
        h = rms_norm(x, layer["attn_norm"], config.rms_norm_eps)
        attn_out, cache = _attention(h, layer, cache, rope, slots, attend, config)
        x = x + attn_out
        h = rms_norm(x, layer["mlp_norm"], config.rms_norm_eps)
        x = x + (moe_mlp(h, layer, config, mesh, live) if config.is_moe_layer(i)
                 else swiglu_mlp(h, layer, groups))
        new_kv.append(cache)
    return x, new_kv


def _attention(h, layer, cache, rope, slots, attend, config: ModelConfig):
    """GQA attention of rows h [N, H]: biased projections, optional q/k norms, partial RoPE,
    K/V stored at `slots`, attention over the paged cache, output projection."""
    N, NH, NK, D = h.shape[0], config.num_heads, config.num_kv_heads, config.head_dim
    q, k, v = (_project(h, layer, name) for name in ("q", "k", "v"))
    q, k, v = q.reshape(N, NH, D), k.reshape(N, NK, D), v.reshape(N, NK, D)
    if config.qk_norm:
        q = rms_norm(q, layer["q_norm"], config.rms_norm_eps)
        k = rms_norm(k, layer["k_norm"], config.rms_norm_eps)
    q, k = apply_partial_rope(q, *rope), apply_partial_rope(k, *rope)
    out, cache = attend(q, k, v, cache, slots)
    return linear(out.reshape(N, NH * D), layer["wo"]), cache


def _project(h, layer, name: str):
    out = linear(h, layer["w" + name])
    bias = layer.get("b" + name)
    return out if bias is None else out + bias.astype(out.dtype)
