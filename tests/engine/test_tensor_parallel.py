"""Tensor parallelism on XLA's host platform: TP 2 and 4 against TP 1 through JaxRunner.

The checks run in a child process (tests/engine/tensor_parallel_child.py) that splits the CPU
into 4 devices with XLA_FLAGS before importing JAX; the rest of the suite keeps its one
device. Each model: two prompts prefilled and four greedy decode steps of both rows through
the real runner, then the logits of one more step of the family's forward over the runner's
sharded params and caches. Greedy tokens must be equal and logits within 1e-5 (f32); the
caches must hold only their heads on each device, and the compiled step must communicate by
one all-reduce per attention (or Gated DeltaNet) and per MLP (plus the vocabulary-parallel
embedding's) and at most one all-gather, of the logits: no weight is gathered. The MoE
models (qwen3.6-tiny-moe, glm4.5-tiny shapes) run with expert parallelism ("2ep"): each
device holds half of the routed experts, none is gathered, and the experts' psum adds no
collective (XLA merges it with the shared expert's all-reduce). The weights saved as an orbax checkpoint restore straight into device shards,
the routed experts into expert shards under expert parallelism.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import pytest

CHILD = pathlib.Path(__file__).with_name("tensor_parallel_child.py")
# qwen3: qk-norm, tied vocabulary-parallel head; moe (qwen3.6-tiny-moe shapes): a hybrid
# with an odd vocabulary (replicated head), experts split ("2ep": TP 2 + --expert-parallel)
# or replicated (TP 4: the Gated DeltaNet channels and heads split four ways);
# glm (glm4.5-tiny shapes): a dense first layer, the grouped sigmoid router, experts split.
# The child also runs "llama" (untied, odd vocabulary) and "hybrid" (the dense-MLP
# Qwen3.5, odd vocabulary: moe covers its Gated DeltaNet layers); CI time keeps them out.
PLAN = {"qwen3": ("1", "2", "4"), "moe": ("1", "2ep", "4"), "glm": ("1", "2ep")}
NUM_LAYERS = 2  # the child's tiny models (the hybrids: one Gated DeltaNet, one attention)


_child: subprocess.Popen | None = None


def start_early() -> subprocess.Popen:
    """The child, started once: by tests/conftest.py as soon as the run's tests are collected,
    or by the fixture. Its stdout and stderr go to temporary files, read once it exits."""
    global _child
    if _child is None:
        root = pathlib.Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        args = [f"{name}={','.join(sizes)}" for name, sizes in PLAN.items()]
        args += ["restore=2", "restore_ep=2"]
        output, errors = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        _child = subprocess.Popen([sys.executable, str(CHILD), *args], env=env, text=True,
                                  stdout=output, stderr=errors)
        _child.output, _child.errors = output, errors
    return _child


@pytest.fixture(scope="module")
def results():
    child = start_early()
    try:
        child.wait(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    child.output.seek(0)
    child.errors.seek(0)
    assert child.returncode == 0, child.errors.read()[-4000:]
    return json.loads(child.output.read())


@pytest.mark.parametrize("name,size", [(n, s) for n, sizes in PLAN.items()
                                       for s in sizes if s != "1"])
def test_tensor_parallel_equals_one_device(results, name, size):
    one, split = results[name]["1"], results[name][size]
    assert split["tokens"] == one["tokens"]
    assert len(set(one["tokens"][0] + one["tokens"][1])) > 2  # the model is not degenerate
    diff = np.abs(np.asarray(split["logits"]) - np.asarray(one["logits"]))
    assert diff.max() <= 1e-5, diff.max()
    size = int(size.removesuffix("ep"))
    assert split["devices"] == size
    # every cache (KV pages by kv head, GDN state by channel / head) split, nothing copied
    for whole, shard in split["cache_shapes"]:
        assert np.prod(shard) * size == np.prod(whole), (whole, shard)
    collectives = split["collectives"]
    assert collectives["all-reduce"] in (2 * NUM_LAYERS, 2 * NUM_LAYERS + 1), collectives
    assert collectives["all-gather"] <= 1, collectives
    assert collectives["all-to-all"] == collectives["collective-permute"] == 0, collectives
    # what is gathered is the step's logits (the chunk's row and 2 decode rows), no weight
    assert all(shape[0] == 3 for shape in split["gathered_shapes"]), split["gathered_shapes"]


@pytest.mark.parametrize("name", ["moe", "glm"])
def test_expert_parallel_splits_the_routed_experts(results, name):
    one, split = results[name]["1"], results[name]["2ep"]
    whole, per_device = split["expert_bytes"]
    assert whole == one["expert_bytes"][0] > 0
    assert per_device * 2 == whole  # each device: its 4 of the 8 experts, every layer
    # no expert weight is gathered back
    gathered = {tuple(shape) for shape in split["gathered_shapes"]}
    assert not gathered & {tuple(shape) for shape in split["expert_shapes"]}


@pytest.mark.parametrize("name", ["restore", "restore_ep"])
def test_weights_restore_straight_into_their_shards(results, name):
    restored = results[name]
    assert restored["is_device_array"] and restored["equal"]
    (rows, columns), shard = restored["wq"]
    assert shard == [rows, columns // 2]  # column-parallel wq
    if name == "restore_ep":  # experts split by index as read, and as the runner keeps them
        (experts, *rest), shard = restored["experts"]
        assert shard == [experts // 2, *rest]
        assert restored["placed_experts"] == restored["experts"]


def test_one_device_has_no_collectives(results):
    assert results["qwen3"]["1"]["devices"] == 1
    assert set(results["qwen3"]["1"]["collectives"].values()) == {0}
