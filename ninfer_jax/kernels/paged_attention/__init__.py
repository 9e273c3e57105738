"""Paged attention: the op's public entry points.

Today every call goes to the pure-jnp reference (reference.py). The GPU kernels (kernel.py)
plug in here behind the same signatures; NINFER_FORCE_REFERENCE=1 forces the reference.
"""
from ninfer_jax.kernels.paged_attention.reference import (  # noqa: F401
    DUMMY_PAGE,
    get_kv_cache_shape,
    paged_decode_attention,
    paged_prefill_attention,
    write_kv,
)
