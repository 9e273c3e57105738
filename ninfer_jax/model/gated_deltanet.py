"""Gated DeltaNet, the "linear_attention" layer of the hybrid families, over one ragged step.

Per token: in_qkv -> causal depthwise conv (K taps) -> SiLU -> q, k [Hk, dk], v [Hv, dv];
q and k L2-normalised (q also scaled by dk^-0.5), beta = sigmoid(b),
g = -exp(A_log) * softplus(a + dt_bias); the gated delta rule (kernels/gated_delta) turns them
into o [Hv, dv]; o is RMS-normalised per head with the plain weight gdn_norm, gated by silu(z),
and projected by `out`.

State (one layer's entry of the cache list, S state slots, slot 0 = DUMMY_STATE_SLOT):
    conv       [S, K-1, conv_dim]  the last K-1 conv inputs, oldest first (compute dtype)
    recurrent  [S, Hv, dk, dv]     the delta-rule state (float32)
The chunk region (one sequence) reads slot `chunk_state_slot` (or a zero state when
chunk_start == 0) and writes back the state after its last real token; each row token reads
and writes `row_state_slots[i]`. With `batch.chained_rows` (speculative verify on a hybrid
model) consecutive rows on the same slot are consecutive tokens of one sequence: each row
continues the state its predecessor left, the slot is not written, and the layer returns
every row's state as `row_conv` / `row_recurrent` for the step to write the accepted one
(hybrid.settle_rows) once the rows' tokens are sampled.
Shape letters: N = C + B rows, C chunk tokens, B row tokens, H hidden, D_c conv channels.
"""
from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import gated_delta
from ninfer_jax.model import causal_conv, ragged_batch, tensor_parallel
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.layers import linear, split_columns


