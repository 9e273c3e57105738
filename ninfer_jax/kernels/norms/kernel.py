"""The residual add and its RMSNorm as a Pallas kernel (GPU), same contract as reference.py.

One program per row: the row of x and of delta loaded once (masked up to the next power of
two of H, Triton's tile sides, so 5120-wide models need no padding copy), their sum rounded
to x's dtype as XLA's add rounds it, stored, and normalised in registers. Lowering: Pallas'
Triton backend, tested in interpret mode on CPU.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels.tiling import next_power_of_2

# Warps per row: a 4096-wide bfloat16 row is 8 KiB, 16 values a thread at 8 warps.
NUM_WARPS = 8


def add_rms_norm(x, delta, weight, *, eps: float, zero_centred: bool = False,
                 interpret: bool = False):
    """See reference.add_rms_norm; None when x and delta differ in dtype (the reference's
    add would promote) or are not [N, H]."""
    if x.ndim != 2 or x.shape != delta.shape or x.dtype != delta.dtype:
        return None
    N, H = x.shape
    whole = lambda a: pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)  # noqa: E731
    kernel = functools.partial(_add_norm_kernel, width=next_power_of_2(H), eps=eps,
                               zero_centred=zero_centred)
    out = jax.ShapeDtypeStruct((N, H), x.dtype)
    return tuple(pl.pallas_call(
        kernel,
        grid=(N,),
        in_specs=[whole(x), whole(delta), whole(weight)],
        out_specs=[whole(out), whole(out)],
        out_shape=[out, out],
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name="ninfer_add_rms_norm",
    )(x, delta, weight))


def _add_norm_kernel(x_ref, delta_ref, w_ref, total_ref, normed_ref, *, width: int,
                     eps: float, zero_centred: bool):
    row = pl.program_id(0)
    H = x_ref.shape[1]
    live = lax.broadcasted_iota(jnp.int32, (width,), 0) < H
    cols = pl.ds(0, width)
    x = pltriton.load(x_ref.at[row, cols], mask=live, other=0.0).astype(jnp.float32)
    delta = pltriton.load(delta_ref.at[row, cols], mask=live, other=0.0).astype(jnp.float32)
    total = (x + delta).astype(total_ref.dtype)
    pltriton.store(total_ref.at[row, cols], total, mask=live)
    t32 = total.astype(jnp.float32)
    scale = lax.rsqrt(jnp.sum(t32 * t32) / H + eps)
    w = pltriton.load(w_ref.at[cols], mask=live, other=0.0).astype(jnp.float32)
    normed = t32 * scale * ((1.0 + w) if zero_centred else w)
    pltriton.store(normed_ref.at[row, cols], normed.astype(normed_ref.dtype), mask=live)
