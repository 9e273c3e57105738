"""The CPU block kernel (ggml_matmul.cc) reached from jitted code through jax.ffi.

`matmul(x, leaf)` multiplies by a GGUF block-format leaf (formats.py: q8_0, q4_0, q4_1) without
expanding it: the C++ handler quantizes x per 32-block to int8 and runs integer SIMD dots
(AVX-512 VNNI, AVX2, NEON or scalar, picked at run time). `interleave(leaf)` regroups a leaf
at load into the layout whose x86 paths put 16 output columns in one vector (formats.py's
q4_1x16 etc.; several times faster from two rows on); matmul takes either layout. The shared library is built by the
package's install (setup.py); when it is missing, `available()` is False and callers use the
jnp reference (reference.py), which stays the oracle.
"""
from __future__ import annotations

import ctypes
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.kernels import cpu_extension
from ninfer_jax.kernels.quant_matmul.formats import (BLOCK_FORMATS, INTERLEAVE,
                                                      INTERLEAVED_FORMATS, format_of,
                                                      interleave_blocks)

TARGET = "ninfer_ggml_matmul"
LIBRARY_STEM = "_ggml_matmul"
FORMAT_CODES = {"q8_0": 0, "q4_0": 1, "q4_1": 2}
# path attribute of the handler: 0 the best this CPU has; the others force one (tests)
PATHS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512vnni": 3, "neon": 4}


@functools.lru_cache(maxsize=1)
def _library():
    library = cpu_extension.load(__file__, LIBRARY_STEM, TARGET)
    if library is not None:
        library.ninfer_ggml_path_name.restype = ctypes.c_char_p
        library.ninfer_ggml_path_name.argtypes = [ctypes.c_int32]
        library.ninfer_ggml_interleaved_simd.restype = ctypes.c_int32
    return library


def available() -> bool:
    """Whether the extension is built (it is registered with XLA on first call)."""
    return _library() is not None


def path_name(path: str = "auto") -> str:
    """The SIMD path `path` resolves to on this CPU ("unavailable" when it has not got it)."""
    library = _library()
    if library is None:
        return "unavailable"
    return library.ninfer_ggml_path_name(PATHS[path]).decode()


def available_paths() -> list[str]:
    return [name for name in PATHS if name != "auto" and path_name(name) != "unavailable"]


def interleaved_simd() -> bool:
    """Whether this CPU has a SIMD path for the interleaved layout (x86 AVX2 or AVX-512; the
    others would run its scalar twin, so their loads keep the row layout)."""
    library = _library()
    return library is not None and bool(library.ninfer_ggml_interleaved_simd())


def interleave(leaf):
    """A block leaf in the interleaved layout where this CPU has its SIMD path and the leaf
    is a 2-D [N, ...] with N a multiple of 16; any other leaf as given."""
    if not isinstance(leaf, dict) or format_of(leaf) not in BLOCK_FORMATS:
        return leaf
    fmt = format_of(leaf)
    raw = leaf[fmt]
    if raw.ndim != 2 or raw.shape[0] % INTERLEAVE or not interleaved_simd():
        return leaf
    return {f"{fmt}x{INTERLEAVE}": jnp.asarray(interleave_blocks(np.asarray(raw), fmt))}


def supports(x, w) -> bool:
    """Whether the kernel takes this product: a block leaf (either layout), K whole blocks,
    the extension."""
    return (isinstance(w, dict) and
            (format_of(w) in BLOCK_FORMATS or format_of(w) in INTERLEAVED_FORMATS)
            and available() and x.shape[-1] % 32 == 0)


def matmul(x, w, *, out_dtype=None, path: str = "auto"):
    """x [..., K] @ block leaf w -> [..., N] (f32 inside, then out_dtype or x's dtype)."""
    if _library() is None:  # registers the handler with XLA on first use
        raise RuntimeError("the CPU block kernel is not built (pip install -e . builds it)")
    fmt = format_of(w)
    blocks = w[fmt]
    interleaved = fmt in INTERLEAVED_FORMATS
    N = blocks.shape[0] * (INTERLEAVE if interleaved else 1)
    lead, K = x.shape[:-1], x.shape[-1]
    rows = int(np.prod(lead)) if lead else 1
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((rows, N), jnp.float32))
    y = call(x.reshape(rows, K).astype(jnp.float32), blocks,
             fmt=np.int32(FORMAT_CODES[INTERLEAVED_FORMATS.get(fmt, fmt)]),
             path=np.int32(PATHS[path]), layout=np.int32(interleaved))
    return y.reshape(*lead, N).astype(out_dtype or x.dtype)
