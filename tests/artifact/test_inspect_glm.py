"""inspect-artifact on GLM MoE artifacts: the MoE shape with its grouped sigmoid router, KV
bytes per token and attention options (full-size figures from the glm4.5-air preset, the CLI's
output from a tiny int8 artifact, whose router bias stays f32)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from ninfer_jax.artifact.model_report import model_summary
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.cli.main import main


def test_glm45_air_moe_and_kv_sizes():
    summary = model_summary(PRESETS["glm4.5-air"].config, {"embed": "bf16"})
    assert summary["moe"] == {
        "experts": 128, "top_k": 8, "expert_width": 1408, "activation": "swiglu",
        "shared_expert_width": 1408, "shared_expert_gate": False, "renormalise_top_k": True,
        "dense_layers": [0],
        "router": {"scores": "sigmoid", "correction_bias": True, "groups": 1, "top_groups": 1,
                   "scaling": 1.0}}
    assert summary["kv"]["bytes_per_token"] == 46 * 2 * 8 * 128 * 2  # K and V, bf16
    assert summary["attention"]["options"] == {"biases": True, "qk_norm": False,
                                               "output_gate": False, "keys_as_values": False}
    assert summary["attention"]["kinds"]["full"]["rotary_dims"] == 64
    assert summary["state"] is None


def test_inspect_a_tiny_int8_glm_artifact(tmp_path):
    out = tmp_path / "glm.ninfer"
    result = CliRunner().invoke(main, ["init-random", "--preset", "glm4.5-tiny", str(out),
                                       "--weights", "int8", "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(CliRunner().invoke(main, ["inspect-artifact", str(out), "--json"]).output)
    rows = {r["name"]: r for r in report["tensors"]}
    assert rows["layers.1.router_bias"]["dtype"] == "float32"
    assert rows["layers.1.wq.int8"]["format"] == "int8"
    assert report["model"]["moe"]["dense_layers"] == [0]
    text = CliRunner().invoke(main, ["inspect-artifact", str(out)]).output
    assert "router sigmoid + correction bias, top-1 of 1 groups" in text
    assert "attn options  q/k/v biases on, q/k norm off," in text
    assert "full attn     2 layer(s), 1 kv heads of 16, RoPE on 8 dims" in text
