"""Paged attention: the op's public entry points, dispatched at trace time.

On a GPU backend decode runs the Pallas kernel (kernel.py, over plain, 8-bit and 4-bit pages)
and prefill runs cuDNN flash attention over gathered pages (prefill.py); on the CPU, decode
over f32, bf16 or f16 pages runs the C++ handler (cpu/, when built), which also writes K/V into 16-bit pages in place; everywhere else,
and whenever NINFER_FORCE_REFERENCE=1, both run the pure-jnp reference (reference.py). All
three share the signatures and the cache layout defined in reference.py. The choice is made while tracing, so it costs nothing per step.
"""
from __future__ import annotations

import logging

import jax

from ninfer_jax.kernels.dispatch import forced_reference, use_kernels
from ninfer_jax.kernels.paged_attention import block, reference
from ninfer_jax.kernels.paged_attention.reference import (  # noqa: F401
    DUMMY_PAGE,
    K8V4,
    NVFP4,
    FourBitPages,
    KVFormat,
    ScaledPages,
    cache_bytes_per_token,
    cache_specs,
    kv_format,
    get_kv_cache_shape,
)

log = logging.getLogger(__name__)


def paged_decode_attention(q, k_cache, v_cache, page_table, lengths, *, scale: float):
    """One query token per row; see reference.paged_decode_attention."""
    if use_kernels() and gpu_decode_ready(k_cache, v_cache):
        from ninfer_jax.kernels.paged_attention import kernel
        return kernel.paged_decode_attention(q, k_cache, v_cache, page_table, lengths,
                                             scale=scale)
    if cpu_decode_ready(k_cache, v_cache):
        from ninfer_jax.kernels.paged_attention import cpu
        return cpu.paged_decode_attention(q, k_cache, v_cache, page_table, lengths, scale=scale)
    return reference.paged_decode_attention(q, k_cache, v_cache, page_table, lengths,
                                            scale=scale)


def paged_block_attention(q, k_block, v_block, k_cache, v_cache, page_table, lengths, *,
                          scale: float, window: int | None = None, causal: bool = False):
    """A block of T queries per row over its paged keys and its own keys (the DFlash drafter);
    see reference.paged_block_attention. block.py where its parts apply (a sliding window:
    every backend; no window: the GPU's decode kernel), else, or when forced, the reference."""
    fast = not forced_reference() and (
        window is not None or (use_kernels() and gpu_decode_ready(k_cache, v_cache)))
    impl = block.paged_block_attention if fast else reference.paged_block_attention
    return impl(q, k_block, v_block, k_cache, v_cache, page_table, lengths, scale=scale,
                window=window, causal=causal)


def write_kv(k_cache, v_cache, k_new, v_new, slots):
    """Store k_new/v_new [N, K, D] at flat slots [N]; see reference.write_kv. 16-bit pages on
    the CPU are written in place by the C++ handler (XLA's CPU scatter into them rewrites the
    whole cache)."""
    if cpu_decode_ready(k_cache, v_cache) and k_cache.dtype.itemsize == 2:
        from ninfer_jax.kernels.paged_attention import cpu
        return cpu.write_kv(k_cache, v_cache, k_new, v_new, slots)
    return reference.write_kv(k_cache, v_cache, k_new, v_new, slots)


def gpu_decode_ready(k_cache, v_cache) -> bool:
    """Whether the Pallas decode kernel reads this pair of caches (kernel.supports: both plain
    or both quantized, as cache_specs builds them); any other pair runs the reference."""
    from ninfer_jax.kernels.paged_attention import kernel
    return kernel.supports(k_cache, v_cache)


def cpu_decode_ready(k_cache, v_cache) -> bool:
    """Whether decode rows over these caches run the C++ handler (cpu/): the CPU backend, not
    forced to the reference, plain (not 8- or 4-bit) f32, bf16 or f16 pages, the extension built."""
    if jax.default_backend() != "cpu" or forced_reference():
        return False
    if isinstance(k_cache, tuple) or isinstance(v_cache, tuple):  # 8- or 4-bit codes
        return False
    from ninfer_jax.kernels.paged_attention import cpu
    return cpu.supports(k_cache, v_cache)


def paged_prefill_attention(q, k_cache, v_cache, page_table, start, *, scale: float):
    """Causal attention for one sequence's chunk; see reference.paged_prefill_attention."""
    if use_kernels():
        from ninfer_jax.kernels.paged_attention import prefill
        try:
            return prefill.paged_prefill_attention(q, k_cache, v_cache, page_table, start,
                                                   scale=scale)
        except (NotImplementedError, ValueError) as err:
            # cuDNN rejects some shapes (head dims, dtypes) while tracing; stay correct.
            log.warning("cuDNN prefill attention unavailable (%s); using the reference", err)
    return reference.paged_prefill_attention(q, k_cache, v_cache, page_table, start,
                                             scale=scale)
