"""The Mamba-2 mixer, Nemotron-H's "mamba" layer, over one ragged step.

Per token: in_proj -> z [I] | xBC [conv_dim] | dt [Hm]; causal depthwise conv (K taps, with
bias) over xBC, then SiLU, split into x [Hm, P], B, C [G, N]; dt = clamp(softplus(dt +
dt_bias)); the SSD scan (kernels/mamba2) with A = -exp(A_log) and the D skip gives y [Hm, P];
y * silu(z) is RMS-normalised in G groups of I / G channels (mamba_norm: gate before norm,
transformers' NemotronHRMSNormGated) and projected by `out`.

State (one layer's entry of the cache list, S state slots, slot 0 = DUMMY_STATE_SLOT):
    conv       [S, K-1, conv_dim]  the last K-1 conv inputs, oldest first (compute dtype)
    recurrent  [S, Hm, P, N]       the SSM state (float32)
The chunk region reads slot `chunk_state_slot` (or a zero state at chunk_start 0) and writes
back the state after its last real token; row token i reads and writes row_state_slots[i],
as model/gated_deltanet.py does (rows are independent sequences).
Shape letters: N rows of the step (C chunk tokens + B row tokens), H hidden, I = Hm * P.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import mamba2
from ninfer_jax.model import causal_conv, ragged_batch
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.layers import linear


def mamba2_mixer(h, layer, state: dict, batch: ragged_batch.RaggedBatch, config: ModelConfig):
    """h [N, H] -> (out [N, H], the layer's updated state dict)."""
    inner, conv_dim = config.mamba_num_heads * config.mamba_head_dim, config.mamba_conv_dim
    projected = linear(h, layer["in_proj"])
    z, xbc, dt = (projected[:, :inner], projected[:, inner:inner + conv_dim],
                  projected[:, inner + conv_dim:])
    dt = jax.nn.softplus(dt.astype(jnp.float32) + layer["dt_bias"].astype(jnp.float32))
    dt = jnp.clip(dt, config.mamba_dt_min, config.mamba_dt_max or None)
    ssm = {"A": -jnp.exp(layer["A_log"].astype(jnp.float32)), "D": layer["D"]}
    C = ragged_batch.num_chunk_tokens(batch)
    conv, recurrent, outputs = state["conv"], state["recurrent"], []
    if C:
        y, conv, recurrent = _chunk(xbc[:C], dt[:C], layer, ssm, conv, recurrent, batch,
                                    config)
        outputs.append(y)
    if h.shape[0] > C:
        y, conv, recurrent = _rows(xbc[C:], dt[C:], layer, ssm, conv, recurrent,
                                   batch.row_state_slots, config)
        outputs.append(y)
    y = jnp.concatenate(outputs).reshape(h.shape[0], inner)
    normed = _gated_group_norm(y, z, layer["mamba_norm"], config).astype(h.dtype)
    return linear(normed, layer["out"]), {"conv": conv, "recurrent": recurrent}


def _chunk(xbc, dt, layer, ssm, conv, recurrent, batch, config: ModelConfig):
    """The chunk's C tokens from its slot's state (zero at chunk_start 0); the slot receives
    the state after token chunk_len - 1."""
    slot = batch.chunk_state_slot
    start_state = jnp.where(batch.chunk_start > 0, recurrent[slot], 0.0)
    conv_out, conv = causal_conv.chunk_conv(xbc, layer["conv"], conv, batch)
    x, B, C = _split(_activate(conv_out, layer, xbc.dtype), config)
    y, new_state = mamba2.chunk_ssd(x, dt, ssm["A"], B, C, ssm["D"], start_state,
                                    batch.chunk_len)
    return y, conv, recurrent.at[slot].set(new_state)


def _rows(xbc, dt, layer, ssm, conv, recurrent, slots, config: ModelConfig):
    """R independent one-token steps, row i on state slot slots[i]."""
    conv_out, conv = causal_conv.rows_conv(xbc, layer["conv"], conv, slots)
    x, B, C = _split(_activate(conv_out, layer, xbc.dtype), config)
    y, new_states = mamba2.ssd_step(x, dt, ssm["A"], B, C, ssm["D"], recurrent[slots])
    return y, conv, recurrent.at[slots].set(new_states)


def _activate(conv_out, layer, dtype):
    return jax.nn.silu(conv_out + layer["conv_bias"].astype(jnp.float32)).astype(dtype)


def _split(xbc, config: ModelConfig):
    """Conv outputs [N, conv_dim] -> x [N, Hm, P], B, C [N, G, N_s]."""
    N, G, Ns = xbc.shape[0], config.mamba_num_groups, config.mamba_state_size
    inner = config.mamba_num_heads * config.mamba_head_dim
    x = xbc[:, :inner].reshape(N, config.mamba_num_heads, config.mamba_head_dim)
    B = xbc[:, inner:inner + G * Ns].reshape(N, G, Ns)
    return x, B, xbc[:, inner + G * Ns:].reshape(N, G, Ns)


def _gated_group_norm(y, z, weight, config: ModelConfig):
    """RMSNorm of y * silu(z) [N, I] over G groups of I / G channels, times weight; f32."""
    N, G = y.shape[0], config.mamba_num_groups
    gated = y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))
    grouped = gated.reshape(N, G, -1)
    normed = grouped * jax.lax.rsqrt(jnp.mean(grouped * grouped, axis=-1, keepdims=True)
                                     + config.rms_norm_eps)
    return normed.reshape(N, -1) * weight.astype(jnp.float32)