def gated_deltanet(h, layer, state: dict, batch: ragged_batch.RaggedBatch, config: ModelConfig,
                   mesh=None):
    """h [N, H] -> (out [N, H], the layer's updated state dict). With a tensor-parallel
    `mesh` the layer holds `in_qkv_grouped` / `conv_grouped` (Q | K | V channels ordered per
    shard, model/tensor_parallel.py) and the conv and delta rule run per shard on its heads
    and state slots' columns (shard_map)."""
    N = h.shape[0]
    Hv, dv = config.linear_num_value_heads, config.linear_value_head_dim
    grouped = "in_qkv_grouped" in layer
    if "in_qkvzba" in layer:  # one product for the four (model/fused_projections.py)
        projected = linear(h, layer["in_qkvzba"])
        mixed, z, b, a = split_columns(projected, (config.linear_conv_dim, Hv * dv, Hv, Hv))
        if mesh is None:  # the conv reads its D_c columns in place (_core)
            mixed = projected
    else:
        mixed = linear(h, layer["in_qkv_grouped" if grouped else "in_qkv"])  # [N, D_c]
        z, b, a = (linear(h, layer[name]) for name in ("in_z", "in_b", "in_a"))
    conv_weight = layer["conv_grouped" if grouped else "conv"]
    decay = (layer["A_log"], layer["dt_bias"])
    # [N, Hv, 2]; None: _core takes each part's gates from mixed's b | a columns (the decode
    # rows' fused kernel computes them itself, so a decode step has no fusion for them)
    gates = None if "in_qkvzba" in layer and mesh is None else gated_delta.decay_gates(
        b, a, *decay)
    slots = {"chunk_state_slot": batch.chunk_state_slot, "chunk_start": batch.chunk_start,
             "chunk_len": batch.chunk_len, "row_state_slots": batch.row_state_slots}
    core_fn = functools.partial(_core, num_chunk=ragged_batch.num_chunk_tokens(batch),
                                config=config, chained=batch.chained_rows, decay=decay)
    if mesh is not None:
        if batch.chained_rows:
            raise NotImplementedError("chained verify rows are not built for tensor "
                                      "parallelism")
        size = tensor_parallel.num_groups(mesh)
        local = dataclasses.replace(config, linear_num_key_heads=config.linear_num_key_heads
                                    // size, linear_num_value_heads=Hv // size)
        core_fn = tensor_parallel.per_shard_deltanet(
            functools.partial(_core, num_chunk=ragged_batch.num_chunk_tokens(batch),
                              config=local), mesh)
    core, *new_state = core_fn(mixed, gates, conv_weight, state["conv"],
                               state["recurrent"], slots)
    z = z.reshape(N, Hv, dv)
    normed = gated_rms_norm(core, z, layer["gdn_norm"], config.rms_norm_eps).astype(h.dtype)
    names = ("conv", "recurrent", "row_conv", "row_recurrent")
    return linear(normed.reshape(N, Hv * dv), layer["out"]), dict(zip(names, new_state))


def _core(mixed, gates, conv_weight, conv, recurrent, slots: dict, *, num_chunk: int,
          config: ModelConfig, chained: bool = False, decay=None):
    """The conv and the delta rule of the chunk region, then of the rows: the outputs
    [N, Hv, dv] f32 and the updated conv and recurrent states (`chained`: the rows' states
    are not written but returned, [B, K-1, D_c] and [B, Hv, dk, dv]). The conv's inputs are
    mixed's first D_c columns: the rows' kernel reads them from the fused projection's
    output in place. gates [N, Hv, 2]: the log decay g and beta; None: mixed is the fused
    in_qkvzba output and each part's gates come from its b | a columns and decay =
    (A_log, dt_bias)."""
    C, N, D_c = num_chunk, mixed.shape[0], conv_weight.shape[1]
    batch = types.SimpleNamespace(**slots)

    def gates_of(part):  # [n, Hv, 2] of the rows in the slice `part`
        if gates is not None:
            return gates[part]
        return gated_delta.fused_gates(mixed[part], decay, conv_dim=D_c,
                                       value_heads=config.linear_num_value_heads,
                                       value_head_dim=config.linear_value_head_dim)

    outputs, pending = [], ()
    if C:
        chunk_gates = gates_of(slice(None, C))
        out, conv, recurrent = _chunk(mixed[:C, :D_c], chunk_gates[..., 0],
                                      chunk_gates[..., 1], conv_weight, conv, recurrent, batch,
                                      config)
        outputs.append(out)
    if N > C and chained:
        row_gates = gates_of(slice(C, None))
        out, *pending = _chained_rows(mixed[C:, :D_c], row_gates[..., 0], row_gates[..., 1],
                                      conv_weight, conv, recurrent, batch.row_state_slots,
                                      config)
        outputs.append(out)
    elif N > C:
        out, conv, recurrent = _rows(mixed[C:], None if gates is None else gates[C:], decay,
                                     conv_weight, conv, recurrent, batch.row_state_slots,
                                     config)
        outputs.append(out)
    return jnp.concatenate(outputs), conv, recurrent, *pending


def gated_rms_norm(x, z, weight, eps: float):
    """RMSNorm of x over its last axis with a plain weight, times silu(z); float32."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return normed * weight.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))


def _chunk(mixed, g, beta, conv_weight, conv, recurrent, batch, config: ModelConfig):
    """The chunk's C tokens from its slot's state (zero at chunk_start 0); the slot receives
    the state after token chunk_len - 1."""
    slot = batch.chunk_state_slot
    start_state = jnp.where(batch.chunk_start > 0, recurrent[slot], 0.0)
    conv_out, conv = causal_conv.chunk_conv(mixed, conv_weight, conv, batch)
    q, k, v = _heads(jax.nn.silu(conv_out).astype(mixed.dtype), config)
    out, new_state = gated_delta.chunk_gated_delta(q, k, v, g, beta, start_state,
                                                   batch.chunk_len)
    return out, conv, recurrent.at[slot].set(new_state)


def _rows(mixed, gates, decay, conv_weight, conv, recurrent, slots, config: ModelConfig):
    """B independent one-token steps, row i on state slot slots[i]; padding rows (the dummy
    slot) write no recurrent state (kernels/gated_delta.conv_gated_delta_rows: on a GPU the
    conv, its norms, the gates (gates None) and the rule may be one kernel). Padding rows all
    store their window at slot 0 (DUMMY_STATE_SLOT); which of them lands is irrelevant."""
    out, window, recurrent = gated_delta.conv_gated_delta_rows(
        mixed, conv_weight, conv, gates, recurrent, slots,
        key_heads=config.linear_num_key_heads, decay=decay)
    return out, conv.at[slots].set(window), recurrent


def _chained_rows(mixed, g, beta, conv_weight, conv, recurrent, slots, config: ModelConfig):
    """B row tokens where a row on the same slot as the row before it is the next token of
    that sequence (ragged_batch.chain_depths): every row starts from the state after its
    predecessor, the first of a chain from its slot. Returns the outputs and each row's
    conv window and recurrent state after it; the slots are left as they were.

    The conv window is gathered directly (a row's last K-1 inputs are its chain's rows and
    then its slot's history). The delta rule takes every chain at once in WY form
    (gated_delta.chained_gated_delta: one block-diagonal system, no loop). Its per-row states
    cost B^2 dk dv products; the loop over chain depths it replaced was a device-to-host round
    trip per pass and K + 1 passes over every row's state: 33x a plain step at 8 x 16 rows
    on the 27B shape (run 34)."""
    B, taps = mixed.shape[0], conv_weight.shape[0]
    depth = ragged_batch.chain_depths(slots)  # [B]
    back = taps - 1 - jnp.arange(taps)  # window column j holds the input `back[j]` rows ago
    from_rows = back[None, :] <= depth[:, None]  # [B, taps]
    row_index = jnp.clip(jnp.arange(B)[:, None] - back[None, :], 0, B - 1)
    history = conv[slots].astype(mixed.dtype)  # [B, K-1, D_c], oldest first
    history_index = jnp.clip(taps - 1 - back[None, :] + depth[:, None], 0, taps - 2)
    window = jnp.where(from_rows[..., None], mixed[row_index],
                       jnp.take_along_axis(history, history_index[..., None], axis=1))
    conv_out = jnp.einsum("bkc,kc->bc", window.astype(jnp.float32),
                          conv_weight.astype(jnp.float32))
    q, k, v = _heads(jax.nn.silu(conv_out).astype(mixed.dtype), config)
    out, after = gated_delta.chained_gated_delta(q, k, v, g, beta, recurrent[slots], depth)
    return out, window[:, 1:].astype(conv.dtype), after


def _heads(x, config: ModelConfig):
    """Split conv outputs [N, D_c] into q, k [N, Hk, dk] (f32, L2-normalised, q scaled by
    dk^-0.5) and v [N, Hv, dv]."""
    return gated_delta.split_heads(x, config.linear_num_key_heads, config.linear_key_head_dim,
                                   config.linear_value_head_dim)
