"""Weight-only quantized matmul: `matmul(x, w)` for any weight leaf (formats.py).

Dispatch, decided while tracing: a plain (bf16/f32) weight is one XLA matmul everywhere. A
quantized weight goes to the Pallas decode kernel (kernel.py) on a GPU when x has at most
DECODE_MAX_ROWS rows and the shape tiles; otherwise (prefill shapes, CPU, NINFER_FORCE_REFERENCE)
to the reference, which dequantizes in XLA and multiplies (reference.py). A GGUF block leaf
(q8_0, q4_0, q4_1) on the CPU goes to the C++ block kernel (cpu/) when it is built and x has
at most CPU_KERNEL_MAX_ROWS rows; larger chunks (prefill) dequantize and run XLA's f32 matmul,
which is faster there for the row layout. The load's interleaved layout (q4_1x16 etc., made
where the kernel has its SIMD path) goes to the kernel at any row count: 3-5x the
dequantized product from 64 rows on (docs/benchmarks.md). The GPU never calls the CPU kernel.
W8A8 (w8a8.py: activations quantized per row, one 8-bit x 8-bit GEMM) takes int8 / fp8
per-channel weights when W8A8_MIN_ROWS (or NINFER_W8A8) is on and x has at least that many
rows, on every backend (XLA CPU upcasts the same expression); NINFER_FORCE_REFERENCE then runs
its reference twin. Leaves transposed for it at load (int8_nk / fp8_nk) always take it.
The model calls this from model/layers.py::linear; quantize() is for converters (host, numpy).
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import skinny_matmul
from ninfer_jax.kernels.dispatch import forced_reference, use_kernels
from ninfer_jax.kernels.quant_matmul import reference, w8a8
from ninfer_jax.kernels.quant_matmul.formats import (  # noqa: F401
    BLOCK_FORMATS,
    FORMATS,
    INTERLEAVED_FORMATS,
    QUANTIZED_FORMATS,
    TRANSPOSED_FORMATS,
    describe,
    format_of,
    quantize,
    stored_bytes,
)

DECODE_MAX_ROWS = 64
# Rows a plain 16-bit weight's product may take kernels/skinny_matmul for (its dot tile).
SKINNY_MAX_ROWS = 16
CPU_KERNEL_MAX_ROWS = 32  # above it dequantize + XLA matmul wins (docs/benchmarks.md)
# W8A8 for int8 / fp8 per-channel weights on a GPU: 0 off; r >= 1 for x of at least r rows. 1
# (every row count) also transposes those leaves to [N, K] at load (w8a8.py says why); a
# threshold above DECODE_MAX_ROWS (65) keeps them as stored for the decode kernels. Run 49
# (H200, the 8B step at 1 / 8 / 64 rows and a 4k prefill, against bf16): int8 W8A8 1.57x /
# 1.31x / 1.17x / 1.27x; fp8 W8A8 1.34x / 0.69x / 0.86x / 1.41x, where fp8 weight-only
# kernels gave 1.11x / 0.91x / 0.83x and a dequantized prefill. The CPU keeps the weight-only
# paths (its C++ and reference kernels; XLA CPU would only upcast the 8-bit GEMM).
W8A8_MIN_ROWS = 1
W8A8_ENV = "NINFER_W8A8"  # a row count (0 off, 1 every row) overriding it at load and trace


def matmul(x, w, *, out_dtype=None):
    """x [..., K] @ w -> [..., N] in out_dtype (default x's dtype); w is any weight leaf."""
    rows = x.size // x.shape[-1]
    if not isinstance(w, dict):
        if w.shape[0] != x.shape[-1]:
            w = w[:x.shape[-1]]  # an expanded quantized leaf keeps its zero group-padding rows
        if (rows <= SKINNY_MAX_ROWS and out_dtype in (None, x.dtype)
                and skinny_matmul.skinny_on()):
            from ninfer_jax.kernels.skinny_matmul import kernel as skinny
            out = skinny.skinny_matmul(x.reshape(rows, x.shape[-1]), w)
            if out is not None:
                return out.reshape(*x.shape[:-1], w.shape[1])
        return jnp.matmul(x, w, preferred_element_type=out_dtype)
    if format_of(w) in TRANSPOSED_FORMATS or (w8a8.base_format(w) and _w8a8_applies(rows)):
        if forced_reference():
            return reference.w8a8_matmul(x, w, out_dtype=out_dtype)
        return w8a8.matmul(x, w, out_dtype=out_dtype)
    if format_of(w) in INTERLEAVED_FORMATS:  # made at load only where the kernel runs
        if not use_kernels() and _cpu_kernel_ready(x, w):
            from ninfer_jax.kernels.quant_matmul import cpu
            return cpu.matmul(x, w, out_dtype=out_dtype)
        return reference.matmul(x, w, out_dtype=out_dtype)
    if format_of(w) in BLOCK_FORMATS:
        if not use_kernels() and rows <= CPU_KERNEL_MAX_ROWS and _cpu_kernel_ready(x, w):
            from ninfer_jax.kernels.quant_matmul import cpu
            return cpu.matmul(x, w, out_dtype=out_dtype)
        return reference.matmul(x, w, out_dtype=out_dtype)
    if use_kernels() and rows <= DECODE_MAX_ROWS:
        from ninfer_jax.kernels.quant_matmul import kernel
        out = kernel.matmul(x, w, out_dtype=out_dtype)
        if out is not None:
            return out
    return reference.matmul(x, w, out_dtype=out_dtype)


def swiglu_matmul(y, w):
    """silu(gate) * up @ w for a gated MLP's y = gate | up [..., 2F] and a plain w [F, N],
    through kernels/skinny_matmul with the activation computed as the rows load (no kernel of
    its own); None where that does not apply (its switch off, more than SKINNY_MAX_ROWS rows,
    a quantized w, shapes it does not tile): the caller activates and calls matmul."""
    rows = y.size // y.shape[-1]
    if isinstance(w, dict) or rows > SKINNY_MAX_ROWS or not skinny_matmul.skinny_on():
        return None
    from ninfer_jax.kernels.skinny_matmul import kernel as skinny
    out = skinny.skinny_matmul(y.reshape(rows, y.shape[-1]), w, swiglu=True)
    return None if out is None else out.reshape(*y.shape[:-1], w.shape[1])


def w8a8_min_rows() -> int:
    """W8A8_MIN_ROWS on a GPU (0 elsewhere), or NINFER_W8A8 where set (read when tracing and
    at load)."""
    override = os.environ.get(W8A8_ENV, "")
    if not override:
        return W8A8_MIN_ROWS if jax.default_backend() == "gpu" else 0
    if not override.isdigit():
        raise ValueError(f"{W8A8_ENV}={override!r}: expected a row count (0 off, 1 every row)")
    return int(override)


def w8a8_transposes_at_load() -> bool:
    """Whether the load should store int8 / fp8 leaves as [N, K] (W8A8 at every row count)."""
    return w8a8_min_rows() == 1


def _w8a8_applies(rows: int) -> bool:
    min_rows = w8a8_min_rows()
    return min_rows > 0 and rows >= min_rows


def _cpu_kernel_ready(x, w) -> bool:
    if jax.default_backend() != "cpu" or forced_reference():
        return False
    from ninfer_jax.kernels.quant_matmul import cpu
    return cpu.supports(x, w)


def cpu_kernel_available() -> bool:
    """Whether block leaves run the CPU kernel here (so they should not be expanded at load)."""
    if jax.default_backend() != "cpu" or forced_reference():
        return False
    from ninfer_jax.kernels.quant_matmul import cpu
    return cpu.available()
