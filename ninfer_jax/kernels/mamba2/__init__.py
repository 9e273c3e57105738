"""Mamba-2's selective state space scan (SSD): chunked prefill and one-token decode.

The pure-jnp reference (reference.py) runs on every backend. kernel.py holds the chunked
prefill as a Pallas (Triton) kernel with the same contract, equal to the scan in interpret mode
(tests/kernels/test_mamba2.py) but not yet run on a GPU: it joins the dispatch
(kernels/dispatch.py `use_kernels()`, as kernels/moe does) once
benchmarks/mamba2_scan_bench.py has checked and timed it natively. The one-token step is
elementwise work plus a [P, N] x [N] product per head, which XLA fuses well: reference only.
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
