"""The hybrid families `qwen3_5` (dense MLP), `qwen3_5_moe` and `qwen3_next` (MoE) as pure steps.

    ragged(params, kv, batch: RaggedBatch, prev_out) -> (logits[1 + B, V], kv)
    prefill(params, kv, tokens[T], start, num_tokens, page_table[W], state_slot)
                                                     -> (logits_last[V], kv)
    decode(params, kv, tokens[B], positions[B], page_tables[B, W], state_slots[B])
                                                     -> (logits[B, V], kv)
Same contract as model/llama.py, plus the state slots of RaggedBatch (chunk_state_slot,
row_state_slots), which must be set. Layer i is config.layer_types[i]:
  "full_attention"    gated attention: q_proj yields per head D query then D gate columns;
                      zero-centred q/k norms; RoPE over the first D * partial_rotary_factor
                      dims; paged KV exactly as llama; output times sigmoid(gate) before wo
  "linear_attention"  Gated DeltaNet over per-sequence state slots (model/gated_deltanet.py)
then a dense SwiGLU MLP or, on MoE layers, model/moe_mlp.py. Every norm but the DeltaNet's
output norm is zero-centred (1 + w).

Caches: a list with one entry per layer, the engine's interface (build it with init_caches):
    full_attention    (k, v), each shaped by paged_attention.cache_specs (kv_dtype)
    linear_attention  {"conv": [S, K-1, conv_dim] compute dtype,
                       "recurrent": [S, Hv, dk, dv] float32}
S state slots counting slot 0 (DUMMY_STATE_SLOT), which padding rows read and write.
Shape letters: N rows of a step (C chunk tokens + B row tokens), W page-table width.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import paged_attention
from ninfer_jax.model import dflash, multimodal, ragged_batch, tensor_parallel
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.gated_deltanet import gated_deltanet
from ninfer_jax.model.layers import (add_rms_norm, add_then_next_norm, apply_partial_rope,
                                     embed, linear, mrope_tables, rope_inverse_frequencies,
                                     rope_tables, split_columns, swiglu_mlp,
                                     zero_centred_rms_norm)
from ninfer_jax.model.multimodal import MediaRows
from ninfer_jax.model.vision.mrope import frequency_axes
from ninfer_jax.model.moe_mlp import moe_mlp


def ragged(params, kv, batch: ragged_batch.RaggedBatch, prev_out, *, config: ModelConfig,
           page_size: int, mesh=None, media: MediaRows | None = None, hidden: bool = False,
           taps: tuple[int, ...] = ()):
    """One ragged step (see llama.ragged, `mesh` and `media` included): returns the f32 logits
    of the 1 + B sampled rows (row 0 after the chunk's last real token, meaningless when
    C == 0) and the caches; `hidden` adds the final-normed states of all C + B rows (the
    MTP head's input, model/mtp.py); `taps` (static layer indexes) adds the residual stream
    after each of those layers, concatenated [C + B, len(taps) * H] (DFlash, model/dflash.py)."""
    x, kv, tapped = _forward(params, kv, batch, ragged_batch.step_tokens(batch, prev_out),
                             config, page_size, mesh, media, taps)
    logits = ragged_batch.sampled_logits(x, batch, lambda rows: _logits(params, rows, config))
    if hidden:
        return logits, kv, final_norm(params, x, config)
    if taps:
        return logits, kv, tapped
    return logits, kv


def prefill(params, kv, tokens, start, num_tokens, page_table, state_slot=None, *,
            config: ModelConfig, page_size: int, mesh=None, media: MediaRows | None = None):
    """One chunk of one sequence on state slot `state_slot` (int32 []); see llama.prefill."""
    batch = dataclasses.replace(ragged_batch.chunk_only(tokens, start, num_tokens, page_table),
                                chunk_state_slot=state_slot,
                                row_state_slots=jnp.zeros(0, jnp.int32))
    x, kv, _ = _forward(params, kv, batch, ragged_batch.step_tokens(batch), config, page_size,
                        mesh, media)
    return _logits(params, jnp.take(x, num_tokens - 1, axis=0), config), kv


def decode(params, kv, tokens, positions, page_tables, state_slots=None, *,
           config: ModelConfig, page_size: int, mesh=None):
    """One token per row, row i on state slot state_slots[i] (padding rows: slot 0 and
    DUMMY_PAGE tables); see llama.decode."""
    batch = dataclasses.replace(ragged_batch.rows_only(tokens, positions, page_tables),
                                chunk_state_slot=jnp.int32(ragged_batch.DUMMY_STATE_SLOT),
                                row_state_slots=state_slots)
    x, kv, _ = _forward(params, kv, batch, ragged_batch.step_tokens(batch), config, page_size,
                        mesh)
    return _logits(params, x, config), kv


def settle_rows(kv, batch: ragged_batch.RaggedBatch, row_tokens, row_samples):
    """After a step with `chained_rows`: write each chain's accepted row state into its slot
    and drop the per-row states. row_tokens [B] the rows' tokens, row_samples [B] the token
    sampled after each. Row i+1's token is a draft, accepted when row i sampled it; the
    chain's state is the one after its last row whose own draft (if any) was accepted and
    whose sample is a correction or the bonus: the state after the last committed token
    but one, as the scheduler's invariant wants (engine/state_slots.py). Plain rows are
    chains of one and are written as they are (ragged_batch.last_accepted_rows)."""
    slots = batch.row_state_slots
    is_final = ragged_batch.last_accepted_rows(slots, row_tokens, row_samples)
    target = jnp.where(is_final, slots, ragged_batch.DUMMY_STATE_SLOT)
    settled = []
    for layer in kv:
        if isinstance(layer, dict) and "row_conv" in layer:
            layer = {"conv": layer["conv"].at[target].set(layer["row_conv"]),
                     "recurrent": layer["recurrent"].at[target].set(layer["row_recurrent"])}
        settled.append(layer)
    return settled


def cache_shapes(config: ModelConfig, *, num_pages: int, page_size: int, num_state_slots: int,
                 dtype, kv_dtype, mtp_drafts: int = 0, dflash_drafts: int = 0,
                 dflash_config=None):
    """The cache list as jax.ShapeDtypeStruct leaves (see the module docstring); `mtp_drafts`
    K > 0 appends the MTP head's (k, v) and its draft store (model/mtp.py), `dflash_drafts`
    K > 0 one (k, v) per layer of the drafter `dflash_config` and the store
    (model/dflash.py)."""
    kv_spec = paged_attention.cache_specs(num_pages, page_size, config.num_kv_heads,
                                          config.head_dim, kv_dtype)
    state = config.state_shapes()
    linear_spec = {
        "conv": jax.ShapeDtypeStruct((num_state_slots, *state["conv"]), dtype),
        "recurrent": jax.ShapeDtypeStruct((num_state_slots, *state["recurrent"]), jnp.float32)}
    num_drafts = mtp_drafts or dflash_drafts
    store = {"draft_q": jax.ShapeDtypeStruct((num_state_slots, num_drafts, config.vocab_size),
                                             jnp.float32)}
    drafter = ([kv_spec] if mtp_drafts else
               dflash.cache_shapes(dflash_config, num_pages=num_pages, page_size=page_size,
                                   kv_dtype=kv_dtype) if dflash_drafts else [])
    return [kv_spec if kind == "full_attention" else dict(linear_spec)
            for kind in config.layer_types] + drafter + ([store] if num_drafts else [])


def init_caches(config: ModelConfig, *, num_pages: int, page_size: int, num_state_slots: int,
                dtype, kv_dtype, **drafts):
    """Zero caches: every state slot starts empty, slot 0 included."""
    specs = cache_shapes(config, num_pages=num_pages, page_size=page_size,
                         num_state_slots=num_state_slots, dtype=dtype, kv_dtype=kv_dtype,
                         **drafts)
    return jax.tree_util.tree_map(lambda spec: jnp.zeros(spec.shape, spec.dtype), specs)


def _forward(params, kv, batch, tokens, config: ModelConfig, page_size: int, mesh=None,
             media: MediaRows | None = None, taps: tuple[int, ...] = ()):
    """The decoder over the step's C + B rows `tokens`; returns the final residual [N, H],
    the caches and the residual after each layer in `taps`, concatenated (None without)."""
    if batch.row_state_slots is None or (ragged_batch.num_chunk_tokens(batch)
                                         and batch.chunk_state_slot is None):
        raise ValueError("hybrid models need the batch's state slots")
    attend = tensor_parallel.attention_op(batch, scale=config.head_dim ** -0.5, mesh=mesh)
    groups = tensor_parallel.num_groups(mesh)
    rotary_dim = int(config.head_dim * config.partial_rotary_factor)
    inv_freq = rope_inverse_frequencies(rotary_dim, config.rope_theta, config.rope_scaling)
    slots = ragged_batch.step_slots(batch, page_size)
    live = ragged_batch.live_rows(slots, page_size)
    x = embed(params["embed"], tokens)
    deepstack = None
    if media is None:
        rope = rope_tables(ragged_batch.step_positions(batch), inv_freq)
    else:  # MRoPE over the rotary dims; Qwen3.5 towers have no deepstack, but S > 0 works
        rope = mrope_tables(media.rope_positions, inv_freq,
                            frequency_axes(config.mrope_section, rotary_dim // 2))
        x = multimodal.chunk_embeddings(x, media)
        deepstack = multimodal.deepstack_rows(media, x.shape[0])
    new_kv, tapped = [], {}
    eps, layers = config.rms_norm_eps, params["layers"]
    h = zero_centred_rms_norm(x, layers[0]["attn_norm"], eps)
    for i, (layer, cache) in enumerate(zip(layers, kv)):
        if config.layer_types[i] == "full_attention":
            mixed, cache = gated_attention(h, layer, cache, rope, slots, attend, config)
        else:
            mixed, cache = gated_deltanet(h, layer, cache, batch, config, mesh)
        x, h = add_rms_norm(x, mixed, layer["mlp_norm"], eps, zero_centred=True)
        x, h = add_then_next_norm(
            x, (moe_mlp(h, layer, config, mesh, live) if config.is_moe_layer(i)
                else swiglu_mlp(h, layer, groups)),
            layers[i + 1]["attn_norm"] if i + 1 < len(layers) else None, eps,
            zero_centred=True,
            extra=deepstack[i] if deepstack is not None and i < deepstack.shape[0] else None)
        new_kv.append(cache)
        if i in taps:
            tapped[i] = x
    return x, new_kv, (jnp.concatenate([tapped[i] for i in taps], axis=-1) if taps else None)


def gated_attention(h, layer, cache, rope, slots, attend, config: ModelConfig):
    """GQA attention of rows h [N, H] with zero-centred q/k norms, partial RoPE and (when
    config.attn_output_gate) the sigmoid output gate; K/V stored at `slots` first."""
    N, D, NH, NK = h.shape[0], config.head_dim, config.num_heads, config.num_kv_heads
    gated = config.attn_output_gate
    q_cols = NH * D * (2 if gated else 1)
    fused = None
    if "wqkv" in layer:  # one product for the three (model/fused_projections.py)
        qkv = linear(h, layer["wqkv"])
        fused = attend.from_qkv(qkv, layer["q_norm"], layer["k_norm"], *rope, cache, slots,
                                num_heads=NH, num_kv_heads=NK, eps=config.rms_norm_eps,
                                zero_centred=True, gated=gated)
        q, k, v = split_columns(qkv, (q_cols, NK * D, NK * D))
    else:
        q, k, v = (linear(h, layer[name]) for name in ("wq", "wk", "wv"))
    q = q.reshape(N, NH, -1)
    q, gate = (q[..., :D], q[..., D:]) if gated else (q, None)
    if fused is not None:  # the norms, RoPE and cache writes done in one kernel
        out, cache = fused
    else:
        k, v = k.reshape(N, NK, D), v.reshape(N, NK, D)
        eps = config.rms_norm_eps
        q = apply_partial_rope(zero_centred_rms_norm(q, layer["q_norm"], eps), *rope)
        k = apply_partial_rope(zero_centred_rms_norm(k, layer["k_norm"], eps), *rope)
        out, cache = attend(q, k, v, cache, slots)
    if gate is not None:
        out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
    return linear(out.reshape(N, NH * D), layer["wo"]), cache


def final_norm(params, x, config: ModelConfig):
    return zero_centred_rms_norm(x, params["final_norm"], config.rms_norm_eps)


def _logits(params, x, config: ModelConfig):
    """Zero-centred final norm and the (tied or untied) output projection, in f32."""
    h = final_norm(params, x, config)
    head = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
    return linear(h, head, out_dtype=jnp.float32).astype(jnp.float32)
