"""The gated delta rule (Gated DeltaNet's recurrence): chunked prefill, one-token decode and the
per-token scan, dispatched at trace time (kernels/dispatch.py).

  reference.py  pure jnp, float32 at HIGHEST: the CPU path and the oracle (per-token scan)
  wy.py         the chunked prefill in WY form, matmul-shaped (blockwise triangular inverse),
                bf16 operands for a bf16 model; any backend
  kernel.py     the same with the chunk-to-chunk walk as a Pallas (Triton) kernel
  rows_kernel.py  a decode batch's one-token update as a Pallas kernel, each row's state
                read and written in place on its slot (gated_delta_rows)
On the GPU a prefill chunk takes GPU_PREFILL's path, the one switch: "kernel" since run 36
(tests/kernels/test_gated_delta_chunked.py passed natively on the H200; one 27B-shape GDN
layer on a 4k chunk: kernel 2.19 ms, WY 3.53, reference 5.64; the delta rule alone 0.46 ms
against the reference's 2.81). NINFER_GDN_PREFILL (kernel | wy | reference) overrides it for
A/B runs; NINFER_FORCE_REFERENCE and CPU backends run the reference. Decode rows
(gated_delta_rows) take the rows kernel on the GPU when GPU_ROWS_KERNEL is on (since run 37:
its native test passed in run 36; decode at 1 / 8 rows +7% / +19% on 4 layers of the 27B
shape, +9% / +23% on the 35B-A3B shape); NINFER_GDN_ROWS_KERNEL=0 takes the reference.
conv_gated_delta_rows starts the decode rows from the conv's inputs: with GPU_FUSED_ROWS (or
NINFER_GDN_FUSED_ROWS=1) and the rows kernel on, one kernel runs the conv, SiLU, the q / k
norms and the rule (rows_kernel.conv_gated_delta_rows); else XLA runs the conv and norms
before gated_delta_rows. On since run 57 (its native tests passed; the 35B-A3B's 2-row step on
an H100 252.2 -> 255.8 tok/s alone, 274.8 with the MoE router kernel; 8 rows 896.8 -> 916.6).
Speculative verify rows chained along a sequence (chained_gated_delta) run in WY form on
every backend. The overrides are part of engine/executable_store.py's key.
"""
from __future__ import annotations

import os

from ninfer_jax.kernels import dispatch
from ninfer_jax.kernels.gated_delta import kernel, reference, rows_kernel, wy
from ninfer_jax.kernels.gated_delta.reference import (CHUNK_SIZE, decay_gates,  # noqa: F401
                                                      fused_gates, split_heads)

GPU_PREFILL = "kernel"
GPU_ROWS_KERNEL = True
GPU_FUSED_ROWS = True
# Whether the fused rows kernel also computes g and beta from the fused projection's b | a
# columns when the model passes no gates (else one XLA fusion makes them first, as before).
# On since its native tests passed (run 64, H100); not yet timed apart (the 35B-A3B's run
# 64b steps had it on in both arms): NINFER_GDN_FUSED_GATES=0 is the A/B's other arm.
GPU_FUSED_GATES = True
FUSED_GATES_ENV = "NINFER_GDN_FUSED_GATES"  # "1" / "0" overrides GPU_FUSED_GATES while tracing
ROWS_ENV = "NINFER_GDN_ROWS_KERNEL"  # "1" / "0" overrides GPU_ROWS_KERNEL while tracing
FUSED_ROWS_ENV = "NINFER_GDN_FUSED_ROWS"  # "1" / "0" overrides GPU_FUSED_ROWS while tracing
PREFILL_ENV = "NINFER_GDN_PREFILL"
PREFILL_PATHS = ("kernel", "wy", "reference")


def prefill_path() -> str:
    """The path a prefill chunk takes when traced now: "reference" off the GPU, else
    NINFER_GDN_PREFILL if set, else GPU_PREFILL."""
    if not dispatch.use_kernels():
        return "reference"
    path = os.environ.get(PREFILL_ENV, "") or GPU_PREFILL
    if path not in PREFILL_PATHS:
        raise ValueError(f"{PREFILL_ENV}={path!r}: expected one of {', '.join(PREFILL_PATHS)}")
    return path


def chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens):
    """One sequence's chunk of T tokens from `initial_state`; see reference.chunk_gated_delta.
    The kernel path falls back to wy.py for head dims that do not tile."""
    path = prefill_path()
    if path == "kernel":
        result = kernel.chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens)
        if result is not None:
            return result
        path = "wy"
    if path == "wy":
        return wy.chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens)
    return reference.chunk_gated_delta(q, k, v, g, beta, initial_state, num_tokens)


def chained_gated_delta(q, k, v, g, beta, states, depth):
    """B verify rows in chains (depth [B] rows before each on its chain), all chains at once
    in WY form on every backend; see wy.chained_gated_delta."""
    return wy.chained_gated_delta(q, k, v, g, beta, states, depth)


def gated_delta_step(q, k, v, g, beta, states):
    """One token for each of B rows, each with its own state; see reference.gated_delta_step."""
    return reference.gated_delta_step(q, k, v, g, beta, states)


def rows_kernel_on() -> bool:
    """Whether decode rows take rows_kernel.py on a GPU: NINFER_GDN_ROWS_KERNEL if set
    ("1" or "0"), else GPU_ROWS_KERNEL."""
    return dispatch.switch(ROWS_ENV, GPU_ROWS_KERNEL)


def fused_rows_on() -> bool:
    """Whether decode rows start from the conv's inputs in one kernel on a GPU (with the rows
    kernel on): NINFER_GDN_FUSED_ROWS if set ("1" or "0"), else GPU_FUSED_ROWS."""
    return rows_kernel_on() and dispatch.switch(FUSED_ROWS_ENV, GPU_FUSED_ROWS)


def conv_gated_delta_rows(mixed, conv_weight, conv, gates, recurrent, slots, *,
                          key_heads: int, decay=None):
    """Decode rows from the layer's in_qkv output through the conv; see
    reference.conv_gated_delta_rows (the caller stores the returned windows at the slots;
    gates None: from mixed's b | a columns and decay, in the fused kernel on a GPU)."""
    def xla_gates():
        return reference.fused_gates(mixed, decay, conv_dim=conv_weight.shape[1],
                                     value_heads=recurrent.shape[1],
                                     value_head_dim=recurrent.shape[3])

    kernels = fused_rows_on() and dispatch.use_kernels()
    if gates is None and not (kernels and dispatch.switch(FUSED_GATES_ENV, GPU_FUSED_GATES)):
        gates = xla_gates()
    if kernels:
        result = rows_kernel.conv_gated_delta_rows(mixed, conv_weight, conv, gates,
                                                   recurrent, slots, key_heads=key_heads,
                                                   decay=decay)
        if result is not None:
            return result
    if gates is None:
        gates = xla_gates()
    q, k, v, window = reference.conv_rows_heads(mixed, conv_weight, conv, slots,
                                                key_heads=key_heads,
                                                head_dims=recurrent.shape[2:])
    if rows_kernel_on() and dispatch.use_kernels():
        result = rows_kernel.gated_rows(q, k, v, gates, recurrent, slots)
        if result is not None:
            return result[0], window, result[1]
    out, recurrent = reference.gated_delta_rows(q, k, v, gates[..., 0], gates[..., 1],
                                                recurrent, slots)
    return out, window, recurrent


def gated_delta_rows(q, k, v, g, beta, recurrent, slots):
    """One token for each of B rows, row i's state in slot slots[i] of `recurrent`, updated
    there; see reference.gated_delta_rows."""
    if rows_kernel_on() and dispatch.use_kernels():
        result = rows_kernel.gated_delta_rows(q, k, v, g, beta, recurrent, slots)
        if result is not None:
            return result
    return reference.gated_delta_rows(q, k, v, g, beta, recurrent, slots)
