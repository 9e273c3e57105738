"""The Gemma 4 text family `gemma4` as pure steps over paged KV.

    ragged(params, kv, batch: RaggedBatch, prev_out) -> (logits[1 + B, V], kv)
    prefill(params, kv, tokens[T], start, num_tokens, page_table[W], state_slot)
                                                     -> (logits_last[V], kv)
    decode(params, kv, tokens[B], positions[B], page_tables[B, W], state_slots[B])
                                                     -> (logits[B, V], kv)

The contract of model/llama.py. What Gemma 4 adds (params: model/config.py):
- layers interleave sliding-window attention (a query sees its last `sliding_window` keys,
  RoPE over the whole head with `rope_theta`) and full attention (head dim and kv heads of
  their own, "proportional" RoPE: only the first partial_rotary_factor of the frequency pairs
  turn, with exponents over the full head dim, base `global_rope_theta`);
- q, k and v are RMS-normalised per head (v without a weight), and attention is unscaled
  (the q norm takes the place of 1/sqrt(D)); full layers with attention_k_eq_v use the raw key
  projection as values;
- every sub-block is wrapped in two plain RMSNorms (before, and on its output before the
  residual add); the MLP is gelu(tanh)-gated; each layer ends by scaling its residual by
  layer_scalar;
- per-layer inputs (P > 0): a second embedding table and a projection of the scaled token
  embedding give every layer a P-wide input, gated into the residual after the MLP;
- the last num_kv_shared_layers layers write no KV: each attends over the cache of the last
  earlier layer of its type (config.kv_source_layer), so `kv` holds one (k, v) pair per
  config.cache_layers() entry, each shaped for its layer's kv heads and head dim;
- embeddings are scaled by sqrt(H), the LM head is tied, logits are soft-capped.

Caches: the full layers' (k, v) are paged (paged_attention.cache_specs over the pool's pages,
the sequence's page table), so they grow with the sequence. A sliding layer needs only its
window, so its KV lives in a ring per state slot (engine/state_slots.py; every sequence holds
one while resident, as the hybrids' recurrent state): {"k", "v"} each [S, R, NK, page, D]
(or ScaledPages of that shape), R = config.ring_pages(page_size, step_tokens) pages, where
step_tokens bounds the tokens one sequence adds in a step (the largest chunk, or its verify
rows). Position p is stored at ring token p mod R*page: the view of the rings as pages
[S*R, NK, page, D] with a synthesised table (logical page j -> slot*R + j mod R) is an
ordinary paged cache for write_kv and the attention, and since R*page >= window + step_tokens
- 1, every key a query of the step may see is still there when it attends (a position that
overwrote it is more than the window ahead of every query); older keys alias newer ones but
are masked by position. The ring follows the state-slot invariant (it holds what the
sequence's first num_computed tokens left), so pause snapshots, prefix checkpoints and slot
copies carry it like a recurrent state, and memory for sliding layers is O(window) per lane,
whatever the context.
Shape letters: N rows of a step, NH query heads, NK kv heads, D head dim, L layers, P
per-layer input width, W page-table width.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.kernels import paged_attention, ragged_attention
from ninfer_jax.model import ragged_batch
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.layers import (apply_rope, embed, linear, rms_norm, rope_inverse_frequencies,
                                     rope_tables, tied_head)


def ragged(params, kv, batch: ragged_batch.RaggedBatch, prev_out, *, config: ModelConfig,
           page_size: int):
    """One ragged step (see llama.ragged): the f32 logits of the 1 + B sampled rows and the
    caches."""
    x, kv = _forward(params, kv, batch, ragged_batch.step_tokens(batch, prev_out), config,
                     page_size)
    return ragged_batch.sampled_logits(x, batch, lambda rows: _logits(params, rows, config)), kv


def prefill(params, kv, tokens, start, num_tokens, page_table, state_slot=None, *,
            config: ModelConfig, page_size: int):
    """One chunk of one sequence (see llama.prefill) on state slot `state_slot` (int32 [],
    its sliding rings): logits of the last real token."""
    batch = dataclasses.replace(ragged_batch.chunk_only(tokens, start, num_tokens, page_table),
                                chunk_state_slot=state_slot,
                                row_state_slots=jnp.zeros(0, jnp.int32))
    x, kv = _forward(params, kv, batch, ragged_batch.step_tokens(batch), config, page_size)
    return _logits(params, jnp.take(x, num_tokens - 1, axis=0), config), kv


def decode(params, kv, tokens, positions, page_tables, state_slots=None, *,
           config: ModelConfig, page_size: int):
    """One new token per row (see llama.decode), row i's rings in state_slots[i] (padding
    rows: slot 0): f32 logits [B, V] and the caches."""
    batch = dataclasses.replace(ragged_batch.rows_only(tokens, positions, page_tables),
                                chunk_state_slot=jnp.int32(ragged_batch.DUMMY_STATE_SLOT),
                                row_state_slots=state_slots)
    x, kv = _forward(params, kv, batch, ragged_batch.step_tokens(batch), config, page_size)
    return _logits(params, x, config), kv


def _forward(params, kv, batch, tokens, config: ModelConfig, page_size: int):
    """The decoder over the step's rows `tokens`; returns the final residual [N, H]."""
    positions = ragged_batch.step_positions(batch)
    ropes = {kind: rope_tables(positions, inv_freq)
             for kind, inv_freq in _inverse_frequencies(config).items()}
    caches = dict(zip(config.cache_layers(), kv))
    rings = config.ring_layers()
    paged = _addressing(batch, page_size, window=None)
    if rings:
        ring_pages = jax.tree.leaves(caches[rings[0]])[0].shape[1]
        ringed = _addressing(_ring_batch(batch, ring_pages), page_size,
                             window=config.sliding_window)
        caches.update({i: _ring_view(caches[i]) for i in rings})
    x = embed(params["embed"], tokens)
    x = x * jnp.asarray(config.hidden_size ** 0.5, x.dtype)
    per_layer = _per_layer_inputs(params, tokens, x, config)
    for i, layer in enumerate(params["layers"]):
        kind = config.layer_types[i]
        h = rms_norm(x, layer["attn_norm"], config.rms_norm_eps)
        source = config.kv_source_layer(i)
        slots, attend = ringed if source in rings else paged
        attn_out, cache = _attention(h, layer, caches[source], ropes[kind], slots, attend,
                                     writes=source == i, config=config, index=i)
        caches[source] = cache
        x = x + rms_norm(attn_out, layer["post_attn_norm"], config.rms_norm_eps)
        h = _gelu_mlp(rms_norm(x, layer["mlp_norm"], config.rms_norm_eps), layer)
        x = x + rms_norm(h, layer["post_mlp_norm"], config.rms_norm_eps)
        if per_layer is not None:
            x = x + _per_layer_block(x, layer, per_layer[:, i], config)
        x = x * layer["layer_scalar"].astype(x.dtype)
    caches.update({i: _ring_of(caches[i], ring_pages) for i in rings})
    return x, [caches[i] for i in config.cache_layers()]


