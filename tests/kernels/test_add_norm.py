"""The residual add and its RMSNorm (kernels/norms): the Pallas kernel against its jnp twin in
interpret mode (bfloat16 and float32, plain and zero-centred weights, power-of-two and other
widths, one and several rows), the twin against numpy, the CUDA lowering at the 8B / 35B-A3B /
27B widths, natively on the GPU (`-m gpu`); model/layers.add_rms_norm's dispatch (the switch,
its override, a dtype the kernel leaves to XLA) and, with the kernel forced on in interpret
mode, the tiny Qwen3 and Qwen3.6 models' logits against the switch off."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_testkit import (assert_gpu_switch, cpu_only, interpret_calls, lowers_for_cuda,
                            needs_gpu)

from ninfer_jax.kernels import dispatch, norms
from ninfer_jax.kernels.norms import kernel, reference
from ninfer_jax.model import layers


def inputs(rng, rows, width, dtype):
    x = jnp.asarray(rng.standard_normal((rows, width)) * 3, dtype)
    delta = jnp.asarray(rng.standard_normal((rows, width)), dtype)
    weight = jnp.asarray(rng.standard_normal(width) * 0.3, jnp.float32)
    return x, delta, weight


def test_reference_is_the_add_then_the_norm():
    rng = np.random.default_rng(0)
    x, delta, weight = inputs(rng, 3, 40, jnp.float32)
    for zero_centred in (False, True):
        total, normed = reference.add_rms_norm(x, delta, weight, eps=1e-6,
                                               zero_centred=zero_centred)
        t = np.asarray(x, np.float64) + np.asarray(delta, np.float64)
        w = np.asarray(weight, np.float64) + (1.0 if zero_centred else 0.0)
        want = t / np.sqrt((t * t).mean(-1, keepdims=True) + 1e-6) * w
        np.testing.assert_allclose(np.asarray(total), t, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(normed), want, rtol=1e-5, atol=1e-5)


@cpu_only
@pytest.mark.parametrize("rows,width", [(1, 64), (2, 80), (5, 256)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("zero_centred", [False, True])
def test_kernel_in_interpret_mode_matches_the_reference(rows, width, dtype, zero_centred):
    rng = np.random.default_rng(rows * width)
    args = inputs(rng, rows, width, dtype)
    got = jax.jit(functools.partial(kernel.add_rms_norm, eps=1e-6, zero_centred=zero_centred,
                                    interpret=True))(*args)
    want = reference.add_rms_norm(*args, eps=1e-6, zero_centred=zero_centred)
    for a, b in zip(got, want):
        assert a.dtype == dtype and a.shape == (rows, width)
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=1e-5 if dtype == jnp.float32 else 1e-2,
                                   atol=1e-5 if dtype == jnp.float32 else 1e-2)
    # the sum is rounded exactly as XLA's add rounds it
    np.testing.assert_array_equal(np.asarray(got[0], np.float32),
                                  np.asarray(want[0], np.float32))


def test_kernel_leaves_mixed_dtypes_to_xla():
    x = jnp.zeros((2, 64), jnp.bfloat16)
    assert kernel.add_rms_norm(x, x.astype(jnp.float32), jnp.ones(64), eps=1e-6) is None


@pytest.mark.parametrize("width", [4096, 2048, 5120])
def test_kernel_lowers_for_cuda(width):
    spec = jax.ShapeDtypeStruct
    args = (spec((2, width), jnp.bfloat16), spec((2, width), jnp.bfloat16),
            spec((width,), jnp.float32))
    fn = functools.partial(kernel.add_rms_norm, eps=1e-6, zero_centred=True)
    assert "ninfer_add_rms_norm" in lowers_for_cuda(fn, *args)


@needs_gpu
@pytest.mark.parametrize("rows,width", [(2, 4096), (64, 2048), (3, 5120)])
def test_kernel_on_the_gpu_matches_the_reference(rows, width):
    args = inputs(np.random.default_rng(width), rows, width, jnp.bfloat16)
    got = kernel.add_rms_norm(*args, eps=1e-6, zero_centred=True)
    want = reference.add_rms_norm(*args, eps=1e-6, zero_centred=True)
    np.testing.assert_array_equal(np.asarray(got[0], np.float32),
                                  np.asarray(want[0], np.float32))
    np.testing.assert_allclose(np.asarray(got[1], np.float32), np.asarray(want[1], np.float32),
                               rtol=1e-2, atol=1e-2)


def test_switch_and_override(monkeypatch):
    assert_gpu_switch(monkeypatch, norms.add_norm_kernel_on, norms.ADD_NORM_ENV,
                      norms.GPU_ADD_NORM)


def force_kernel(monkeypatch, calls):
    """Kernels on (interpret mode, counted) for model/layers.add_rms_norm."""
    real = kernel.add_rms_norm

    def spy(*args, **kwargs):
        out = real(*args, **kwargs, interpret=True)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(dispatch, "use_kernels", lambda: True)
    monkeypatch.setenv(norms.ADD_NORM_ENV, "1")
    monkeypatch.setattr(kernel, "add_rms_norm", spy)


def test_layers_dispatch_takes_the_kernel_when_on_and_xla_otherwise(monkeypatch):
    rng = np.random.default_rng(3)
    x, delta, weight = inputs(rng, 2, 64, jnp.float32)
    plain = layers.add_rms_norm(x, delta, weight, 1e-6)
    np.testing.assert_array_equal(np.asarray(plain[0]), np.asarray(x + delta))
    np.testing.assert_array_equal(np.asarray(plain[1]),
                                  np.asarray(layers.rms_norm(x + delta, weight, 1e-6)))
    calls = []
    force_kernel(monkeypatch, calls)
    fused = layers.add_rms_norm(x, delta, weight, 1e-6, zero_centred=True)
    assert calls == [True]
    want = layers.zero_centred_rms_norm(x + delta, weight, 1e-6)
    np.testing.assert_allclose(np.asarray(fused[1]), np.asarray(want), rtol=1e-5, atol=1e-5)
    layers.add_rms_norm(x, delta.astype(jnp.bfloat16), weight, 1e-6)  # promotes: XLA's
    assert calls == [True, False]


def test_add_then_next_norm_joins_the_next_layers_norm_unless_something_sits_between(
        monkeypatch):
    rng = np.random.default_rng(4)
    x, delta, weight = inputs(rng, 2, 64, jnp.float32)
    extra = jnp.asarray(rng.standard_normal((2, 64)), jnp.float32)
    calls = []
    force_kernel(monkeypatch, calls)
    total, normed = layers.add_then_next_norm(x, delta, weight, 1e-6)
    assert calls == [True]
    np.testing.assert_allclose(np.asarray(normed),
                               np.asarray(layers.rms_norm(x + delta, weight, 1e-6)),
                               rtol=1e-5, atol=1e-5)
    total, normed = layers.add_then_next_norm(x, delta, None, 1e-6)  # the last layer
    assert normed is None and calls == [True]
    np.testing.assert_array_equal(np.asarray(total), np.asarray(x + delta))
    total, normed = layers.add_then_next_norm(x, delta, weight, 1e-6, zero_centred=True,
                                              extra=extra)  # deepstack between
    assert calls == [True]
    np.testing.assert_array_equal(np.asarray(total), np.asarray(x + delta + extra))
    np.testing.assert_array_equal(
        np.asarray(normed), np.asarray(layers.zero_centred_rms_norm(total, weight, 1e-6)))


@cpu_only
@pytest.mark.parametrize("preset,module", [("qwen3-tiny", "llama"), ("qwen3.6-tiny-moe", "hybrid")])
def test_models_with_the_kernel_forced_on_give_the_same_logits(monkeypatch, preset, module):
    """A prefill of the tiny Qwen3 (plain norm) and Qwen3.6-MoE (zero-centred, Gated DeltaNet
    and attention layers) with every layer's attention add and MLP norm, and every MLP add but
    the last with the next layer's attention norm, through the kernel (interpret mode; the
    other kernels stay on their references) against the switch off."""
    import types

    from ninfer_jax.artifact.presets import PRESETS
    from ninfer_jax.artifact.random_init import random_params
    from ninfer_jax.engine.runner import JaxRunner
    from ninfer_jax.model import hybrid, llama

    config = PRESETS[preset].config
    artifact = types.SimpleNamespace(config=config,
                                     params=random_params(config, seed=4, dtype="f32"))
    runner = JaxRunner(artifact, num_pages=16, page_size=8, max_batch=2, max_context=64,
                       prefill_chunk=32, background_compile=False)
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, config.vocab_size, 32), jnp.int32)
    table = jnp.arange(1, 5, dtype=jnp.int32)
    model = {"llama": llama, "hybrid": hybrid}[module]
    extra = (jnp.int32(1),) if module == "hybrid" else ()

    def logits():
        out, _ = model.prefill(runner.params, runner.kv, tokens, jnp.int32(0), jnp.int32(29),
                               table, *extra, config=runner.config, page_size=8)
        return np.asarray(out)

    want = logits()
    monkeypatch.setattr(norms, "add_norm_kernel_on", lambda: True)
    calls = interpret_calls(monkeypatch, kernel, "add_rms_norm")
    got = logits()
    assert len(calls) == 2 * config.num_layers - 1
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
