"""Fused projections (model/fused_projections.py): the joined wqkv / w_gate_up leaves have the
documented layout and give the unfused model's logits, to 1e-5, in a prefill, a ragged step
(chunk + rows + a padding row) and a decode step, for llama and qwen3, plain and quantized;
the hybrid families' joined leaves the same way in a prefill and a decode step.

Two sequences on shuffled pages: A and B are prefilled to position 16, then one ragged step
runs A's chunk (16..26 in a bucket of 16) with B's row at 16 and a padding row, then one
decode step runs B at 17 and A at 27. Each layout carries its own caches through the three.
"""
from __future__ import annotations

import copy
import dataclasses
import functools

import jax
import numpy as np
import pytest

from ninfer_jax.artifact.convert_common import quantize_projections
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE, get_kv_cache_shape
from ninfer_jax.kernels.quant_matmul.formats import dequantize_numpy
from ninfer_jax.model import hybrid, llama
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.fused_projections import (FOLD_ENV, FUSED_LEAVES, HYBRID_FUSED_LEAVES,
                                               fuse_projections)
from ninfer_jax.model.steps import FROM_HOST, RaggedBatch

PAGE_SIZE, WIDTH = 4, 8
NUM_PAGES = 1 + 2 * WIDTH
CACHED, CHUNK_LEN, CHUNK_BUCKET = 16, 11, 16
TOLERANCE = 1e-5
FUSABLE = ("plain", "int8", "fp8", "int4")
KEPT_APART = ("nvfp4",)  # one global scale per leaf: no clean join


def tiny(architecture: str) -> ModelConfig:
    return ModelConfig(architecture=architecture, vocab_size=96, hidden_size=64,
                       intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=16, qk_norm=architecture == "qwen3")


def params_in(config: ModelConfig, fmt: str) -> dict:
    params = random_params(config, seed=2, dtype="f32")
    return params if fmt == "plain" else quantize_projections(copy.deepcopy(params), fmt)


class Pool:
    """The two sequences' tokens and page tables, and the three steps run on one layout."""

    def __init__(self, config: ModelConfig):
        self.config = config
        rng = np.random.default_rng(7)
        self.tokens = rng.integers(0, config.vocab_size, (2, 32)).astype(np.int32)
        self.tables = rng.permutation(np.arange(1, NUM_PAGES)).astype(np.int32).reshape(2, WIDTH)
        partial = dict(config=config, page_size=PAGE_SIZE)
        self.prefill = jax.jit(functools.partial(llama.prefill, **partial))
        self.ragged = jax.jit(functools.partial(llama.ragged, **partial))
        self.decode = jax.jit(functools.partial(llama.decode, **partial))

    def run(self, params):
        """Logits of every step and the final caches."""
        shape = get_kv_cache_shape(NUM_PAGES, PAGE_SIZE, self.config.num_kv_heads,
                                   self.config.head_dim)
        kv = [(np.zeros(shape, np.float32),) * 2 for _ in range(self.config.num_layers)]
        logits = []
        for sequence in (0, 1):
            out, kv = self.prefill(params, kv, self.tokens[sequence, :CACHED], np.int32(0),
                                   np.int32(CACHED), self.tables[sequence])
            logits.append(out)
        chunk = np.zeros(CHUNK_BUCKET, np.int32)
        chunk[:CHUNK_LEN] = self.tokens[0, CACHED:CACHED + CHUNK_LEN]
        row_tables = np.stack([self.tables[1], np.full(WIDTH, DUMMY_PAGE, np.int32)])
        batch = RaggedBatch(chunk, np.int32(CACHED), np.int32(CHUNK_LEN), self.tables[0],
                            np.array([self.tokens[1, CACHED], 0], np.int32),
                            np.full(2, FROM_HOST, np.int32), np.array([CACHED, 0], np.int32),
                            row_tables)
        out, kv = self.ragged(params, kv, batch, None)
        logits.append(out[:2])  # the chunk's and B's (the padding row's are meaningless)
        positions = np.array([CACHED + 1, CACHED + CHUNK_LEN], np.int32)
        out, kv = self.decode(params, kv, self.tokens[[1, 0], positions], positions,
                              self.tables[[1, 0]])
        logits.append(out)
        return [np.asarray(x) for x in logits], kv


@pytest.fixture(autouse=True)
def exact_f32_matmuls():
    with jax.default_matmul_precision("highest"):  # no TF32 rounding if run on a GPU
        yield


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def pool(request):
    return Pool(tiny(request.param))


def test_fused_leaves_join_the_parts_columns_in_order():
    config = tiny("qwen3")
    H, F = config.hidden_size, config.intermediate_size
    params = params_in(config, "plain")
    fused = fuse_projections(params, config)
    for layer, original in zip(fused["layers"], params["layers"]):
        assert layer["wqkv"].shape == (H, (config.num_heads + 2 * config.num_kv_heads)
                                       * config.head_dim)
        assert layer["w_gate_up"].shape == (H, 2 * F)
        for name, parts in FUSED_LEAVES.items():
            assert not set(parts) & set(layer)
            np.testing.assert_array_equal(
                layer[name], np.concatenate([original[p] for p in parts], axis=1))
        assert set(layer) - set(FUSED_LEAVES) == set(original) - {
            p for parts in FUSED_LEAVES.values() for p in parts}
    assert fuse_projections(fused, config)["layers"][0].keys() == fused["layers"][0].keys()


