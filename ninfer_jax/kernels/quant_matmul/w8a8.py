"""W8A8: int8 / fp8 per-channel weights times activations quantized per row, one 8-bit GEMM.

vLLM's answer for 8-bit weights on Hopper, written as XLA ops (no Pallas): each row (token) of x
gets a dynamic scale (reference.quantize_rows: max|x| / 448 into e4m3, max|x| / 127 into int8),
then one `lax.dot_general` of the 8-bit operands with a 32-bit accumulator (fp8 x fp8 -> f32,
int8 x int8 -> int32), and the epilogue multiplies by x_scale[m] * w_scale[n] and casts. On a
GPU XLA lowers the fp8 product to a cuBLASLt fp8 GEMM (or its Triton GEMM, whichever its
autotuner picks) and the int8 one to an integer GEMM; XLA CPU upcasts both (fine for tests).
reference.w8a8_matmul is the twin with f32 dequantization of both operands.

Weight layout: cuBLASLt's fp8 (and cuBLAS's int8) GEMMs take both operands contiguous along K,
i.e. the weight as [N, K]. An entry parameter's layout is fixed (row major), so XLA cannot
choose it for a stored [K, N] leaf: it would copy the weight into [N, K] inside every step (a
transpose per call, twice the weight's bytes, which is all a decode step has to spend; letting
XLA choose the parameter layouts, Layout.AUTO, would bind the placed weights to one
executable's choice while many step shapes share them). So when W8A8 runs at every row count
the load stores the codes transposed once (the int8_nk / fp8_nk leaves of formats.py, made by
`transpose_leaves` from runner.place_params, never in an artifact). Above a row threshold the
small-row kernels (kernel.py, gemv.py) still read [K, N], so the leaves stay as stored and
this path contracts the weight's first axis; should XLA copy the weight, that costs (an
estimate: twice the codes' bytes at HBM rate against 2MKN at the fp8 tensor-core rate) ~7% of
the GEMM at 4096 rows but ~half at 512. benchmarks/kernel_bench.py `w8a8` times both layouts
at every M and records whether the compiled product copies the weight.
Shape letters: M rows, K in, N out.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ninfer_jax.kernels.quant_matmul.formats import (LEAF_FORMATS, PER_CHANNEL_FORMATS,
                                                      TRANSPOSED_FORMATS, format_of)
from ninfer_jax.kernels.quant_matmul.reference import quantize_rows

ACCUMULATOR = {"int8": jnp.int32, "fp8": jnp.float32}


def base_format(w) -> str | None:
    """"int8" / "fp8" for a per-channel leaf in either layout; None for any other weight."""
    if not isinstance(w, dict):
        return None
    fmt = format_of(w)
    fmt = TRANSPOSED_FORMATS.get(fmt, fmt)
    return fmt if fmt in PER_CHANNEL_FORMATS else None


def matmul(x, w, *, out_dtype=None):
    """x [..., K] @ an int8 / fp8 per-channel leaf ([K, N], or [N, K] as int8_nk / fp8_nk)
    -> [..., N] in out_dtype (default x's dtype)."""
    fmt = format_of(w)
    base = base_format(w)
    codes = w[fmt]
    is_nk = fmt in TRANSPOSED_FORMATS
    N = codes.shape[0] if is_nk else codes.shape[1]
    lead, K = x.shape[:-1], x.shape[-1]
    x_codes, x_scale = quantize_rows(x.reshape(-1, K), base)  # [M, K], [M]
    contract_w = 1 if is_nk else 0
    sums = lax.dot_general(x_codes, codes, (((1,), (contract_w,)), ((), ())),
                           preferred_element_type=ACCUMULATOR[base])  # [M, N]
    scale = x_scale[:, None] * w["scale"].astype(jnp.float32)[None, :]
    out = sums.astype(jnp.float32) * scale
    return out.astype(out_dtype or x.dtype).reshape(*lead, N)


def transposed(w) -> dict:
    """An int8 / fp8 [K, N] leaf as its [N, K] twin (int8_nk / fp8_nk), codes on w's device."""
    fmt = format_of(w)
    return {f"{fmt}_nk": _transpose(w[fmt]), "scale": w["scale"]}


_transpose = jax.jit(jnp.transpose)


def transpose_leaves(tree):
    """Every int8 / fp8 [K, N] leaf of a params tree replaced by its [N, K] twin, one leaf at a
    time (the tree's own dicts and lists are updated in place, so each [K, N] copy is freed as
    soon as nothing else holds it). Other leaves are left as they are."""
    if isinstance(tree, dict):
        if any(key in tree for key in LEAF_FORMATS):
            return transposed(tree) if format_of(tree) in PER_CHANNEL_FORMATS else tree
        for key, value in tree.items():
            tree[key] = transpose_leaves(value)
        return tree
    if isinstance(tree, list):
        for index, value in enumerate(tree):
            tree[index] = transpose_leaves(value)
        return tree
    return tree
