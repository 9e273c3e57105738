"""Weight-only quantized matmul: `matmul(x, w)` for any weight leaf (formats.py).

Dispatch, decided while tracing: a plain (bf16/f32) weight is one XLA matmul everywhere. A
quantized weight goes to the Pallas decode kernel (kernel.py) on a GPU when x has at most
DECODE_MAX_ROWS rows and the shape tiles; otherwise (prefill shapes, CPU, NINFER_FORCE_REFERENCE)
to the reference, which dequantizes in XLA and multiplies (reference.py).
The model calls this from model/layers.py::linear; quantize() is for converters (host, numpy).
"""
from __future__ import annotations

import jax.numpy as jnp

from ninfer_jax.kernels.dispatch import use_kernels
from ninfer_jax.kernels.quant_matmul import reference
from ninfer_jax.kernels.quant_matmul.formats import (  # noqa: F401
    FORMATS,
    QUANTIZED_FORMATS,
    describe,
    format_of,
    quantize,
    stored_bytes,
)

DECODE_MAX_ROWS = 64


def matmul(x, w, *, out_dtype=None):
    """x [..., K] @ w -> [..., N] in out_dtype (default x's dtype); w is any weight leaf."""
    if not isinstance(w, dict):
        if w.shape[0] != x.shape[-1]:
            w = w[:x.shape[-1]]  # an expanded quantized leaf keeps its zero group-padding rows
        return jnp.matmul(x, w, preferred_element_type=out_dtype)
    rows = x.size // x.shape[-1]
    if use_kernels() and rows <= DECODE_MAX_ROWS:
        from ninfer_jax.kernels.quant_matmul import kernel
        out = kernel.matmul(x, w, out_dtype=out_dtype)
        if out is not None:
            return out
    return reference.matmul(x, w, out_dtype=out_dtype)
