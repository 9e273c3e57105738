"""The attention prologue as a Pallas kernel (GPU), same contract as reference.py.

One program per (token, head) over the q heads, then the K/V heads: it loads the head from
the fused projection's row (in place: no split copies), normalises it in registers when the
model has QK-norm, rotates its first R dims, and stores q's head, or k's head and v's head
into their cache pages at the token's slot (the caches are aliased to the outputs, so the
pool is updated in place as XLA's scatter updates it). The rotated halves and the passed
through rest are stored by disjoint (masked) stores. Lowering: Pallas' Triton backend,
tested in interpret mode on CPU.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ninfer_jax.kernels.tiling import is_power_of_2

# A head's 128-256 values at 2 bytes: one warp holds it.
NUM_WARPS = 1


def attention_prologue(qkv, q_norm, k_norm, cos, sin, slots, k_cache, v_cache, *,
                       num_heads: int, num_kv_heads: int, eps: float,
                       zero_centred: bool = False, gated: bool = False,
                       interpret: bool = False):
    """See reference.attention_prologue; None where the kernel does not apply: caches that
    are not plain arrays of one dtype (8- and 4-bit pages), a head width or rotary half
    width that is not a power of two (Triton's tile sides), one of the two norms without the
    other, or shapes that disagree."""
    q_width = 2 if gated else 1
    columns = q_width * num_heads + 2 * num_kv_heads
    if qkv.ndim != 2 or qkv.shape[1] % columns or isinstance(k_cache, tuple) \
            or isinstance(v_cache, tuple):  # 8- and 4-bit pages carry scales
        return None
    N, D = qkv.shape[0], qkv.shape[1] // columns
    half = cos.shape[-1] if cos.ndim == 2 else 0
    if (not is_power_of_2(D) or not is_power_of_2(half) or 2 * half > D or k_cache.ndim != 4
            or v_cache.shape != k_cache.shape or k_cache.shape[1] != num_kv_heads
            or k_cache.shape[3] != D or k_cache.dtype != v_cache.dtype
            or (q_norm is None) != (k_norm is None) or cos.shape != (N, half)
            or sin.shape != (N, half) or slots.shape != (N,)):
        return None
    # The norm weights go in as stored and widen in the kernel: a stack or a convert here
    # is an XLA kernel of its own per layer and step (run 66: 1.3 us x 36 a step).
    norms = [] if q_norm is None else [q_norm, k_norm]
    whole = lambda a: pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)  # noqa: E731
    args = [slots.astype(jnp.int32), qkv, cos.astype(jnp.float32), sin.astype(jnp.float32),
            *norms, k_cache, v_cache]
    q = jax.ShapeDtypeStruct((N, num_heads, D), qkv.dtype)
    cache = jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype)
    kernel = functools.partial(_prologue_kernel, num_heads=num_heads,
                               num_kv_heads=num_kv_heads, eps=eps, normed=bool(norms),
                               zero_centred=zero_centred, q_width=q_width)
    return tuple(pl.pallas_call(
        kernel,
        grid=(N, num_heads + num_kv_heads),
        in_specs=[whole(a) for a in args],
        out_specs=[whole(q), whole(cache), whole(cache)],
        out_shape=[q, cache, cache],
        input_output_aliases={len(args) - 2: 1, len(args) - 1: 2},
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name="ninfer_attention_prologue",
    )(*args))


def _prologue_kernel(slots_ref, qkv_ref, cos_ref, sin_ref, *refs, num_heads: int,
                     num_kv_heads: int, eps: float, normed: bool, zero_centred: bool,
                     q_width: int):
    norm_refs = refs[:2] if normed else None
    q_ref, k_out, v_out = refs[-3:]
    token, head = pl.program_id(0), pl.program_id(1)
    D, half = q_ref.shape[2], cos_ref.shape[1]
    R = 2 * half
    lower, upper, full = pl.ds(0, half), pl.ds(half, half), pl.ds(0, D)
    cos, sin = cos_ref[token, lower], sin_ref[token, lower]
    passed = lax.broadcasted_iota(jnp.int32, (D,), 0) >= R  # the dims RoPE leaves alone

    def prepared(column, which):
        """The head at qkv column `column`, normed with norm `which` (0: q's, 1: k's) and
        rounded to qkv's dtype as the model rounds it: (whole head, its first rotary half,
        its second)."""
        def part(offset, width):
            return qkv_ref[token, pl.ds(column + offset, width)].astype(jnp.float32)

        x, x1, x2 = part(0, D), part(0, half), part(half, half)
        if norm_refs is None:
            return x, x1, x2
        scale = lax.rsqrt(jnp.sum(x * x) / D + eps)
        shift = 1.0 if zero_centred else 0.0

        def normed_(values, cols):
            w = norm_refs[which][cols].astype(jnp.float32) + shift
            return (values * scale * w).astype(qkv_ref.dtype).astype(jnp.float32)

        return normed_(x, full), normed_(x1, lower), normed_(x2, upper)

    def store(ref, at, head_values):
        """Rotate and store one head: the rotary halves, then (masked) the rest."""
        x, x1, x2 = head_values
        ref[(*at, lower)] = (x1 * cos - x2 * sin).astype(qkv_ref.dtype).astype(ref.dtype)
        ref[(*at, upper)] = (x2 * cos + x1 * sin).astype(qkv_ref.dtype).astype(ref.dtype)
        if R < D:
            pltriton.store(ref.at[(*at, full)], x.astype(qkv_ref.dtype).astype(ref.dtype),
                           mask=passed)

    @pl.when(head < num_heads)
    def _query():
        store(q_ref, (token, head), prepared(head * q_width * D, 0))

    @pl.when(head >= num_heads)
    def _key_value():
        kv_head = head - num_heads
        slot = slots_ref[token]
        S = k_out.shape[2]
        page, offset = slot // S, slot % S

        @pl.when((slot >= 0) & (page < k_out.shape[0]))
        def _store():
            k_column = (q_width * num_heads + kv_head) * D
            store(k_out, (page, kv_head, offset), prepared(k_column, 1))
            v = qkv_ref[token, pl.ds(k_column + num_kv_heads * D, D)]
            v_out[page, kv_head, offset, full] = v.astype(v_out.dtype)
