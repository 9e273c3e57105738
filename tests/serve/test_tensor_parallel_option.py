"""--tensor-parallel and --expert-parallel: parsing, the start-up checks (before any weight is
read) and the per-shard layouts of model/tensor_parallel.py, on the suite's one CPU device."""
from __future__ import annotations

import dataclasses

import click
import numpy as np
import pytest

from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.model import tensor_parallel
from ninfer_jax.serve.engine_setup import tensor_parallel_mesh
from ninfer_jax.serve.options import parse_serve_args


def test_parsing(default_artifact_path):
    assert parse_serve_args(str(default_artifact_path), []).tensor_parallel == 1
    assert parse_serve_args(str(default_artifact_path),
                            ["--tensor-parallel", "auto"]).tensor_parallel == "auto"
    assert parse_serve_args(str(default_artifact_path),
                            ["--tensor-parallel", "2"]).tensor_parallel == 2
    for bad in ("0", "two"):
        with pytest.raises(click.BadParameter):
            parse_serve_args(str(default_artifact_path), ["--tensor-parallel", bad])


def test_start_up_checks(default_artifact_path):
    one = parse_serve_args(str(default_artifact_path), ["--tensor-parallel", "auto"])
    assert tensor_parallel_mesh(one) is None  # auto on one visible device
    two = parse_serve_args(str(default_artifact_path), ["--tensor-parallel", "2"])
    with pytest.raises(ValueError, match=r"^--tensor-parallel 2: only 1 device\(s\) visible$"):
        tensor_parallel_mesh(two)


def test_heads_must_divide(default_artifact):  # SmolLM2-135M: 9 heads, 3 kv heads
    with pytest.raises(ValueError, match="does not divide the model's 9 attention heads"):
        default_artifact.config.check_tensor_parallel(2)
    default_artifact.config.check_tensor_parallel(3)


def test_expert_parallel_option(default_artifact_path):
    assert parse_serve_args(str(default_artifact_path), []).expert_parallel is False
    alone = parse_serve_args(str(default_artifact_path), ["--expert-parallel"])
    assert alone.expert_parallel is True
    with pytest.raises(ValueError, match=r"^--expert-parallel needs --tensor-parallel 2 or "
                                         r"more \(it splits the experts over the "
                                         r"tensor-parallel devices\)$"):
        tensor_parallel_mesh(alone)


def test_experts_must_divide(default_artifact):
    with pytest.raises(ValueError, match=r"^--expert-parallel needs a MoE model; llama has no "
                                         r"routed experts$"):
        default_artifact.config.check_tensor_parallel(3, expert_parallel=True)
    glm = dataclasses.replace(PRESETS["glm4.5-tiny"].config, num_heads=12, num_kv_heads=6)
    with pytest.raises(ValueError, match=r"^--expert-parallel: --tensor-parallel 3 does not "
                                         r"divide the model's 8 routed experts$"):
        glm.check_tensor_parallel(3, expert_parallel=True)
    glm.check_tensor_parallel(3)  # replicated experts: any head-dividing size
    glm.check_tensor_parallel(2, expert_parallel=True)


def test_group_columns_and_split_fused_are_inverse():
    sizes, groups = (8, 4, 4), 2
    weight = np.arange(3 * sum(sizes), dtype=np.float32).reshape(3, sum(sizes))
    grouped = tensor_parallel.group_columns(weight, sizes, groups)
    # group 0 holds the first half of each part, in part order
    assert grouped[:, :8].tolist() == np.concatenate(
        [weight[:, :4], weight[:, 8:10], weight[:, 12:14]], axis=1).tolist()
    parts = tensor_parallel.split_fused(grouped, sizes, groups)
    expected = np.split(weight, [8, 12], axis=1)
    assert all(np.array_equal(p, e) for p, e in zip(parts, expected))


def test_leaf_specs():
    P = tensor_parallel.P
    assert tensor_parallel.leaf_spec("wqkv", (64, 96), 2) == P(None, "tp")
    assert tensor_parallel.leaf_spec("wo", (64, 64), 2) == P("tp")
    assert tensor_parallel.leaf_spec("embed", (4001, 64), 2) == P()  # odd vocabulary
    assert tensor_parallel.leaf_spec("attn_norm", (64,), 2) == P()
    assert tensor_parallel.leaf_spec("experts_down", (8, 32, 64), 2) == P()
    # expert parallel: split by expert index, under the stored name only when asked (a
    # checkpoint read into expert shards) and always under the runner's _ep name
    assert tensor_parallel.leaf_spec("experts_down", (8, 32, 64), 2, True) == P("tp")
    assert tensor_parallel.leaf_spec("experts_down_ep", (8, 32, 64), 2) == P("tp")
    assert tensor_parallel.leaf_spec("router", (64, 8), 2, True) == P()
    layer = tensor_parallel.split_experts({"router": 1, "experts_gate_up": 2,
                                           "experts_down": 3})
    assert layer == {"router": 1, "experts_gate_up_ep": 2, "experts_down_ep": 3}
