"""Pure-jnp twin of kernel.py: the product in float32, rounded to x's dtype."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def skinny_matmul(x, w, *, swiglu: bool = False, tiles=None, interpret: bool = False):
    """x [M, K] @ w [K, N] -> [M, N] in x's dtype (products summed in float32). swiglu: x is
    a gated MLP's gate | up [M, 2K] and the left operand silu(gate) * up, computed in float32
    and rounded to x's dtype. `tiles` and `interpret` are the kernel's (unused here)."""
    del tiles, interpret
    if swiglu:
        gate, up = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        x = (gate * jax.nn.sigmoid(gate) * up).astype(x.dtype)
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)
