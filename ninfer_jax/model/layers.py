"""Building blocks of the transformer families: projections, norms, rotary embeddings, MLP.

Pure jnp functions, no state. Two functions are seams for weight formats: `linear` (every
projection, lm_head included) and `embed` (the token lookup). A weight leaf is a plain [in, out]
array or a quantized dict (kernels/quant_matmul/formats.py); `linear` hands both to
kernels/quant_matmul, and nothing else in the model looks inside a weight.
Shape letters: N rows (tokens), H hidden, NH query heads, NK kv heads, D head dim, F ffn.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.kernels import norms, quant_matmul
from ninfer_jax.model.tensor_parallel import split_fused


def linear(x, w, *, out_dtype=None):
    """x [..., in] @ w [in, out] -> [..., out]; `out_dtype` asks for a wider result (logits).
    `w` is any weight leaf: kernels/quant_matmul picks the plain or quantized path."""
    return quant_matmul.matmul(x, w, out_dtype=out_dtype)


def embed(table, tokens):
    """Rows of the embedding table [V, H] for token ids [...] -> [..., H]. A GGUF block table
    (kernels/quant_matmul/formats.py) is gathered as bytes and only those rows dequantized."""
    if isinstance(table, dict):
        from ninfer_jax.kernels.quant_matmul import reference
        fmt = quant_matmul.format_of(table)
        return reference.dequantize_blocks(*reference.block_rows(table[fmt], fmt, tokens))
    return jnp.take(table, tokens, axis=0)


def tied_head(table):
    """The output projection [H, V] of a tied embedding table: a block table is already that
    leaf (its rows are the output columns), a plain one is transposed."""
    return table if isinstance(table, dict) else table.T


def mean_square(x32):
    """mean(x * x) over the last axis, keepdims, f32; on the CPU with the same bits for a row
    whatever the number of rows. XLA CPU vectorizes a reduction differently for [1, H] and
    [4, H] (row 0 of a norm differed in the last bit for 57% of random inputs), and with block
    weights (activations rounded to 8 bits per block) a last-bit difference can move a code
    and then a greedy token: verify rows must compute what a decode row computes. A fixed
    tree of elementwise adds of halves has one order per element, however it is vectorized."""
    def fixed_tree(v):
        while v.shape[-1] > 1:
            half = v.shape[-1] // 2
            folded = v[..., :half] + v[..., half:2 * half]
            if v.shape[-1] % 2:  # the odd column joins the first
                folded = jnp.concatenate([folded[..., :1] + v[..., -1:], folded[..., 1:]], -1)
            v = folded
        return v * (1.0 / x32.shape[-1])

    squares = x32 * x32
    return jax.lax.platform_dependent(
        squares, cpu=fixed_tree,
        default=lambda v: jnp.mean(v, axis=-1, keepdims=True))


def rms_norm(x, weight, eps: float):
    """RMSNorm over the last axis, computed in f32 and returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jnp.reciprocal(jnp.sqrt(mean_square(x32) + eps))
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def zero_centred_rms_norm(x, weight, eps: float):
    """RMSNorm whose weight is stored as an offset from one (the hybrid Qwen families): scales
    by (1 + w), added in f32 so a bf16 weight near zero keeps its precision."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jnp.reciprocal(jnp.sqrt(mean_square(x32) + eps))
    return (normed * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


def add_rms_norm(x, delta, weight, eps: float, *, zero_centred: bool = False):
    """The residual stream's x + delta and its RMSNorm (zero_centred: the hybrid families'
    1 + weight): (x + delta, normed), both in x's dtype. One kernel on a GPU when
    kernels/norms' switch is on (XLA's add and norm are a fusion each); else exactly the
    add, then rms_norm or zero_centred_rms_norm."""
    if norms.add_norm_kernel_on():
        from ninfer_jax.kernels.norms import kernel

        fused = kernel.add_rms_norm(x, delta, weight, eps=eps, zero_centred=zero_centred)
        if fused is not None:
            return fused
    x = x + delta
    return x, (zero_centred_rms_norm if zero_centred else rms_norm)(x, weight, eps)


def add_then_next_norm(x, delta, next_weight, eps: float, *, zero_centred: bool = False,
                       extra=None):
    """The residual add after a layer's MLP and the next layer's input norm: (x + delta
    [+ extra], its RMSNorm with next_weight, or None after the last layer). One add_rms_norm
    (one kernel where kernels/norms is on) unless `extra` (deepstack rows, added after the
    layer) sits between the add and the norm or there is no next layer."""
    if next_weight is not None and extra is None:
        return add_rms_norm(x, delta, next_weight, eps, zero_centred=zero_centred)
    x = x + delta
    if extra is not None:
        x = x + extra.astype(x.dtype)
    if next_weight is None:
        return x, None
    return x, (zero_centred_rms_norm if zero_centred else rms_norm)(x, next_weight, eps)


def split_columns(y, widths):
    """The product of a fused projection [..., sum(widths)] cut back into its parts."""
    bounds = np.cumsum(widths)[:-1].tolist()
    return jnp.split(y, bounds, axis=-1)


def swiglu_mlp(x, layer, groups: int = 1):
    """The gated MLP: down(silu(gate(x)) * up(x)); one product for gate and up when the layer
    has the fused `w_gate_up` (model/fused_projections.py), whose columns are laid out in
    `groups` tensor-parallel blocks (model/tensor_parallel.py; 1: gate | up)."""
    if "w_gate_up" in layer:
        y = linear(x, layer["w_gate_up"])
        if groups == 1:  # gate | up: the down product may activate as it loads
            out = quant_matmul.swiglu_matmul(y, layer["w_down"])
            if out is not None:
                return out
        half = y.shape[-1] // 2
        gate, up = split_fused(y, (half, half), groups)
    else:
        gate, up = linear(x, layer["w_gate"]), linear(x, layer["w_up"])
    hidden = gate * jnp.reciprocal(1.0 + jnp.exp(-gate)) * up
    return linear(hidden, layer["w_down"])


# ----------------------------------------------------------------------------- rotary embedding


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """The D/2 rotary frequencies (host constant, f32), with llama3 frequency scaling applied
    when `scaling` asks for it."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "llama3":
        inv_freq = _llama3_scaled(inv_freq, scaling)
    elif kind not in ("default", None):
        raise ValueError(f"unsupported rope_scaling type {kind!r}")
    return inv_freq.astype(np.float32)


