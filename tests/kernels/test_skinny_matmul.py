"""The skinny (decode) 16-bit matmul (kernels/skinny_matmul): the kernel against its twin in
interpret mode over 1 / 2 / 5 / 16 rows, one and several K splits, float32 and bfloat16; what
it declines; its tiles; the CUDA lowering at the 8B's projections; natively on the GPU."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_testkit import cpu_only, interpret_calls, lowers_for_cuda, needs_gpu

from ninfer_jax.kernels.skinny_matmul import kernel, reference
from ninfer_jax.kernels.skinny_matmul.kernel import SkinnyTiles, skinny_tiles


@cpu_only
@pytest.mark.parametrize("rows", [1, 2, 5, 16])
@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kernel_in_interpret_mode_matches_the_reference(rows, splits, dtype):
    rng = np.random.default_rng(rows * 10 + splits)
    x = jnp.asarray(rng.standard_normal((rows, 128)), dtype)
    w = jnp.asarray(rng.standard_normal((128, 96)) * 0.1, dtype)
    tiles = SkinnyTiles(block_k=32, block_n=32, num_splits=splits, num_stages=1)
    got = jax.jit(functools.partial(kernel.skinny_matmul, tiles=tiles, interpret=True))(x, w)
    want = reference.skinny_matmul(x, w)
    assert got.dtype == dtype and got.shape == (rows, 96)
    tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tolerance, atol=tolerance)


@cpu_only
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_swiglu_form_in_interpret_mode_matches_the_reference(rows, splits, dtype):
    rng = np.random.default_rng(rows * 10 + splits + 5)
    y = jnp.asarray(rng.standard_normal((rows, 256)) * 2, dtype)  # gate | up, 128 each
    w = jnp.asarray(rng.standard_normal((128, 64)) * 0.1, dtype)
    tiles = SkinnyTiles(block_k=32, block_n=32, num_splits=splits, num_stages=1)
    got = jax.jit(functools.partial(kernel.skinny_matmul, swiglu=True, tiles=tiles,
                                    interpret=True))(y, w)
    want = reference.skinny_matmul(y, w, swiglu=True)
    assert got.dtype == dtype and got.shape == (rows, 64)
    tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tolerance, atol=tolerance)


def test_swiglu_reference_is_the_models_gated_mlp():
    rng = np.random.default_rng(11)
    y = jnp.asarray(rng.standard_normal((2, 64)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((32, 16)), jnp.float32)
    gate, up = y[:, :32], y[:, 32:]
    want = (gate * jax.nn.sigmoid(gate) * up) @ w
    np.testing.assert_allclose(np.asarray(reference.skinny_matmul(y, w, swiglu=True)),
                               np.asarray(want), rtol=1e-5, atol=1e-5)


def test_kernel_declines_what_it_does_not_cover():
    w = jnp.zeros((128, 64), jnp.bfloat16)
    assert kernel.skinny_matmul(jnp.zeros((17, 128), jnp.bfloat16), w) is None
    assert kernel.skinny_matmul(jnp.zeros((2, 128), jnp.float32), w) is None
    assert kernel.skinny_matmul(jnp.zeros((2, 128), jnp.bfloat16),
                                jnp.zeros((128, 24), jnp.bfloat16)) is None


def test_tiles_divide_the_weight_and_split_small_ones():
    for k, n in ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)):
        tiles = skinny_tiles(k=k, n=n)
        assert k % (tiles.block_k * tiles.num_splits) == 0 and n % tiles.block_n == 0
        assert k // tiles.block_k // tiles.num_splits >= 4
    assert skinny_tiles(k=4096, n=4096).num_splits > 1  # 32 column blocks alone: too few
    assert skinny_tiles(k=4096, n=28672).num_splits == 2


@pytest.mark.parametrize("k,n,swiglu", [(4096, 6144, False), (14336, 4096, False),
                                        (12288, 4096, True)])
def test_kernel_lowers_for_cuda(k, n, swiglu):
    spec = jax.ShapeDtypeStruct
    width = 2 * k if swiglu else k
    text = lowers_for_cuda(functools.partial(kernel.skinny_matmul, swiglu=swiglu),
                           spec((2, width), jnp.bfloat16), spec((k, n), jnp.bfloat16))
    assert "ninfer_skinny_matmul" in text


@needs_gpu
@pytest.mark.parametrize("rows,swiglu", [(1, False), (2, False), (8, False), (2, True),
                                         (16, True)])
def test_kernel_on_the_gpu_matches_the_reference(rows, swiglu):
    rng = np.random.default_rng(rows)
    k = 12288 if swiglu else 4096
    x = jnp.asarray(rng.standard_normal((rows, 2 * k if swiglu else k)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((k, 4096 if swiglu else 6144)) * 0.02, jnp.bfloat16)
    got = np.asarray(kernel.skinny_matmul(x, w, swiglu=swiglu), np.float32)
    want = np.asarray(reference.skinny_matmul(x, w, swiglu=swiglu), np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=5e-2 if swiglu else 2e-2)


@cpu_only
def test_linear_takes_the_kernel_for_few_rows_when_switched_on(monkeypatch):
    """quant_matmul.matmul (every model's `linear`): a plain weight times up to 16 rows through
    the kernel (interpret mode, counted) when the switch is on, XLA's dot for more rows, a
    wider result or the switch off; the result is the product either way."""
    from ninfer_jax.kernels import dispatch, quant_matmul, skinny_matmul

    rng = np.random.default_rng(7)
    w = jnp.asarray(rng.standard_normal((256, 128)) * 0.1, jnp.float32)
    calls = interpret_calls(monkeypatch, kernel, "skinny_matmul", lambda a, k: a[0].shape)
    x = jnp.asarray(rng.standard_normal((2, 1, 256)), jnp.float32)
    plain = quant_matmul.matmul(x, w)
    assert calls == []
    monkeypatch.setattr(dispatch, "use_kernels", lambda: True)
    monkeypatch.setenv(skinny_matmul.SKINNY_ENV, "1")
    assert skinny_matmul.skinny_on()
    got = quant_matmul.matmul(x, w)
    assert calls == [(2, 256)] and got.shape == (2, 1, 128)
    np.testing.assert_allclose(np.asarray(got), np.asarray(plain), rtol=1e-5, atol=1e-5)
    quant_matmul.matmul(jnp.zeros((17, 256), jnp.float32), w)
    quant_matmul.matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), out_dtype=jnp.float32)
    assert calls == [(2, 256)]
    monkeypatch.setenv(skinny_matmul.SKINNY_ENV, "0")
    assert not skinny_matmul.skinny_on()


@cpu_only
def test_gated_mlp_takes_the_swiglu_form_when_switched_on(monkeypatch):
    """model/layers.swiglu_mlp with a fused gate | up: the down product through the kernel's
    swiglu form (interpret mode, counted) when the switch is on and the rows few; the same
    output as the activation then the product."""
    from ninfer_jax.kernels import dispatch, skinny_matmul
    from ninfer_jax.model import layers

    rng = np.random.default_rng(12)
    layer = {"w_gate_up": jnp.asarray(rng.standard_normal((64, 256)) * 0.2, jnp.float32),
             "w_down": jnp.asarray(rng.standard_normal((128, 64)) * 0.2, jnp.float32)}
    x = jnp.asarray(rng.standard_normal((2, 64)), jnp.float32)
    plain = layers.swiglu_mlp(x, layer)
    calls = interpret_calls(monkeypatch, kernel, "skinny_matmul",
                            lambda a, k: k.get("swiglu", False))
    monkeypatch.setattr(dispatch, "use_kernels", lambda: True)
    monkeypatch.setenv(skinny_matmul.SKINNY_ENV, "1")
    got = layers.swiglu_mlp(x, layer)
    assert calls == [False, True]  # gate | up, then the down product with the activation
    np.testing.assert_allclose(np.asarray(got), np.asarray(plain), rtol=1e-4, atol=1e-4)