def _addressing(batch, page_size: int, *, window: int | None):
    """(flat write slots [N], the attention over a cache) for the step's tables in `batch`."""
    attend = functools.partial(
        ragged_attention.ragged_paged_attention, chunk_table=batch.chunk_table,
        chunk_start=batch.chunk_start, row_tables=batch.row_tables,
        row_lengths=batch.row_positions + 1, scale=1.0,
        num_chunk_tokens=ragged_batch.num_chunk_tokens(batch), window=window)
    return ragged_batch.step_slots(batch, page_size), attend


def _ring_batch(batch, ring_pages: int):
    """`batch` with each sequence's table replaced by its ring's: logical page j of the
    sequence in slot s is page s*R + j mod R of the ring view (padding: slot 0's ring)."""
    if batch.row_state_slots is None or (ragged_batch.num_chunk_tokens(batch)
                                         and batch.chunk_state_slot is None):
        raise ValueError("gemma4's sliding layers need the batch's state slots")
    logical = jnp.arange(batch.chunk_table.shape[0], dtype=jnp.int32) % ring_pages
    chunk_slot = (batch.chunk_state_slot if batch.chunk_state_slot is not None
                  else ragged_batch.DUMMY_STATE_SLOT)
    rows = jnp.asarray(batch.row_state_slots, jnp.int32)
    return dataclasses.replace(batch, chunk_table=chunk_slot * ring_pages + logical,
                               row_tables=rows[:, None] * ring_pages + logical[None])


def _ring_view(ring):
    """A layer's rings {"k", "v"} [S, R, ...] as one (k, v) paged cache [S*R, ...]."""
    return tuple(jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), ring[name])
                 for name in ("k", "v"))


def _ring_of(view, ring_pages: int):
    """Inverse of _ring_view."""
    return {name: jax.tree.map(lambda a: a.reshape(-1, ring_pages, *a.shape[1:]), cache)
            for name, cache in zip(("k", "v"), view)}


