"""Shared helpers for kernel tests: random paged caches, backend checks, CUDA lowering."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, Jaxpr

from ninfer_jax.kernels.paged_attention.reference import DUMMY_PAGE

ON_GPU = jax.default_backend() == "gpu"


def needs_gpu(test):
    """Marked `gpu` (`-m gpu` selects the native runs on the device machine) and skipped
    without one."""
    skip = pytest.mark.skipif(not ON_GPU, reason="needs a GPU (run on the device machine)")
    return pytest.mark.gpu(skip(test))


cpu_only = pytest.mark.skipif(ON_GPU, reason="interpret-mode check; the GPU runs natively")


def paged_setup(rng, *, batch, lengths, num_kv_heads, head_dim, page_size, dtype=jnp.float32,
                spare_pages=3):
    """Caches [P, K, S, D] filled with noise and, per row, a page table of distinct shuffled
    pages (never DUMMY_PAGE) covering its length, padded with DUMMY_PAGE to one width."""
    pages_per_row = [-(-n // page_size) for n in lengths]
    width = max(pages_per_row)
    num_pages = sum(pages_per_row) + spare_pages + 1
    owned = rng.permutation(np.arange(1, num_pages))
    table = np.full((batch, width), DUMMY_PAGE, np.int32)
    cursor = 0
    for row, count in enumerate(pages_per_row):
        table[row, :count] = owned[cursor:cursor + count]
        cursor += count
    shape = (num_pages, num_kv_heads, page_size, head_dim)
    k = jnp.asarray(rng.standard_normal(shape), dtype)
    v = jnp.asarray(rng.standard_normal(shape), dtype)
    return k, v, jnp.asarray(table), jnp.asarray(np.asarray(lengths, np.int32))


def relative_error(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out)), "non-finite output"
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def lowers_for_cuda(fn, *args) -> str:
    """Lower `fn(*args)` for CUDA on any machine: runs the Pallas Triton lowering (tile sizes,
    supported ops) without a GPU. Returns the module text."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def kernel_equations(fn, *args, primitive: str) -> list:
    """Every `primitive` equation traced by fn(*args), inside Pallas kernels and loops too, as
    (input dtypes, output dtypes): what a kernel really computes in, whatever it returns."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == primitive:
                found.append((tuple(str(v.aval.dtype) for v in eqn.invars),
                              tuple(str(v.aval.dtype) for v in eqn.outvars)))
            for param in eqn.params.values():
                for sub in param if isinstance(param, (list, tuple)) else [param]:
                    if isinstance(sub, ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, Jaxpr):
                        walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def assert_gpu_switch(monkeypatch, is_on, env: str, default: bool):
    """A kernel's switch (kernels/dispatch.switch behind use_kernels): its module default
    without the variable, "1" on, "0" off, and off whatever the variable says where kernels
    are not used (the CPU, NINFER_FORCE_REFERENCE)."""
    from ninfer_jax.kernels import dispatch

    monkeypatch.setattr(dispatch, "use_kernels", lambda: True)
    monkeypatch.delenv(env, raising=False)
    assert is_on() == default
    monkeypatch.setenv(env, "1")
    assert is_on()
    monkeypatch.setenv(env, "0")
    assert not is_on()
    monkeypatch.setenv(env, "1")
    monkeypatch.setattr(dispatch, "use_kernels", lambda: False)
    assert not is_on()


def interpret_calls(monkeypatch, module, name: str, record=lambda args, kwargs: 1) -> list:
    """Replace module.name (a Pallas kernel's entry) by itself in interpret mode, appending
    record(args, kwargs) to the returned list at every call: a model or dispatch test on the
    CPU sees where the kernel runs and what it is given."""
    real = getattr(module, name)
    calls = []

    def counted(*args, **kwargs):
        calls.append(record(args, kwargs))
        return real(*args, **kwargs, interpret=True)

    monkeypatch.setattr(module, name, counted)
    return calls
