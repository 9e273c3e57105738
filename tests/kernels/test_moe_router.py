"""The softmax router's tail (kernels/moe/routing.py): the Pallas kernel (routing_kernel.py)
against the jnp reference, in interpret mode on CPU over rows 1 / 2 / 5 / 8, E 16 / 64 / 256,
k 2 / 8, with and without the shared expert's column, live masks (all, none given, some, none
live, the first row dead) and logits with ties and -inf; lowered for CUDA at the 35B-A3B
shape; natively on the GPU (`-m gpu`). The switch and its override; the dispatch; and
moe_mlp with the kernel forced on (interpret mode) against the switch off, on the tiny
Qwen3.6-MoE layer folded, unfolded, unfused, and folded with its gate unfused.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_testkit import cpu_only, lowers_for_cuda, needs_gpu

from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.kernels import dispatch
from ninfer_jax.kernels.moe import routing, routing_kernel
from ninfer_jax.model import moe_mlp
from ninfer_jax.model.fused_projections import FOLD_ENV, fuse_projections


def live_masks(rng, num_rows):
    """(name, bool [N] or None): every padding pattern the substitution must handle."""
    masks = [("none given", None), ("all", np.ones(num_rows, bool)),
             ("none live", np.zeros(num_rows, bool)),
             ("some", rng.random(num_rows) < 0.5)]
    if num_rows > 1:
        first_dead = np.ones(num_rows, bool)
        first_dead[0] = False
        masks.append(("first dead", first_dead))
    return [(name, None if m is None else jnp.asarray(m)) for name, m in masks]


def router_logits(rng, num_rows, num_experts, shared_expert, kind):
    """f32 [N, E (+1)]: "normal", or "ties" (a few distinct values, and -inf in row 0)."""
    shape = (num_rows, num_experts + shared_expert)
    if kind == "normal":
        return jnp.asarray(rng.standard_normal(shape) * 3, jnp.float32)
    logits = rng.integers(0, 3, shape).astype(np.float32)
    logits[0, : num_experts - 3] = -np.inf  # fewer finite logits than k: -inf ones are kept
    return jnp.asarray(logits)


def assert_matches_reference(fn, logits, live, **static):
    ids, weights = fn(logits, live)
    want_ids, want_weights = routing.reference_softmax_top_experts(logits, live, **static)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
    np.testing.assert_allclose(np.asarray(weights), np.asarray(want_weights),
                               atol=1e-6, rtol=1e-6)


@cpu_only
@pytest.mark.parametrize("shared_expert", [False, True])
@pytest.mark.parametrize("top_k", [2, 8])
@pytest.mark.parametrize("num_experts", [16, 64, 256])
@pytest.mark.parametrize("num_rows", [1, 2, 5, 8])
def test_kernel_in_interpret_mode_matches_the_reference(num_rows, num_experts, top_k,
                                                        shared_expert):
    rng = np.random.default_rng(num_rows * 1000 + num_experts + top_k)
    static = dict(num_experts=num_experts, top_k=top_k, shared_expert=shared_expert)
    fn = jax.jit(functools.partial(routing_kernel.softmax_top_experts, interpret=True,
                                   **static))
    for kind in ("normal", "ties"):
        logits = router_logits(rng, num_rows, num_experts, shared_expert, kind)
        for _, live in live_masks(rng, num_rows):
            assert_matches_reference(fn, logits, live, **static)


@cpu_only
def test_kernel_writes_the_weights_in_the_dtype_asked_for():
    """bfloat16 weights (the expert kernels' dtype, model/moe_mlp.py): the float32 weights
    rounded once, as the reference rounds them."""
    rng = np.random.default_rng(3)
    static = dict(num_experts=64, top_k=8, shared_expert=True, weights_dtype=jnp.bfloat16)
    logits = router_logits(rng, 5, 64, True, "normal")
    live = jnp.asarray([True, False, True, True, False])
    ids, weights = jax.jit(functools.partial(routing_kernel.softmax_top_experts,
                                             interpret=True, **static))(logits, live)
    want_ids, want_weights = routing.reference_softmax_top_experts(logits, live, **static)
    assert weights.dtype == want_weights.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
    np.testing.assert_allclose(np.asarray(weights, np.float32),
                               np.asarray(want_weights, np.float32), rtol=8e-3)
    assert np.all(np.asarray(weights, np.float32)[[1, 4]] == 0)


def test_the_kernel_takes_only_power_of_two_experts():
    logits = jnp.zeros((2, 24), jnp.float32)
    assert routing_kernel.softmax_top_experts(logits, None, num_experts=24, top_k=2) is None


@pytest.mark.parametrize("shared_expert", [False, True])
@pytest.mark.parametrize("num_rows", [1, 2, 64])
def test_kernel_lowers_for_cuda_at_the_35b_a3b_shape(num_rows, shared_expert):
    spec = jax.ShapeDtypeStruct
    fn = functools.partial(routing_kernel.softmax_top_experts, num_experts=256, top_k=8,
                           shared_expert=shared_expert)
    text = lowers_for_cuda(fn, spec((num_rows, 257), jnp.float32),
                           spec((num_rows,), jnp.bool_))
    assert "ninfer_moe_router" in text and "TopK" not in text


@needs_gpu
@pytest.mark.parametrize("shared_expert", [False, True])
@pytest.mark.parametrize("num_rows", [1, 2, 8, 64])
def test_kernel_on_the_gpu_matches_the_reference(num_rows, shared_expert):
    rng = np.random.default_rng(num_rows)
    static = dict(num_experts=256, top_k=8, shared_expert=shared_expert)
    fn = jax.jit(functools.partial(routing_kernel.softmax_top_experts, **static))
    reference = jax.jit(functools.partial(routing.reference_softmax_top_experts, **static))
    for kind in ("normal", "ties"):
        logits = router_logits(rng, num_rows, 256, shared_expert, kind)
        for name, live in live_masks(rng, num_rows):
            ids, weights = fn(logits, live)
            want_ids, want_weights = reference(logits, live)
            np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids), err_msg=name)
            np.testing.assert_allclose(np.asarray(weights), np.asarray(want_weights),
                                       atol=1e-6, rtol=1e-5, err_msg=name)


# ------------------------------------------------------------------- switch and dispatch

def test_the_router_kernel_switch_and_its_override(monkeypatch):
    monkeypatch.delenv(routing.ROUTER_ENV, raising=False)
    assert routing.router_kernel_on() == routing.GPU_ROUTER_KERNEL
    monkeypatch.setenv(routing.ROUTER_ENV, "1")
    assert routing.router_kernel_on()
    monkeypatch.setenv(routing.ROUTER_ENV, "0")
    monkeypatch.setattr(routing, "GPU_ROUTER_KERNEL", True)
    assert not routing.router_kernel_on()
    monkeypatch.setenv(routing.ROUTER_ENV, "yes")
    with pytest.raises(ValueError, match=routing.ROUTER_ENV):
        routing.router_kernel_on()


def recorded_kernel(monkeypatch):
    """routing_kernel.softmax_top_experts in interpret mode, recording what it returned."""
    calls, real = [], routing_kernel.softmax_top_experts

    def kernel(*args, **kwargs):
        result = real(*args, interpret=True, **kwargs)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(routing_kernel, "softmax_top_experts", kernel)
    return calls


def test_dispatch_takes_the_kernel_only_on_a_gpu_with_the_switch_on(monkeypatch):
    calls = recorded_kernel(monkeypatch)

    def route(rows, experts=16):
        return routing.softmax_top_experts(jnp.zeros((rows, experts)), None,
                                           num_experts=experts, top_k=2)

    monkeypatch.setenv(routing.ROUTER_ENV, "1")
    monkeypatch.setattr(dispatch, "use_kernels", lambda: False)
    route(2)  # no GPU (or NINFER_FORCE_REFERENCE): the reference
    monkeypatch.setattr(dispatch, "use_kernels", lambda: True)
    route(2)
    route(routing.MAX_KERNEL_ROWS + 1)  # a prefill chunk: the reference
    monkeypatch.setenv(routing.ROUTER_ENV, "0")
    route(2)
    assert calls == [True]
    monkeypatch.setenv(routing.ROUTER_ENV, "1")
    ids, _ = route(2, experts=24)  # E not a power of two: the kernel declines
    assert calls == [True, False] and ids.shape == (2, 2)


# ------------------------------------------------------------------------- model level

def moe_layer(variant, monkeypatch):
    """(config, layer) of the tiny Qwen3.6-MoE's first MoE layer, f32, as the runner holds it:
    "folded" (router | shared_gate fused, shared expert as expert E), "unfolded" (fused,
    NINFER_FOLD_SHARED_EXPERT=0), "unfused" (separate leaves), "folded, gate unfused"."""
    config = PRESETS["qwen3.6-tiny-moe"].config
    monkeypatch.setenv(FOLD_ENV, "0" if variant == "unfolded" else "1")
    params = random_params(config, seed=3, dtype="f32")
    if variant != "unfused":
        params = fuse_projections(params, config)
    index = next(i for i in range(config.num_layers) if config.is_moe_layer(i))
    layer = {name: jnp.asarray(leaf) for name, leaf in params["layers"][index].items()}
    if variant == "folded, gate unfused":
        fused = layer.pop("router_shared_gate")
        layer["router"], layer["shared_gate"] = fused[:, :-1], fused[:, -1:]
    return config, layer


@cpu_only
@pytest.mark.parametrize("variant", ["folded", "unfolded", "unfused", "folded, gate unfused"])
@pytest.mark.parametrize("live", [None, (False, True, False, True), (False,) * 4])
def test_moe_mlp_with_the_kernel_on_equals_the_switch_off(variant, live, monkeypatch):
    config, layer = moe_layer(variant, monkeypatch)
    assert moe_mlp.is_folded(layer, config) == variant.startswith("folded")
    rng = np.random.default_rng(len(variant))
    x = jnp.asarray(rng.standard_normal((4, config.hidden_size)), jnp.float32)
    live = None if live is None else jnp.asarray(live)

    def step():  # a new function each time: the switches are read while tracing
        return jax.jit(lambda x, live: moe_mlp.moe_mlp(x, layer, config, live=live))(x, live)

    with jax.default_matmul_precision("highest"):
        want = step()
        calls = recorded_kernel(monkeypatch)
        monkeypatch.setattr(dispatch, "use_kernels", lambda: True)
        monkeypatch.setenv(routing.ROUTER_ENV, "1")
        got = step()
    assert calls == [True]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=1e-5)


def test_the_router_without_norm_topk_prob_never_takes_the_kernel(monkeypatch):
    """norm_topk_prob False keeps its jnp router whatever the switch."""
    calls = recorded_kernel(monkeypatch)
    config, layer = moe_layer("unfused", monkeypatch)
    config = dataclasses.replace(config, norm_topk_prob=False)
    monkeypatch.setattr(dispatch, "use_kernels", lambda: True)
    monkeypatch.setenv(routing.ROUTER_ENV, "1")
    x = jnp.ones((2, config.hidden_size), jnp.float32)
    ids, weights, _ = moe_mlp.route_softmax(x, layer, config)
    assert calls == [] and ids.shape == weights.shape == (2, config.num_experts_per_tok)
