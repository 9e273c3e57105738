"""The Nemotron-H family `nemotron_h` (hybrid Mamba-2 / attention / MLP) as pure steps.

    ragged(params, kv, batch: RaggedBatch, prev_out) -> (logits[1 + B, V], kv)
    prefill(params, kv, tokens[T], start, num_tokens, page_table[W], state_slot)
                                                     -> (logits_last[V], kv)
    decode(params, kv, tokens[B], positions[B], page_tables[B, W], state_slots[B])
                                                     -> (logits[B, V], kv)
The contract of model/hybrid.py (state slots in RaggedBatch must be set). Layer i is one
residual block x + mixer(rms_norm(x)), the mixer given by config.layer_types[i]:
  "mamba"      Mamba-2 over per-sequence state slots (model/mamba2.py)
  "attention"  GQA attention over the paged KV, without any positional encoding (the Mamba
               layers carry position), scaled by D^-0.5
  "mlp"        up, squared ReLU, down (no gate)
  "moe"        Nemotron 3's MoE: glm4_moe's grouped sigmoid router (correction bias, top-k
               within the best groups, renormalised and scaled weights) over squared-ReLU
               experts (kernels/moe, activation "relu2"), plus an ungated squared-ReLU
               shared expert
Norms are plain RMSNorms; the LM head is untied unless tie_word_embeddings.

Caches: one entry per layer that has one, in layer order (MLP and MoE layers have none):
    attention  (k, v), each shaped by paged_attention.cache_specs (kv_dtype)
    mamba      {"conv": [S, K-1, conv_dim] compute dtype, "recurrent": [S, Hm, P, N] f32}
S state slots counting slot 0 (DUMMY_STATE_SLOT), which padding rows read and write.
Shape letters: N rows of a step (C chunk tokens + B row tokens), W page-table width.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import moe, paged_attention
from ninfer_jax.model import ragged_batch, tensor_parallel
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.layers import embed, linear, rms_norm, tied_head
from ninfer_jax.model.mamba2 import mamba2_mixer
from ninfer_jax.model.moe_mlp import route_grouped_sigmoid


def ragged(params, kv, batch: ragged_batch.RaggedBatch, prev_out, *, config: ModelConfig,
           page_size: int):
    """One ragged step (see llama.ragged): the f32 logits of the 1 + B sampled rows (row 0
    after the chunk's last real token, meaningless when C == 0) and the caches."""
    x, kv = _forward(params, kv, batch, ragged_batch.step_tokens(batch, prev_out), config,
                     page_size)
    return ragged_batch.sampled_logits(x, batch, lambda rows: _logits(params, rows, config)), kv


def prefill(params, kv, tokens, start, num_tokens, page_table, state_slot=None, *,
            config: ModelConfig, page_size: int):
    """One chunk of one sequence on state slot `state_slot` (int32 []); see llama.prefill."""
    batch = dataclasses.replace(ragged_batch.chunk_only(tokens, start, num_tokens, page_table),
                                chunk_state_slot=state_slot,
                                row_state_slots=jnp.zeros(0, jnp.int32))
    x, kv = _forward(params, kv, batch, ragged_batch.step_tokens(batch), config, page_size)
    return _logits(params, jnp.take(x, num_tokens - 1, axis=0), config), kv


def decode(params, kv, tokens, positions, page_tables, state_slots=None, *,
           config: ModelConfig, page_size: int):
    """One token per row, row i on state slot state_slots[i] (padding rows: slot 0 and
    DUMMY_PAGE tables); see llama.decode."""
    batch = dataclasses.replace(ragged_batch.rows_only(tokens, positions, page_tables),
                                chunk_state_slot=jnp.int32(ragged_batch.DUMMY_STATE_SLOT),
                                row_state_slots=state_slots)
    x, kv = _forward(params, kv, batch, ragged_batch.step_tokens(batch), config, page_size)
    return _logits(params, x, config), kv


def cache_shapes(config: ModelConfig, *, num_pages: int, page_size: int, num_state_slots: int,
                 dtype, kv_dtype):
    """The cache list as jax.ShapeDtypeStruct leaves (see the module docstring)."""
    kv_spec = paged_attention.cache_specs(num_pages, page_size, config.num_kv_heads,
                                          config.head_dim, kv_dtype)
    state = config.state_shapes()
    mamba_spec = {
        "conv": jax.ShapeDtypeStruct((num_state_slots, *state["conv"]), dtype),
        "recurrent": jax.ShapeDtypeStruct((num_state_slots, *state["recurrent"]), jnp.float32)}
    return [kv_spec if kind == "attention" else dict(mamba_spec)
            for kind in config.layer_types if kind in ("attention", "mamba")]


def init_caches(config: ModelConfig, **sizes):
    """Zero caches shaped by `cache_shapes` (same keyword arguments): every state slot starts
    empty, slot 0 included."""
    return jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype),
                        cache_shapes(config, **sizes))


