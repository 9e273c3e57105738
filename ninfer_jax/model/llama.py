"""The dense decoder families `llama` and `qwen3` (QK-norm) as pure steps over paged KV.

    ragged(params, kv, batch: RaggedBatch, prev_out, media=None) -> (logits[1 + B, V], kv)
    prefill(params, kv, tokens[T], start, num_tokens, page_table[W], media=None)
                                                                  -> (logits_last[V], kv)
    decode(params, kv, tokens[B], positions[B], page_tables[B, W])   -> (logits[B, V], kv)

`ragged` is the one forward: a prefill chunk and B independent row tokens (model/ragged_batch.py)
go through the dense parts together as C + B rows, and attention splits them again
(kernels.ragged_attention). `prefill` (B = 0) and `decode` (C = 0) are its two special cases.
`media` (model/multimodal.MediaRows, Qwen3-VL-shaped qwen3 configs with mrope_section) adds
vision embeddings, three-axis MRoPE positions and deepstack features; without it the step is
the text-only path, unchanged.
`init_caches` / `cache_shapes` build the caches the runner donates (the family interface every
family module provides; dense families ignore the state-slot count).
`params` is the pytree documented in model/config.py; `kv` is a list with one (k, v) pair per
layer, each shaped by `paged_attention.cache_specs` (8- and 4-bit pages carry their scales).
Cache writes and attention go through tensor_parallel.attention_op only
(paged_attention.write_kv, then kernels.ragged_attention; per shard under a tensor-parallel
mesh), so the GPU kernels plug in there. Activations run in the params' dtype (f32 on CPU,
bf16 on GPU); norms, RoPE and logits are computed in f32.

Layers are a Python loop (unrolled in the compiled step) over per-layer cache arrays: each cache
is donated and updated in place, which a lax.scan over stacked caches cannot do (see
docs/architecture.md, "Compiled steps", for the measurements behind this choice).
Shape letters: N rows of a step (C chunk tokens + B row tokens, or T chunk tokens alone),
W page-table width, S page size.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import paged_attention
from ninfer_jax.model import dflash, multimodal, ragged_batch, tensor_parallel
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.layers import (add_rms_norm, add_then_next_norm, apply_rope, embed,
                                     linear, mrope_tables, rms_norm, rope_inverse_frequencies,
                                     rope_tables, swiglu_mlp, tied_head)
from ninfer_jax.model.multimodal import MediaRows
from ninfer_jax.model.vision.mrope import frequency_axes

# `ragged` takes batches whose chunk region holds several sequences' chunks (segments,
# model/ragged_batch.py): every per-token array comes from ragged_batch's helpers and the
# attention splits the segments (kernels.ragged_attention). Text steps only (no media).
CHUNK_SEGMENTS = True


def ragged(params, kv, batch: ragged_batch.RaggedBatch, prev_out, *, config: ModelConfig,
           page_size: int, mesh=None, media: MediaRows | None = None,
           taps: tuple[int, ...] = ()):
    """One ragged step: every chunk and row token writes its K/V, the chunk attends causally
    over its sequence and each row token to keys 0..its position. `prev_out` (int32, or None)
    supplies the row tokens with row_src >= 0; `media` (model/multimodal.py) brings vision
    embeddings, MRoPE positions and deepstack features (None: text only, today's exact path).
    Returns the f32 logits of the 1 + B sampled rows (row 0: after the chunk's last real token,
    meaningless when C == 0) and the caches. `mesh` (static): the tensor-parallel mesh the
    params and caches are placed on (model/tensor_parallel.py), or None on one device.
    `taps` (static layer indexes) adds a third result: the residual stream after each of
    those layers, concatenated [C + B, len(taps) * H] (the DFlash drafters' context,
    model/dflash.py)."""
    x, kv, tapped = _forward(params, kv, batch, ragged_batch.step_tokens(batch, prev_out),
                             config, page_size, mesh, media, taps)
    logits = ragged_batch.sampled_logits(x, batch, lambda rows: _logits(params, rows, config))
    return (logits, kv, tapped) if taps else (logits, kv)


def prefill(params, kv, tokens, start, num_tokens, page_table, *, config: ModelConfig,
            page_size: int, mesh=None, media: MediaRows | None = None):
    """One chunk of one sequence at positions start..start+T-1. Rows >= num_tokens are padding:
    their KV goes to the dummy page and their outputs are ignored. `media` as in `ragged`.
    Returns the f32 logits of the last real token and the updated caches."""
    batch = ragged_batch.chunk_only(tokens, start, num_tokens, page_table)
    x, kv, _ = _forward(params, kv, batch, ragged_batch.step_tokens(batch), config, page_size,
                        mesh, media)
    return _logits(params, jnp.take(x, num_tokens - 1, axis=0), config), kv


def decode(params, kv, tokens, positions, page_tables, *, config: ModelConfig, page_size: int,
           mesh=None):
    """One new token per row. Padding rows carry DUMMY_PAGE page tables (and position 0), so
    their cache writes land in the dummy page. Returns f32 logits [B, V] and the caches."""
    batch = ragged_batch.rows_only(tokens, positions, page_tables)
    x, kv, _ = _forward(params, kv, batch, ragged_batch.step_tokens(batch), config, page_size,
                        mesh)
    return _logits(params, x, config), kv


def _forward(params, kv, batch, tokens, config: ModelConfig, page_size: int, mesh=None,
             media: MediaRows | None = None, taps: tuple[int, ...] = ()):
    """The decoder over the step's C + B rows `tokens`; returns the final residual [N, H],
    the caches and the residual after each layer in `taps`, concatenated (None without)."""
    attend = tensor_parallel.attention_op(batch, scale=config.head_dim ** -0.5, mesh=mesh)
    groups = tensor_parallel.num_groups(mesh)
    inv_freq = rope_inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    x = embed(params["embed"], tokens)
    slots = ragged_batch.step_slots(batch, page_size)
    if media is None:
        rope = rope_tables(ragged_batch.step_positions(batch), inv_freq)
        return _layers(params, kv, x, rope, slots, attend, config, groups, taps=taps)
    axes = frequency_axes(config.mrope_section, config.head_dim // 2)
    rope = mrope_tables(media.rope_positions, inv_freq, axes)
    deepstack = multimodal.deepstack_rows(media, x.shape[0])
    return _layers(params, kv, multimodal.chunk_embeddings(x, media), rope, slots, attend,
                   config, groups, deepstack, taps)


def _layers(params, kv, x, rope, slots, attend, config: ModelConfig, groups: int,
            deepstack=None, taps: tuple[int, ...] = ()):
    """Run every decoder layer over rows x [N, H] with rotary tables `rope` (cos, sin), adding
    deepstack[i] [N, H] after layer i when given; returns the final residual, the new caches
    and the residual after each layer in `taps`, concatenated (None without)."""
    cos, sin = rope
    eps, layers = config.rms_norm_eps, params["layers"]
    new_kv, tapped = [], {}
    h = rms_norm(x, layers[0]["attn_norm"], eps)
    for index, (layer, cache) in enumerate(zip(layers, kv)):
        attn_out, cache = _attention(h, layer, cache, cos, sin, slots, attend, config, groups)
        x, h = add_rms_norm(x, attn_out, layer["mlp_norm"], eps)
        x, h = add_then_next_norm(
            x, swiglu_mlp(h, layer, groups),
            layers[index + 1]["attn_norm"] if index + 1 < len(layers) else None, eps,
            extra=deepstack[index] if deepstack is not None and index < deepstack.shape[0]
            else None)
        new_kv.append(cache)
        if index in taps:
            tapped[index] = x
    return x, new_kv, (jnp.concatenate([tapped[i] for i in taps], axis=-1) if taps else None)


def _attention(h, layer, cache, cos, sin, slots, attend, config: ModelConfig, groups: int):
    """GQA self-attention of rows h [N, H]: project, (qwen3) per-head norm, rotate, store the
    new K/V at `slots`, attend over the paged cache, project back."""
    N, NH, NK, D = h.shape[0], config.num_heads, config.num_kv_heads, config.head_dim
    if "wqkv" in layer:
        qkv = linear(h, layer["wqkv"])
        if groups == 1:
            norms = (layer["q_norm"], layer["k_norm"]) if config.qk_norm else (None, None)
            fused = attend.from_qkv(qkv, *norms, cos, sin, cache, slots, num_heads=NH,
                                    num_kv_heads=NK, eps=config.rms_norm_eps)
            if fused is not None:
                out, cache = fused
                return linear(out.reshape(N, NH * D), layer["wo"]), cache
        q, k, v = tensor_parallel.split_fused(qkv, (NH * D, NK * D, NK * D), groups)
    else:
        q, k, v = (linear(h, layer[name]) for name in ("wq", "wk", "wv"))
    q, k, v = q.reshape(N, NH, D), k.reshape(N, NK, D), v.reshape(N, NK, D)
    if config.qk_norm:
        q = rms_norm(q, layer["q_norm"], config.rms_norm_eps)
        k = rms_norm(k, layer["k_norm"], config.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out, cache = attend(q, k, v, cache, slots)
    return linear(out.reshape(N, NH * D), layer["wo"]), cache


def _logits(params, x, config: ModelConfig):
    """Final norm and the (tied or untied) output projection, in f32."""
    h = rms_norm(x, params["final_norm"], config.rms_norm_eps)
    head = tied_head(params["embed"]) if config.tie_word_embeddings else params["lm_head"]
    return linear(h, head, out_dtype=jnp.float32).astype(jnp.float32)


def cache_shapes(config: ModelConfig, *, num_pages: int, page_size: int, num_state_slots: int,
                 dtype, kv_dtype, dflash_drafts: int = 0, dflash_config=None):
    """The caches' jax.ShapeDtypeStructs: one (k, v) pair per layer. Dense families have no
    recurrent state, so the compute `dtype` is unused. `dflash_drafts` K > 0 appends one
    (k, v) per layer of the drafter `dflash_config` and the draft store (model/dflash.py:
    draft_q f32 [num_state_slots, K, V], the proposal q of each sequence's pending drafts;
    under a drafter the runner gives dense sequences slots that hold this store only)."""
    del dtype
    specs = paged_attention.cache_specs(num_pages, page_size, config.num_kv_heads,
                                        config.head_dim, kv_dtype)
    caches = [specs for _ in range(config.num_layers)]
    if not dflash_drafts:
        return caches
    store = {"draft_q": jax.ShapeDtypeStruct((num_state_slots, dflash_drafts,
                                              config.vocab_size), jnp.float32)}
    return caches + dflash.cache_shapes(dflash_config, num_pages=num_pages,
                                        page_size=page_size, kv_dtype=kv_dtype) + [store]


def init_caches(config: ModelConfig, **sizes):
    """Zeroed caches shaped by `cache_shapes` (same keyword arguments)."""
    return jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype),
                        cache_shapes(config, **sizes))
