"""Routed MoE experts: the grouped (ragged_dot) and gathered paths against the dense per-expert
loop, including experts that no token picks and a token count below the expert count; the
Pallas kernels (kernel.py) the same way in interpret mode on CPU and natively on the GPU;
both activations: SwiGLU experts and Nemotron-H's gateless relu2 experts."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_testkit import cpu_only, lowers_for_cuda, needs_gpu, relative_error

from ninfer_jax.kernels import moe
from ninfer_jax.kernels.moe import kernel, reference, tuning

NUM_EXPERTS, HIDDEN, WIDTH = 8, 24, 10


def routing(rng, num_tokens, top_k, *, skip_experts=()):
    """Distinct experts per token (as top-k gives), never one of `skip_experts`."""
    allowed = [e for e in range(NUM_EXPERTS) if e not in skip_experts]
    ids = np.stack([rng.choice(allowed, top_k, replace=False) for _ in range(num_tokens)])
    weights = rng.uniform(0.1, 1.0, (num_tokens, top_k))
    return jnp.asarray(ids, jnp.int32), jnp.asarray(weights, jnp.float32)


def expert_weights(rng, hidden=HIDDEN, width=WIDTH, num_experts=NUM_EXPERTS, dtype=jnp.float32,
                   activation="swiglu"):
    first = 2 * width if activation == "swiglu" else width
    gate_up = rng.standard_normal((num_experts, hidden, first)) * hidden ** -0.5
    down = rng.standard_normal((num_experts, width, hidden)) * width ** -0.5
    return jnp.asarray(gate_up, dtype), jnp.asarray(down, dtype)


# (tokens, k, activation): every SwiGLU shape, the gateless relu2 experts at a decode-sized
# and a prefill-sized one
SHAPES = [(1, 2, "swiglu"), (3, 2, "swiglu"), (37, 3, "swiglu"), (16, 1, "swiglu"),
          (3, 2, "relu2"), (37, 3, "relu2")]


@pytest.mark.parametrize("path", ["grouped_experts", "gathered_experts", "routed_experts"])
@pytest.mark.parametrize("num_tokens,top_k,activation", SHAPES)
def test_paths_match_the_dense_expert_loop(path, num_tokens, top_k, activation):
    rng = np.random.default_rng(num_tokens * 10 + top_k)
    x = jnp.asarray(rng.standard_normal((num_tokens, HIDDEN)), jnp.float32)
    ids, weights = routing(rng, num_tokens, top_k, skip_experts=(2, 5))
    gate_up, down = expert_weights(rng, activation=activation)
    fn = moe.routed_experts if path == "routed_experts" else getattr(reference, path)
    fn = functools.partial(fn, activation=activation)
    with jax.default_matmul_precision("highest"):
        got = jax.jit(fn)(x, ids, weights, gate_up, down)
        expected = reference.dense_experts(x, ids, weights, gate_up, down,
                                           activation=activation)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)


def test_dense_loop_is_a_weighted_sum_of_swiglu_experts():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((2, HIDDEN)), jnp.float32)
    ids, weights = routing(rng, 2, 2)
    gate_up, down = expert_weights(rng)
    with jax.default_matmul_precision("highest"):
        got = np.asarray(reference.dense_experts(x, ids, weights, gate_up, down))
    for n in range(2):
        expected = np.zeros(HIDDEN)
        for j in range(2):
            e = int(ids[n, j])
            h = np.asarray(x[n]) @ np.asarray(gate_up[e])
            gate, up = h[:WIDTH], h[WIDTH:]
            expected += float(weights[n, j]) * ((gate / (1 + np.exp(-gate)) * up)
                                                @ np.asarray(down[e]))
        np.testing.assert_allclose(got[n], expected, atol=1e-5, rtol=1e-5)


def test_dense_loop_of_relu2_experts_squares_the_relu_of_one_product():
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.standard_normal((2, HIDDEN)), jnp.float32)
    ids, weights = routing(rng, 2, 2)
    up, down = expert_weights(rng, activation="relu2")
    with jax.default_matmul_precision("highest"):
        got = np.asarray(reference.dense_experts(x, ids, weights, up, down, activation="relu2"))
    for n in range(2):
        expected = sum(float(weights[n, j]) * (np.maximum(np.asarray(x[n]) @ np.asarray(
            up[int(ids[n, j])]), 0) ** 2 @ np.asarray(down[int(ids[n, j])])) for j in range(2))
        np.testing.assert_allclose(got[n], expected, atol=1e-5, rtol=1e-5)


# Kernel shapes: Triton tiles are powers of two of at least 16.
KERNEL_HIDDEN, KERNEL_WIDTH = 64, 32


@cpu_only
@pytest.mark.parametrize("path", ["gathered_experts", "grouped_experts"])
@pytest.mark.parametrize("num_tokens,top_k,activation", [s for s in SHAPES if s[1] > 1])
def test_kernels_in_interpret_mode_match_the_dense_loop(path, num_tokens, top_k, activation):
    rng = np.random.default_rng(num_tokens * 10 + top_k)
    x = jnp.asarray(rng.standard_normal((num_tokens, KERNEL_HIDDEN)), jnp.float32)
    ids, weights = routing(rng, num_tokens, top_k, skip_experts=(2, 5))
    gate_up, down = expert_weights(rng, KERNEL_HIDDEN, KERNEL_WIDTH, activation=activation)
    fn = functools.partial(getattr(kernel, path), activation=activation, interpret=True)
    with jax.default_matmul_precision("highest"):
        got = jax.jit(fn)(x, ids, weights, gate_up, down)
        expected = reference.dense_experts(x, ids, weights, gate_up, down,
                                           activation=activation)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-5, rtol=2e-5)


@cpu_only
@pytest.mark.parametrize("activation_at", ["fusion", "down"])
@pytest.mark.parametrize("activation", ["swiglu", "relu2"])
def test_expert_gemv_on_the_tensor_cores_equals_the_fma_loop_in_interpret_mode(
        activation, activation_at, monkeypatch):
    """NINFER_MOE_GEMV_DOT=1: each assignment's row padded to DOT_ROWS rows through a dot;
    bfloat16 weights (the only ones it takes), padding rows (zero weights) included."""
    monkeypatch.setattr(kernel, "ACTIVATION_AT", activation_at)
    rng = np.random.default_rng(12)
    x = jnp.asarray(rng.standard_normal((3, KERNEL_HIDDEN)), jnp.bfloat16)
    ids, weights = routing(rng, 3, 2)
    weights = weights.at[1].set(0.0)
    gate_up, down = expert_weights(rng, KERNEL_HIDDEN, KERNEL_WIDTH, dtype=jnp.bfloat16,
                                   activation=activation)
    fn = jax.jit(functools.partial(kernel.gathered_experts, activation=activation,
                                   interpret=True))
    monkeypatch.setenv(kernel.GEMV_DOT_ENV, "0")
    fma = fn(x, ids, weights, gate_up, down)
    monkeypatch.setenv(kernel.GEMV_DOT_ENV, "1")
    assert kernel.gemv_on_tensor_cores(jnp.bfloat16)
    assert not kernel.gemv_on_tensor_cores(jnp.float32)  # TF32 on a GPU: never
    dot = jax.jit(functools.partial(kernel.gathered_experts, activation=activation,
                                    interpret=True))(x, ids, weights, gate_up, down)
    np.testing.assert_allclose(np.asarray(dot, np.float32), np.asarray(fma, np.float32),
                               atol=2e-2, rtol=2e-2)  # bfloat16 outputs, sums reordered
    assert np.all(np.asarray(dot, np.float32)[1] == 0)
    monkeypatch.setenv(kernel.GEMV_DOT_ENV, "on")
    with pytest.raises(ValueError, match="NINFER_MOE_GEMV_DOT"):
        kernel.gemv_on_tensor_cores(jnp.bfloat16)


@cpu_only
@pytest.mark.parametrize("activation_at", ["fusion", "down"])
def test_expert_gemv_skips_zero_weight_assignments_in_interpret_mode(activation_at,
                                                                      monkeypatch):
    """Padding rows (model/moe_mlp.py) and other devices' experts arrive with zero weights:
    their programs read no weights (zero rows), and the result still equals the dense loop.
    Shapes with several K splits in both GEMVs, whose gate/up splits are added and activated
    by an XLA fusion or by the down GEMV itself (kernel.ACTIVATION_AT)."""
    monkeypatch.setattr(kernel, "ACTIVATION_AT", activation_at)
    rng = np.random.default_rng(11)
    hidden, width = 512, 256
    x = jnp.asarray(rng.standard_normal((3, hidden)), jnp.float32)
    ids, weights = routing(rng, 3, 2)
    weights = weights.at[1].set(0.0).at[2, 0].set(0.0)
    gate_up, down = expert_weights(rng, hidden, width)
    used = (weights.reshape(-1) != 0).astype(jnp.int32)
    up_tiles = tuning.gemv_tiles(assignments=6, k=hidden, n=2 * width)
    down_tiles = tuning.gemv_tiles(assignments=6, k=width, n=hidden)
    assert up_tiles.num_splits > 1 and down_tiles.num_splits > 1
    with jax.default_matmul_precision("highest"):
        rows = kernel._expert_gemv(x, ids.reshape(-1), weights.reshape(-1), gate_up,
                                   rows_per_input=2,
                                   tiles=up_tiles, interpret=True).sum(axis=0)
        got = jax.jit(functools.partial(kernel.gathered_experts, interpret=True))(
            x, ids, weights, gate_up, down)
        expected = reference.dense_experts(x, ids, weights, gate_up, down)
    rows = np.asarray(rows)
    assert np.all(rows[used == 0] == 0) and np.all(np.abs(rows[used == 1]).max(axis=1) > 0)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-5, rtol=2e-5)


@cpu_only
@pytest.mark.parametrize("activation", ["swiglu", "relu2"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fused_expert_mlp_matches_the_dense_loop_in_interpret_mode(activation, dtype,
                                                                    monkeypatch):
    """NINFER_MOE_FUSED_MLP=1: one program per (assignment, width block) runs both products;
    zero-weight assignments (a padding row, one expert of another row) store zeros, and the
    result equals the dense loop (float32) or the two-GEMV path (bfloat16, same roundings)."""
    rng = np.random.default_rng(21)
    hidden, width = 256, 128
    x = jnp.asarray(rng.standard_normal((3, hidden)), dtype)
    ids, weights = routing(rng, 3, 2)
    weights = weights.at[1].set(0.0).at[2, 0].set(0.0)
    gate_up, down = expert_weights(rng, hidden, width, dtype=dtype, activation=activation)
    tiles = tuning.fused_tiles(assignments=6, hidden=hidden, width=width)
    assert width // tiles.block_i > 1 and hidden // tiles.block_n >= 1
    shares = kernel._fused_expert_mlp(x, ids.reshape(-1), weights.reshape(-1), gate_up, down,
                                      rows_per_input=2, tiles=tiles, activation=activation,
                                      interpret=True)
    used = np.asarray(weights.reshape(-1) != 0)
    assert shares.shape == (width // tiles.block_i, 6, hidden)
    assert np.all(np.asarray(shares)[:, ~used] == 0)
    fn = functools.partial(kernel.gathered_experts, activation=activation, interpret=True)
    monkeypatch.setenv(kernel.FUSED_MLP_ENV, "0")
    two_gemvs = jax.jit(fn)(x, ids, weights, gate_up, down)
    monkeypatch.setenv(kernel.FUSED_MLP_ENV, "1")
    with jax.default_matmul_precision("highest"):
        got = jax.jit(fn)(x, ids, weights, gate_up, down)
        expected = reference.dense_experts(x, ids, weights, gate_up, down,
                                           activation=activation)
    if dtype == jnp.float32:
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-5, rtol=2e-5)
    else:
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(two_gemvs, np.float32),
                                   atol=2e-2, rtol=2e-2)
    assert np.all(np.asarray(got, np.float32)[1] == 0)


def test_fused_tiles_aim_at_enough_programs():
    one_row = tuning.fused_tiles(assignments=8, hidden=2048, width=512)  # the 35B-A3B, 1 row
    assert one_row.block_i == 16 and 8 * 512 // 16 >= 256
    eight_rows = tuning.fused_tiles(assignments=64, hidden=2048, width=512)
    assert eight_rows.block_i == 64  # 512 programs already at the widest block
    assert 2048 % one_row.block_k == 0 and 2048 % one_row.block_n == 0
    assert tuning.fused_tiles(assignments=8, hidden=24, width=10) is None


def test_tile_plan_gives_each_assignment_its_own_row_in_a_tile_of_its_expert():
    rng = np.random.default_rng(3)
    ids, _ = routing(rng, 37, 3, skip_experts=(2, 5))
    tiles = tuning.grouped_tiles(assignments=37 * 3, experts=NUM_EXPERTS,
                                 hidden=KERNEL_HIDDEN, width=KERNEL_WIDTH)
    info, row_tokens, position = map(np.asarray, kernel._tile_plan(ids, NUM_EXPERTS, tiles))
    flat = np.asarray(ids).reshape(-1)
    assert len(set(position)) == len(position)  # distinct rows
    tile_of = position // tiles.block_m
    assert np.all(info[tile_of, 0] == flat) and np.all(info[tile_of, 1] == 1)
    assert np.all(row_tokens[position] == np.arange(len(flat)) // 3)
    # tiles past the routing's need are marked unused and come last
    used = info[:, 1]
    assert used.sum() == sum(-(-np.sum(flat == e) // tiles.block_m) for e in range(8))
    assert np.all(np.diff(used) <= 0)


@cpu_only
def test_grouped_kernels_give_zero_weight_assignments_no_tile_rows():
    """Padding tokens and other devices' experts (zero weights) take no rows in the tile
    plan, so they add no tiles; the grouped kernels still equal the dense loop."""
    rng = np.random.default_rng(5)
    ids, weights = routing(rng, 37, 3)
    weights = weights.at[20:].set(0.0).at[3, 1].set(0.0)
    used = np.asarray(weights) != 0
    tiles = tuning.grouped_tiles(assignments=37 * 3, experts=NUM_EXPERTS,
                                 hidden=KERNEL_HIDDEN, width=KERNEL_WIDTH)
    info, row_tokens, position = map(np.asarray, kernel._tile_plan(
        ids, NUM_EXPERTS, tiles, used=jnp.asarray(used)))
    flat, live = np.asarray(ids).reshape(-1), used.reshape(-1)
    assert info[:, 1].sum() == sum(-(-np.sum(flat[live] == e) // tiles.block_m)
                                   for e in range(NUM_EXPERTS))
    assert len(set(position[live])) == live.sum()
    assert np.all(info[position[live] // tiles.block_m, 0] == flat[live])
    assert np.all(row_tokens[position[live]] == np.flatnonzero(live) // 3)
    x = jnp.asarray(rng.standard_normal((37, KERNEL_HIDDEN)), jnp.float32)
    gate_up, down = expert_weights(rng, KERNEL_HIDDEN, KERNEL_WIDTH)
    with jax.default_matmul_precision("highest"):
        got = jax.jit(functools.partial(kernel.grouped_experts, interpret=True))(
            x, ids, weights, gate_up, down)
        expected = reference.dense_experts(x, ids, weights, gate_up, down)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-5, rtol=2e-5)


def test_shapes_without_a_tiling_fall_back_to_the_reference():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, HIDDEN)), jnp.float32)
    ids, weights = routing(rng, 3, 2)
    gate_up, down = expert_weights(rng)  # hidden 24, width 10: no power-of-two tiles
    assert kernel.routed_experts(x, ids, weights, gate_up, down) is None


@pytest.mark.parametrize("gemv", ["fma", "dot", "fused"])
@pytest.mark.parametrize("num_tokens", [1, 2, 64, 1026])
def test_kernels_lower_for_cuda_at_the_35b_a3b_shape(num_tokens, gemv, monkeypatch):
    monkeypatch.setenv(kernel.GEMV_DOT_ENV, "1" if gemv == "dot" else "0")
    monkeypatch.setenv(kernel.FUSED_MLP_ENV, "1" if gemv == "fused" else "0")
    spec = jax.ShapeDtypeStruct
    args = (spec((num_tokens, 2048), jnp.bfloat16), spec((num_tokens, 8), jnp.int32),
            spec((num_tokens, 8), jnp.float32), spec((256, 2048, 1024), jnp.bfloat16),
            spec((256, 512, 2048), jnp.bfloat16))
    # a fresh function: jit's cache would hand back a trace made under the other switches
    text = lowers_for_cuda(lambda *a: kernel.routed_experts(*a), *args)
    decode = ["ninfer_moe_fused_mlp"] if gemv == "fused" else ["ninfer_moe_expert_gemv"]
    names = (decode if num_tokens * 8 < 256
             else ["ninfer_moe_gate_up", "ninfer_moe_down"])
    assert all(name in text for name in names)
    assert "ragged" not in text  # neither ragged_dot nor its dense expansion


@pytest.mark.parametrize("num_tokens", [1, 64])
def test_relu2_kernels_lower_for_cuda_at_the_nemotron_3_nano_shape(num_tokens):
    """Hidden 2688, 128 experts of 1856, top 6: both paths tile (no reference fallback)."""
    spec = jax.ShapeDtypeStruct
    args = (spec((num_tokens, 2688), jnp.bfloat16), spec((num_tokens, 6), jnp.int32),
            spec((num_tokens, 6), jnp.float32), spec((128, 2688, 1856), jnp.bfloat16),
            spec((128, 1856, 2688), jnp.bfloat16))
    text = lowers_for_cuda(functools.partial(kernel.routed_experts, activation="relu2"), *args)
    names = (["ninfer_moe_expert_gemv"] if num_tokens * 6 < 128
             else ["ninfer_moe_up_relu2", "ninfer_moe_down"])
    assert all(name in text for name in names)
    assert "ragged" not in text


@needs_gpu
@pytest.mark.parametrize("gemv", ["fma", "dot", "fused"])
@pytest.mark.parametrize("activation", ["swiglu", "relu2"])
@pytest.mark.parametrize("num_tokens", [1, 2, 8, 64, 300])
def test_kernels_on_the_gpu_match_the_dense_loop(num_tokens, activation, gemv, monkeypatch):
    monkeypatch.setenv(kernel.GEMV_DOT_ENV, "1" if gemv == "dot" else "0")
    monkeypatch.setenv(kernel.FUSED_MLP_ENV, "1" if gemv == "fused" else "0")
    rng = np.random.default_rng(num_tokens)
    num_experts, top_k = 64, 8
    x = jnp.asarray(rng.standard_normal((num_tokens, 512)), jnp.bfloat16)
    ids = jnp.asarray(np.stack([rng.choice(num_experts, top_k, replace=False)
                                for _ in range(num_tokens)]), jnp.int32)
    weights = jnp.asarray(rng.uniform(0.1, 1.0, (num_tokens, top_k)), jnp.float32)
    gate_up, down = expert_weights(rng, 512, 256, num_experts, jnp.bfloat16, activation)
    got = jax.jit(functools.partial(moe.routed_experts, activation=activation))(
        x, ids, weights, gate_up, down)
    with jax.default_matmul_precision("highest"):
        expected = reference.dense_experts(*(a.astype(jnp.float32) if a.dtype == jnp.bfloat16
                                             else a for a in (x, ids, weights, gate_up, down)),
                                           activation=activation)
    assert relative_error(got, expected) < 1e-2