def _inverse_frequencies(config: ModelConfig) -> dict[str, np.ndarray]:
    """Per layer type the D/2 rotary frequencies: the sliding layers' plain RoPE, the full
    layers' proportional RoPE (unturned pairs get frequency 0, so they pass through)."""
    out = {}
    if "sliding_attention" in config.layer_types:
        out["sliding_attention"] = rope_inverse_frequencies(
            config.head_dim, config.rope_theta, None)
    if "full_attention" in config.layer_types:
        D = config.global_head_dim or config.head_dim
        turned = int(config.partial_rotary_factor * D // 2)
        exponents = np.arange(0, 2 * turned, 2, dtype=np.float64) / D
        inv_freq = np.zeros(D // 2, np.float64)
        inv_freq[:turned] = 1.0 / (config.global_rope_theta or config.rope_theta) ** exponents
        out["full_attention"] = inv_freq.astype(np.float32)
    return out


def _attention(h, layer, cache, rope, slots, attend, *, writes: bool, config: ModelConfig,
               index: int):
    """Attention of rows h [N, H]: normed q (and, when the layer writes its cache, normed k
    and v), RoPE, K/V stored at `slots`, attention over the (own or source) cache."""
    N, NH = h.shape[0], config.num_heads
    D, NK = config.layer_head_dim(index), config.layer_kv_heads(index)
    eps = config.rms_norm_eps
    q = rms_norm(linear(h, layer["wq"]).reshape(N, NH, D), layer["q_norm"], eps)
    q = apply_rope(q, *rope)
    k_cache, v_cache = cache
    if writes:
        k = linear(h, layer["wk"]).reshape(N, NK, D)
        v = linear(h, layer["wv"]).reshape(N, NK, D) if "wv" in layer else k
        k = apply_rope(rms_norm(k, layer["k_norm"], eps), *rope)
        v = rms_norm(v, jnp.ones((D,), jnp.float32), eps)
        k_cache, v_cache = paged_attention.write_kv(k_cache, v_cache, k, v, slots)
    out = attend(q, k_cache, v_cache)
    return linear(out.reshape(N, NH * D), layer["wo"]), (k_cache, v_cache)


def _gelu_mlp(x, layer):
    """down(gelu_tanh(gate(x)) * up(x))."""
    gate, up = linear(x, layer["w_gate"]), linear(x, layer["w_up"])
    return linear(jax.nn.gelu(gate, approximate=True) * up, layer["w_down"])


def _per_layer_inputs(params, tokens, x, config: ModelConfig):
    """[N, L, P]: the per-layer token embedding (scaled by sqrt(P)) plus the normed projection
    of the scaled embedding x (scaled by 1/sqrt(H)), over sqrt(2); None without them."""
    P, L = config.hidden_size_per_layer_input, config.num_layers
    if not P:
        return None
    N, eps = x.shape[0], config.rms_norm_eps
    own = embed(params["ple_embed"], tokens)
    own = (own * jnp.asarray(P ** 0.5, own.dtype)).reshape(N, L, P)
    projected = linear(x, params["ple_model_proj"]) * jnp.asarray(
        config.hidden_size ** -0.5, x.dtype)
    projected = rms_norm(projected.reshape(N, L, P), params["ple_proj_norm"], eps)
    return (projected + own.astype(x.dtype)) * jnp.asarray(2 ** -0.5, x.dtype)


def _per_layer_block(x, layer, per_layer, config: ModelConfig):
    """The residual update of one layer's per-layer input per_layer [N, P]."""
    gated = jax.nn.gelu(linear(x, layer["ple_gate"]), approximate=True) * per_layer
    return rms_norm(linear(gated, layer["ple_proj"]), layer["ple_norm"], config.rms_norm_eps)


def _logits(params, x, config: ModelConfig):
    """Final norm, the tied output projection and the soft cap, in f32."""
    h = rms_norm(x, params["final_norm"], config.rms_norm_eps)
    head = tied_head(params["embed"]) if config.tie_word_embeddings else params["lm_head"]
    logits = linear(h, head, out_dtype=jnp.float32).astype(jnp.float32)
    cap = config.final_logit_softcapping
    return cap * jnp.tanh(logits / cap) if cap > 0 else logits


def cache_shapes(config: ModelConfig, *, num_pages: int, page_size: int, num_state_slots: int,
                 dtype, kv_dtype, step_tokens: int = 0):
    """Per cache layer (config.cache_layers()), for its kv heads and head dim: the paged
    (k, v) of a full layer, the rings {"k", "v"} of a sliding one (see the module docstring;
    `step_tokens` sizes them and is needed only with sliding layers)."""
    del dtype
    rings = config.ring_layers()
    if rings and (num_state_slots < 1 or step_tokens < 1):
        raise ValueError("gemma4's sliding layers need state slots and step_tokens >= 1")
    ring_pages = config.ring_pages(page_size, step_tokens) if rings else 0
    specs = []
    for i in config.cache_layers():
        NK, D = config.layer_kv_heads(i), config.layer_head_dim(i)
        if i not in rings:
            specs.append(paged_attention.cache_specs(num_pages, page_size, NK, D, kv_dtype))
            continue
        flat = paged_attention.cache_specs(num_state_slots * ring_pages, page_size, NK, D,
                                           kv_dtype)
        k_spec, v_spec = jax.tree.map(lambda s: jax.ShapeDtypeStruct(
            (num_state_slots, ring_pages, *s.shape[1:]), s.dtype), flat)
        specs.append({"k": k_spec, "v": v_spec})
    return specs


def init_caches(config: ModelConfig, **sizes):
    """Zeroed caches shaped by `cache_shapes` (same keyword arguments)."""
    return jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype),
                        cache_shapes(config, **sizes))
