"""Our C++ CPU kernels (built by setup.py next to their package) found and registered with
XLA as FFI targets: the one place that knows how a built extension is named and loaded."""
from __future__ import annotations

import ctypes
import importlib.machinery
import pathlib

import jax


def load(package_file: str, stem: str, target: str) -> ctypes.CDLL | None:
    """The extension `stem` built beside `package_file` (any Python extension suffix), its
    handler symbol `target` registered as the CPU FFI target of the same name; None when it
    is not built (callers fall back to their jnp reference)."""
    here = pathlib.Path(package_file).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"{stem}{suffix}"
        if path.exists():
            library = ctypes.CDLL(str(path))
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, target)),
                                        platform="cpu")
            return library
    return None
