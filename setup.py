"""The package's compiled parts: the CPU block-format matmul (kernels/quant_matmul/cpu) and the
CPU paged decode attention (kernels/paged_attention/cpu).

Everything else is in pyproject.toml. Each extension is a plain shared library loaded through
ctypes and registered with XLA by jax.ffi, so it needs only XLA's FFI headers (shipped in
jaxlib, hence jaxlib in the build requirements) and a C++17 compiler. Each SIMD path carries
its own target attributes, so the file is compiled for the baseline ISA and picks a path at
run time.
"""
import sys

from setuptools import Extension, setup


def _ffi_include_dir() -> str:
    import jax.ffi  # jaxlib's headers; jax itself is installed alongside by the build requires

    return jax.ffi.include_dir()


def _extensions():
    if sys.platform == "win32":  # no MSVC flags below; the jnp reference serves there
        return []
    return [Extension(
        f"ninfer_jax.kernels.{name}",
        sources=[f"ninfer_jax/kernels/{source}"],
        depends=[f"ninfer_jax/kernels/{header}" for header in headers],  # rebuilt, and in sdists
        include_dirs=[_ffi_include_dir()],
        language="c++",
        extra_compile_args=["-std=c++17", "-O3", "-w"],
    ) for name, source, headers in (
        ("quant_matmul.cpu._ggml_matmul", "quant_matmul/cpu/ggml_matmul.cc", ()),
        ("paged_attention.cpu._decode_attention", "paged_attention/cpu/decode_attention.cc",
         ("paged_attention/cpu/decode_attention_simd.h",)),
    )]


setup(ext_modules=_extensions())
