"""The CPU decode attention (decode_attention.cc) reached from jitted code through jax.ffi.

`paged_decode_attention` has reference.paged_decode_attention's signature and takes plain f32,
bf16 or f16 pages (widened to f32 as the reference does); `supports` says when it applies (the
extension is built, the caches are plain arrays of those dtypes). The shared library is built
by the package's install (setup.py); the jnp reference stays the oracle and the fallback (8-bit
ScaledPages, no extension, NINFER_FORCE_REFERENCE).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.kernels import cpu_extension

TARGET = "ninfer_paged_decode_attention"
WRITE_TARGET = "ninfer_paged_write_kv16"
LIBRARY_STEM = "_decode_attention"


@functools.lru_cache(maxsize=1)
def _library():
    return cpu_extension.load(__file__, LIBRARY_STEM, TARGET, WRITE_TARGET)


def available() -> bool:
    """Whether the extension is built (it is registered with XLA on first call)."""
    return _library() is not None


PAGE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def supports(k_cache, v_cache) -> bool:
    """Plain f32, bf16 or f16 pages of one dtype (not ScaledPages) and the extension built."""
    return (available() and not isinstance(k_cache, tuple) and not isinstance(v_cache, tuple)
            and k_cache.dtype in PAGE_DTYPES and v_cache.dtype == k_cache.dtype)


def paged_decode_attention(q, k_cache, v_cache, page_table, lengths, *, scale: float):
    """q [B, H, D] against f32, bf16 or f16 pages [P, K, S, D] (both caches one dtype); see
    reference.paged_decode_attention."""
    if _library() is None:
        raise RuntimeError("the CPU decode attention is not built (pip install -e . builds it)")
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32))
    out = call(q.astype(jnp.float32), k_cache, v_cache, page_table.astype(jnp.int32),
               lengths.astype(jnp.int32), scale=np.float32(scale))
    return out.astype(q.dtype)


def write_kv(k_cache, v_cache, k_new, v_new, slots):
    """reference.write_kv for bf16 or f16 pages, in place (each result aliases its cache): the
    values rounded to the page dtype as the reference's astype does."""
    if _library() is None:
        raise RuntimeError("the CPU decode attention is not built (pip install -e . builds it)")
    slots = slots.astype(jnp.int32)

    def write(cache, new):
        call = jax.ffi.ffi_call(WRITE_TARGET, jax.ShapeDtypeStruct(cache.shape, cache.dtype),
                                input_output_aliases={0: 0})
        return call(cache, new.astype(cache.dtype), slots)

    return write(k_cache, k_new), write(v_cache, v_new)
