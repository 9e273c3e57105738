"""The one switch between GPU kernels and their pure-jnp references, read at trace time.

Kernels run when the default JAX backend is a GPU, unless NINFER_FORCE_REFERENCE is set to
anything but "" or "0" (for debugging a suspected kernel bug: the references are the oracle).
"""
from __future__ import annotations

import os

import jax

FORCE_REFERENCE_ENV = "NINFER_FORCE_REFERENCE"


def forced_reference() -> bool:
    """True when NINFER_FORCE_REFERENCE asks for the references on every backend."""
    return os.environ.get(FORCE_REFERENCE_ENV, "") not in ("", "0")


def use_kernels() -> bool:
    """True when the GPU kernels should run (GPU backend, not forced to the reference)."""
    return not forced_reference() and jax.default_backend() == "gpu"


def switch(env: str, default: bool) -> bool:
    """A kernel's on / off switch read while tracing: the environment variable `env` when set
    ("1" or "0", anything else is an error), else the module's `default`."""
    override = os.environ.get(env, "")
    if override not in ("", "0", "1"):
        raise ValueError(f"{env}={override!r}: expected 1 or 0")
    return override == "1" if override else default