@pytest.mark.parametrize("fmt", ["int8", "fp8", "int4"])
def test_a_joined_quantized_leaf_stands_for_the_joined_weights(fmt):
    config = tiny("llama")
    params = params_in(config, fmt)
    layer = fuse_projections(params, config)["layers"][0]
    for name, parts in FUSED_LEAVES.items():
        assert isinstance(layer[name], dict) and set(layer[name]) == set(params["layers"][0]["wq"])
        expected = np.concatenate([dequantize_numpy(params["layers"][0][p]) for p in parts], 1)
        np.testing.assert_array_equal(dequantize_numpy(layer[name]), expected)


@pytest.mark.parametrize("fmt", KEPT_APART)
def test_formats_with_a_per_leaf_global_scale_stay_apart(fmt):
    config = tiny("llama")
    layer = fuse_projections(params_in(config, fmt), config)["layers"][0]
    assert not set(FUSED_LEAVES) & set(layer)
    assert {"wq", "wk", "wv", "w_gate", "w_up"} <= set(layer)


def test_mixed_formats_stay_apart_and_hybrids_under_tensor_parallelism_are_unchanged():
    config = tiny("llama")
    params = params_in(config, "int8")
    params["layers"][0]["wk"] = params_in(config, "plain")["layers"][0]["wk"]
    layers = fuse_projections(params, config)["layers"]
    assert "wq" in layers[0] and "wqkv" not in layers[0] and "w_gate_up" in layers[0]
    assert "wqkv" in layers[1]
    hybrid_params = {"layers": [{"w_gate": np.ones((4, 2)), "w_up": np.ones((4, 2))}]}
    hybrid_config = PRESETS["qwen3.5-tiny"].config
    assert fuse_projections(hybrid_params, hybrid_config, 2) is hybrid_params
    assert set(fuse_projections(hybrid_params, hybrid_config)["layers"][0]) == {"w_gate_up"}


@pytest.mark.parametrize("fold", ["0", "1"])
def test_fused_hybrid_gives_the_unfused_logits(fold, monkeypatch):
    """The hybrid families' joined leaves (wqkv, in_qkvzba, shared_w_gate_up,
    router_shared_gate; w_gate_up as the dense families') hold their parts' columns in
    order, and two decode steps beside a padding row give the unfused model's logits; with
    the shared-expert fold the shared expert is the routed tensors' last expert."""
    monkeypatch.setenv(FOLD_ENV, fold)
    config = dataclasses.replace(PRESETS["qwen3.6-tiny-moe"].config, vocab_size=96)
    params = random_params(config, seed=3, dtype="f32")
    fused = fuse_projections(params, config)
    joined, folded = set(), 0
    for layer, original in zip(fused["layers"], params["layers"]):
        for name, parts in HYBRID_FUSED_LEAVES.items():
            if name in layer or (name == "shared_w_gate_up" and "experts_gate_up" in layer
                                 and layer["experts_gate_up"].shape[0] > config.num_experts):
                joined.add(name)
                assert not set(parts) & set(layer)
                want = np.concatenate([original[p] for p in parts], axis=1)
                got = layer.get(name, layer["experts_gate_up"][-1])
                np.testing.assert_array_equal(got, want)
        if "experts_gate_up" in layer and layer["experts_gate_up"].shape[0] > config.num_experts:
            folded += 1
            assert "shared_w_down" not in layer
            np.testing.assert_array_equal(layer["experts_down"][-1], original["shared_w_down"])
    assert joined == {"wqkv", "in_qkvzba", "router_shared_gate", "shared_w_gate_up"}
    assert folded == (sum(map(config.is_moe_layer, range(config.num_layers)))
                      if fold == "1" else 0)
    decode = jax.jit(functools.partial(hybrid.decode, config=config, page_size=PAGE_SIZE))
    tokens = np.random.default_rng(5).integers(0, 96, 2).astype(np.int32)
    tables = np.stack([np.arange(1, 1 + WIDTH, dtype=np.int32),
                       np.full(WIDTH, DUMMY_PAGE, np.int32)])
    outputs = []
    for tree in (params, fused):
        kv = hybrid.init_caches(config, num_pages=NUM_PAGES, page_size=PAGE_SIZE,
                                num_state_slots=2, dtype=np.float32, kv_dtype=np.float32)
        logits = []
        for position in (0, 1):
            rows, kv = decode(tree, kv, np.array([tokens[position], 0], np.int32),
                              np.array([position, 0], np.int32), tables,
                              np.array([1, 0], np.int32))
            logits.append(np.asarray(rows[0]))
        outputs.append(logits)
    for separate, joined_logits in zip(*outputs):
        np.testing.assert_allclose(joined_logits, separate, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("fmt", FUSABLE)  # KEPT_APART leaves are not joined: nothing to compare
def test_fused_model_gives_the_unfused_logits(pool, fmt):
    params = params_in(pool.config, fmt)
    fused = fuse_projections(params, pool.config)
    assert "wqkv" in fused["layers"][0]
    separate_logits, separate_kv = pool.run(params)
    fused_logits, fused_kv = pool.run(fused)
    for separate, joined in zip(separate_logits, fused_logits):
        np.testing.assert_allclose(joined, separate, atol=TOLERANCE, rtol=0)
    for a, b in zip(jax.tree_util.tree_leaves(separate_kv), jax.tree_util.tree_leaves(fused_kv)):
        np.testing.assert_allclose(np.asarray(b)[1:], np.asarray(a)[1:], atol=TOLERANCE, rtol=0)
