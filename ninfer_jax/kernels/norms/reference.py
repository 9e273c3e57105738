"""Pure-jnp twin of kernel.py: the residual add and its RMSNorm, float32 inside."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def add_rms_norm(x, delta, weight, *, eps: float, zero_centred: bool = False):
    """x, delta [N, H] (one dtype), weight [H] -> (x + delta in x's dtype, its RMSNorm in x's
    dtype: sum * rsqrt(mean(sum^2) + eps) * weight, or * (1 + weight) when zero_centred)."""
    total = x + delta
    t32 = total.astype(jnp.float32)
    normed = t32 * jax.lax.rsqrt(jnp.mean(t32 * t32, axis=-1, keepdims=True) + eps)
    w = weight.astype(jnp.float32)
    return total, (normed * ((1.0 + w) if zero_centred else w)).astype(x.dtype)