def _forward(params, kv, batch, tokens, config: ModelConfig, page_size: int):
    """The decoder over the step's C + B rows `tokens`; returns the final residual [N, H]."""
    if batch.row_state_slots is None or (ragged_batch.num_chunk_tokens(batch)
                                         and batch.chunk_state_slot is None):
        raise ValueError("nemotron_h needs the batch's state slots")
    attend = tensor_parallel.attention_op(batch, scale=config.head_dim ** -0.5, mesh=None)
    slots = ragged_batch.step_slots(batch, page_size)
    x = embed(params["embed"], tokens)
    caches, new_kv = iter(kv), []
    for kind, layer in zip(config.layer_types, params["layers"]):
        h = rms_norm(x, layer["norm"], config.rms_norm_eps)
        if kind == "mlp":
            mixed = _relu2_mlp(h, layer["w_up"], layer["w_down"])
        elif kind == "moe":
            mixed = _moe(h, layer, config)
        elif kind == "attention":
            mixed, cache = _attention(h, layer, next(caches), slots, attend, config)
            new_kv.append(cache)
        else:
            mixed, cache = mamba2_mixer(h, layer, next(caches), batch, config)
            new_kv.append(cache)
        x = x + mixed
    return x, new_kv


def _relu2_mlp(h, w_up, w_down):
    return linear(jnp.square(jax.nn.relu(linear(h, w_up))), w_down)


def _moe(h, layer, config: ModelConfig):
    """The routed squared-ReLU experts plus the shared expert of rows h [N, H]."""
    expert_ids, expert_weights = route_grouped_sigmoid(h, layer, config)
    out = moe.routed_experts(h, expert_ids, expert_weights.astype(h.dtype),
                             layer["experts_up"], layer["experts_down"], activation="relu2")
    if "shared_w_up" in layer:
        out = out + _relu2_mlp(h, layer["shared_w_up"], layer["shared_w_down"])
    return out


def _attention(h, layer, cache, slots, attend, config: ModelConfig):
    """GQA attention of rows h [N, H] without RoPE; K/V stored at `slots` first."""
    N, NH, NK, D = h.shape[0], config.num_heads, config.num_kv_heads, config.head_dim
    q = linear(h, layer["wq"]).reshape(N, NH, D)
    k = linear(h, layer["wk"]).reshape(N, NK, D)
    v = linear(h, layer["wv"]).reshape(N, NK, D)
    out, cache = attend(q, k, v, cache, slots)
    return linear(out.reshape(N, NH * D), layer["wo"]), cache


def _logits(params, x, config: ModelConfig):
    """Final norm and the (untied or tied) output projection, in f32."""
    h = rms_norm(x, params["final_norm"], config.rms_norm_eps)
    head = tied_head(params["embed"]) if config.tie_word_embeddings else params["lm_head"]
    return linear(h, head, out_dtype=jnp.float32).astype(jnp.float32)
