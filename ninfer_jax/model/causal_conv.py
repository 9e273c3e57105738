"""The causal depthwise conv of the recurrent layers (Gated DeltaNet, Mamba-2), with its state.

A layer's conv state per state slot is the last K-1 inputs [K-1, D] (the history a K-tap conv
needs); weights are [K, D], tap K-1 on the current input. Products in float32. A prefill
chunk starts from its slot's history (zero at chunk_start 0) and leaves there the K-1 inputs
before token chunk_len, so padding tokens never enter the state; a decode row reads and
writes its own slot.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def chunk_conv(x, weight, conv, batch):
    """x [C, D] of the step's chunk -> (conv output [C, D] float32, conv with the chunk's
    slot updated)."""
    slot = batch.chunk_state_slot
    history = jnp.where(batch.chunk_start > 0, conv[slot], 0).astype(x.dtype)
    window = jnp.concatenate([history, x])  # [K-1+C, D]: history, then the chunk
    taps = weight.shape[0]
    out = sum(window[j:j + x.shape[0]].astype(jnp.float32) * weight[j].astype(jnp.float32)
              for j in range(taps))
    new_history = jax.lax.dynamic_slice_in_dim(window, batch.chunk_len, taps - 1)
    return out, conv.at[slot].set(new_history.astype(conv.dtype))


def rows_conv(x, weight, conv, slots):
    """x [R, D], one token per row on state slot slots[i] -> (conv output [R, D] float32,
    conv with each row's slot updated)."""
    window = jnp.concatenate([conv[slots].astype(x.dtype), x[:, None]], axis=1)
    out = jnp.einsum("rkc,kc->rc", window.astype(jnp.float32), weight.astype(jnp.float32))
    # Padding rows all write slot 0 (DUMMY_STATE_SLOT); which of them lands is irrelevant.
    return out, conv.at[slots].set(window[:, 1:].astype(conv.dtype))
