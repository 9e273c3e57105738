"""The gated delta rule (Gated DeltaNet's recurrence): chunked prefill, one-token decode and the
per-token scan, dispatched at trace time (kernels/dispatch.py).

The pure-jnp reference (reference.py) is the CPU path and the oracle. On a GPU the decode
rows' update runs the Pallas kernel of kernel.py (one pass over each row's state, in place);
the chunked prefill has no kernel yet.
"""
from __future__ import annotations

from ninfer_jax.kernels.dispatch import use_kernels
from ninfer_jax.kernels.gated_delta import reference
from ninfer_jax.kernels.gated_delta.reference import CHUNK_SIZE  # noqa: F401


def chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens):
    """One sequence's chunk of T tokens from `initial_state`; see reference.chunk_gated_delta."""
    return reference.chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens)


def gated_delta_step(q, k, v, g, beta, states):
    """One token for each of B rows, each with its own state; see reference.gated_delta_step."""
    return reference.gated_delta_step(q, k, v, g, beta, states)


def gated_delta_rows(q, k, v, g, beta, recurrent, slots):
    """One token for each of B rows, row i's state in slot slots[i] of `recurrent`, updated
    there; see reference.gated_delta_rows."""
    if use_kernels():
        from ninfer_jax.kernels.gated_delta import kernel

        result = kernel.gated_delta_rows(q, k, v, g, beta, recurrent, slots)
        if result is not None:
            return result
    return reference.gated_delta_rows(q, k, v, g, beta, recurrent, slots)
