"""Mamba-2's selective state space scan (SSD): chunked prefill and one-token decode, dispatched
at trace time like kernels/gated_delta.

Only the pure-jnp reference exists (reference.py, the CPU path and the oracle); a GPU kernel
with the same signatures plugs in here behind `use_kernels()`.
"""
from __future__ import annotations

from ninfer_jax.kernels.mamba2 import reference
from ninfer_jax.kernels.mamba2.reference import CHUNK_SIZE  # noqa: F401


def chunk_ssd(x, dt, A, B, C, D, initial_state, num_tokens):
    """One sequence's chunk of T tokens from `initial_state`; see reference.chunk_ssd."""
    return reference.chunk_ssd(x, dt, A, B, C, D, initial_state, num_tokens)


def ssd_step(x, dt, A, B, C, D, states):
    """One token for each of B rows, each with its own state; see reference.ssd_step."""
    return reference.ssd_step(x, dt, A, B, C, D, states)