def _llama3_scaled(inv_freq: np.ndarray, scaling: dict) -> np.ndarray:
    """Llama 3.1's band-wise stretch: long wavelengths are divided by `factor`, short ones kept,
    and the band between is interpolated linearly in 1/wavelength."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original_context = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    stretched = inv_freq / factor
    blend = np.clip((original_context / wavelength - low) / (high - low), 0.0, 1.0)
    mixed = (1 - blend) * stretched + blend * inv_freq
    return np.where(wavelength > original_context / low, stretched,
                    np.where(wavelength < original_context / high, inv_freq, mixed))


def rope_tables(positions, inv_freq: np.ndarray):
    """cos and sin [N, D/2] (f32) for integer positions [N]."""
    angles = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def mrope_tables(positions, inv_freq: np.ndarray, frequency_axes: np.ndarray):
    """cos and sin [N, D/2] (f32) for three-axis positions [3, N]: frequency j turns with the
    position on axis frequency_axes[j] (model/vision/mrope.py). Equal axes give rope_tables."""
    chosen = jnp.take(positions.astype(jnp.float32), jnp.asarray(frequency_axes), axis=0)
    angles = chosen.T * jnp.asarray(inv_freq)[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate x [N, heads, D] in the rotate_half convention (first and second halves pair up)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def apply_partial_rope(x, cos, sin):
    """Rotate the first 2 * cos.shape[-1] dims of x [N, heads, D] (rotate_half within them) and
    pass the rest through: partial rotary embeddings."""
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return jnp.concatenate([apply_rope(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]],
                           axis=-1)
