"""inspect-artifact on hybrid artifacts: layer pattern, recurrent state per sequence, KV bytes
per token, MoE shape and the MTP component (full-size figures from the presets' configs,
the CLI's output from a tiny quantized artifact)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ninfer_jax.artifact.model_report import layer_pattern, model_summary
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.cli.main import main


def test_qwen35_27b_state_and_kv_sizes():
    summary = model_summary(PRESETS["qwen3.5-27b"].config, {"embed": "bf16"})
    assert summary["layers"] == {"counts": {"linear": 48, "full": 16},
                                 "pattern": "(3 linear, 1 full) x 16"}
    state = summary["state"]
    assert state["mixer"] == "gated_deltanet" and state["layers"] == 48
    assert state["conv_shape"] == [3, 2 * 16 * 128 + 48 * 128]
    assert state["conv_per_layer"] == 3 * 10240 * 2  # bf16
    assert state["recurrent_per_layer"] == 48 * 128 * 128 * 4  # f32, 3 MiB
    assert state["total"] == 48 * (61440 + 3145728)
    assert summary["kv"]["bytes_per_token"] == 16 * 2 * 4 * 256 * 2  # K and V, 4 KV heads of 256
    assert summary["attention"]["options"]["output_gate"] is True
    assert summary["attention"]["kinds"]["full"]["rotary_dims"] == 64
    assert summary["moe"] is None
    assert summary["mtp"]["layers"] == 1 and summary["mtp"]["kv_bytes_per_token"] == 2 * 4 * 256 * 2


def test_qwen36_35b_a3b_moe_shape():
    summary = model_summary(PRESETS["qwen3.6-35b-a3b"].config, {"embed": "bf16"})
    assert summary["layers"]["pattern"] == "(3 linear, 1 full) x 10"
    assert summary["moe"] == {"experts": 256, "top_k": 8, "expert_width": 512,
                              "activation": "swiglu", "shared_expert_width": 512,
                              "shared_expert_gate": True, "renormalise_top_k": True,
                              "dense_layers": [],
                              "router": {"scores": "softmax", "correction_bias": False,
                                         "groups": 1, "top_groups": 1, "scaling": 1.0}}
    assert summary["kv"]["bytes_per_token"] == 10 * 2 * 2 * 256 * 2


def test_layer_pattern_without_a_period():
    kinds = ("linear_attention", "full_attention", "linear_attention")
    assert layer_pattern(kinds) == "1 linear, 1 full, 1 linear"
    assert layer_pattern(("full_attention",) * 3) == "(1 full) x 3"
    # Past eight runs in the period, one letter a layer (HF's Nemotron-H letters).
    nemotron = ("mamba", "mlp") * 4 + ("attention", "mlp", "mamba", "moe")
    assert layer_pattern(nemotron) == "M-M-M-M-*-ME"


@pytest.fixture(scope="module")
def moe_int8(tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect") / "moe.ninfer"
    result = CliRunner().invoke(main, ["init-random", "--preset", "qwen3.6-tiny-moe", str(out),
                                       "--weights", "int8", "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


def test_inspect_json_lists_the_mtp_component_and_the_hybrid_summary(moe_int8):
    result = CliRunner().invoke(main, ["inspect-artifact", str(moe_int8), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    rows = {r["name"]: r for r in report["tensors"]}
    assert rows["mtp.fc.int8"]["format"] == "int8" and rows["mtp.fc.int8"]["shape"] == [128, 64]
    assert rows["mtp.layers.0.wq.scale"]["format"] == "int8"
    assert rows["mtp.pre_fc_norm_hidden"]["format"] == "f32"
    # Stacked experts stay float inside the int8 `layers` group, and say so.
    assert rows["layers.0.experts_gate_up"]["format"] == "f32"
    assert rows["layers.0.A_log"]["format"] == "f32"
    assert report["totals"]["bytes"] == sum(r["bytes"] for r in report["tensors"])
    model = report["model"]
    assert model["layers"] == {"counts": {"linear": 1, "full": 1}, "pattern": "1 linear, 1 full"}
    assert model["state"]["recurrent_shape"] == [4, 16, 16]
    assert model["moe"]["experts"] == 8 and model["mtp"]["layers"] == 1


def test_inspect_table_shows_the_hybrid_lines(moe_int8):
    result = CliRunner().invoke(main, ["inspect-artifact", str(moe_int8)])
    assert result.exit_code == 0, result.output
    lines = {line[:14].strip(): line[14:] for line in result.output.splitlines()
             if line[:1].strip()}
    assert lines["layer types"] == "1 linear, 1 full: 1 linear, 1 full"
    assert lines["state/seq"].startswith("5.5 KiB (5,632 bytes)")  # f32: 3*128*4 + 4*16*16*4
    assert lines["KV/token"].startswith("128 B")  # 1 layer x K,V x 1 head x 16 x 4 bytes
    assert lines["MoE"] == ("8 swiglu experts of 32, top-2 renormalised, shared expert of 32 "
                            "(gated), dense layers []; router softmax, top-1 of 1 groups, "
                            "scaling 1")
    assert lines["attn options"].endswith("output gate on, keys as values off")
    assert lines["MTP head"].startswith("1 layer(s)")
    assert lines["components"] == "text, mtp, dflash, dflash2, draft_head, vision"
    assert lines["vision"].startswith("2 blocks of 32 (2 heads), patch 16x16x2, merge 2, "
                                      "deepstack taps none")
    assert "mtp.layers.0.experts_down" in result.output
