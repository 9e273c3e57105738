"""Mamba-2's selective state space scan (SSD): chunked prefill and one-token decode, dispatched
at trace time (kernels/dispatch.py) like kernels/gated_delta.

The chunked prefill runs the Pallas kernel (kernel.py) on the GPU when its dims tile, the
pure-jnp reference (reference.py, the CPU path and the oracle) otherwise; the one-token step
is elementwise work plus a [P, N] x [N] product per head, which XLA fuses well, so it has only
the reference.
"""
from __future__ import annotations

from ninfer_jax.kernels.dispatch import use_kernels
from ninfer_jax.kernels.mamba2 import reference
from ninfer_jax.kernels.mamba2.reference import CHUNK_SIZE  # noqa: F401


def chunk_ssd(x, dt, A, B, C, D, initial_state, num_tokens):
    """One sequence's chunk of T tokens from `initial_state`; see reference.chunk_ssd."""
    if use_kernels():
        from ninfer_jax.kernels.mamba2 import kernel

        out = kernel.chunk_ssd(x, dt, A, B, C, D, initial_state, num_tokens)
        if out is not None:
            return out
    return reference.chunk_ssd(x, dt, A, B, C, D, initial_state, num_tokens)


def ssd_step(x, dt, A, B, C, D, states):
    """One token for each of B rows, each with its own state; see reference.ssd_step."""
    return reference.ssd_step(x, dt, A, B, C, D, states)
