"""The gated delta rule (Gated DeltaNet's recurrence): chunked prefill, one-token decode and the
per-token scan, dispatched at trace time (kernels/dispatch.py).

Only the pure-jnp reference exists so far (reference.py, the CPU path and the oracle); a GPU
kernel with the same signatures plugs in here behind `use_kernels()`.
"""
from __future__ import annotations

from ninfer_jax.kernels.gated_delta import reference
from ninfer_jax.kernels.gated_delta.reference import CHUNK_SIZE  # noqa: F401


def chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens):
    """One sequence's chunk of T tokens from `initial_state`; see reference.chunk_gated_delta."""
    return reference.chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens)


def gated_delta_step(q, k, v, g, beta, states):
    """One token for each of B rows, each with its own state; see reference.gated_delta_step."""
    return reference.gated_delta_step(q, k, v, g, beta, states)
