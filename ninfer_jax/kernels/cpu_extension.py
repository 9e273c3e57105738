"""Our C++ CPU kernels (built by setup.py next to their package) found and registered with
XLA as FFI targets: the one place that knows how a built extension is named and loaded."""
from __future__ import annotations

import ctypes
import importlib.machinery
import pathlib
import threading

import jax


_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str], ctypes.CDLL | None] = {}


def load(package_file: str, stem: str, *targets: str) -> ctypes.CDLL | None:
    """The extension `stem` built beside `package_file` (any Python extension suffix), each
    handler symbol in `targets` registered as the CPU FFI target of the same name; None when
    it is not built (callers fall back to their jnp reference). Once per process, under a
    lock: the runner traces steps on several compile threads, and two first calls at once
    would register a target twice."""
    here = pathlib.Path(package_file).parent
    with _LOCK:
        key = (str(here), stem)
        if key in _LOADED:
            return _LOADED[key]
        library = None
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = here / f"{stem}{suffix}"
            if path.exists():
                library = ctypes.CDLL(str(path))
                for target in targets:
                    jax.ffi.register_ffi_target(
                        target, jax.ffi.pycapsule(getattr(library, target)), platform="cpu")
                break
        _LOADED[key] = library
        return library
