"""`ninfer convert` of a Nemotron-H checkpoint (NemotronHForCausalLM saved by transformers, then
rewritten in the published layout: `backbone.` tensor names, hybrid_override_pattern,
attention_head_dim and the mamba_* config aliases): config fields, every leaf equal to its
transformed HF tensor (the conv [C, 1, K] as [K, C]), the per-head vectors kept in f32 under
bf16 storage, the <TOOLCALL> format detected from the template; MoE layers (Nemotron 3) one
tensor per expert or packed, latent MoE projections refused; and inspect-artifact's Nemotron
lines (the nemotron-h-8b figures, a tiny int8 artifact)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_jax.artifact.convert import convert
from ninfer_jax.artifact.format import load_artifact
from ninfer_jax.artifact.model_report import model_summary
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.safetensors_io import write_safetensors
from ninfer_jax.cli.main import main
from test_hf_convert import write_tokenizer_files

TEMPLATE = ("{% for m in messages %}<SPECIAL_11>{{ m.role }}\n{{ m.content }}\n{% endfor %}"
            "{# calls: <TOOLCALL>[{\"name\": ..., \"arguments\": ...}]</TOOLCALL> #}")
PATTERN = "M*-M"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.NemotronHForCausalLM(transformers.NemotronHConfig(
        vocab_size=264, hidden_size=32, hybrid_override_pattern=PATTERN,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
        mamba_num_heads=4, mamba_head_dim=6, ssm_state_size=10, n_groups=2, conv_kernel=3,
        eos_token_id=262))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    directory = tmp_path_factory.mktemp("Nemotron-H-Tiny")
    model.save_pretrained(directory)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    # the published layout: backbone.* names and the original config spellings
    for path in directory.glob("*.safetensors"):
        path.unlink()
    write_safetensors(directory / "model.safetensors", {
        ("backbone." + k.removeprefix("model.")) if k.startswith("model.") else k: v
        for k, v in state.items()})
    hf = json.loads((directory / "config.json").read_text())
    for ours in ("layers_block_type", "layer_types", "head_dim", "n_groups", "conv_kernel"):
        hf.pop(ours, None)
    hf.update(hybrid_override_pattern=PATTERN, attention_head_dim=8, mamba_n_groups=2,
              mamba_d_conv=3, time_step_limit=[0.0, float("inf")])
    (directory / "config.json").write_text(json.dumps(hf))
    write_tokenizer_files(directory, template=TEMPLATE)
    return directory, state


def test_nemotron_checkpoint_converts_leaf_by_leaf(checkpoint, tmp_path):
    directory, state = checkpoint
    artifact = load_artifact(convert(directory, tmp_path / "nemotron.ninfer"))
    config, params = artifact.config, artifact.params
    assert (config.architecture, config.layer_types, config.head_dim) == (
        "nemotron_h", ("mamba", "attention", "mlp", "mamba"), 8)
    assert (config.mamba_num_groups, config.mamba_conv_kernel, config.mamba_state_size,
            config.mamba_dt_max, config.tie_word_embeddings) == (2, 3, 10, 0.0, False)
    assert artifact.chat_format["tool_call_format"] == "nemotron"
    mamba, attention, mlp, _ = params["layers"]
    p = "model.layers.0."
    np.testing.assert_array_equal(mamba["in_proj"], state[p + "mixer.in_proj.weight"].T)
    np.testing.assert_array_equal(mamba["conv"], state[p + "mixer.conv1d.weight"][:, 0].T)
    np.testing.assert_array_equal(mamba["conv_bias"], state[p + "mixer.conv1d.bias"])
    np.testing.assert_array_equal(mamba["mamba_norm"], state[p + "mixer.norm.weight"])
    np.testing.assert_array_equal(mamba["D"], state[p + "mixer.D"])
    np.testing.assert_array_equal(mamba["norm"], state[p + "norm.weight"])
    np.testing.assert_array_equal(attention["wk"], state["model.layers.1.mixer.k_proj.weight"].T)
    np.testing.assert_array_equal(mlp["w_down"], state["model.layers.2.mixer.down_proj.weight"].T)
    np.testing.assert_array_equal(params["final_norm"], state["model.norm_f.weight"])
    np.testing.assert_array_equal(params["lm_head"], state["lm_head.weight"].T)
    assert set(mlp) == {"norm", "w_up", "w_down"}


def test_bf16_storage_keeps_the_per_head_vectors_in_f32(checkpoint, tmp_path):
    directory, _ = checkpoint
    mamba = load_artifact(convert(directory, tmp_path / "n16.ninfer", dtype="bf16")).params[
        "layers"][0]
    assert all(mamba[k].dtype == np.float32 for k in ("A_log", "dt_bias", "D", "mamba_norm"))
    assert mamba["in_proj"].dtype.name == "bfloat16"


MOE_PATTERN = "M*E-"
NUM_EXPERTS = 4


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    """A MoE layer (Nemotron 3) as save_pretrained writes it: one tensor per expert."""
    import torch
    import transformers

    torch.manual_seed(1)
    model = transformers.NemotronHForCausalLM(transformers.NemotronHConfig(
        vocab_size=264, hidden_size=32, hybrid_override_pattern=MOE_PATTERN,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
        mamba_num_heads=4, mamba_head_dim=6, ssm_state_size=10, n_groups=2, conv_kernel=3,
        n_routed_experts=NUM_EXPERTS, num_experts_per_tok=2, moe_intermediate_size=12,
        moe_shared_expert_intermediate_size=20, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, eos_token_id=262))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    directory = tmp_path_factory.mktemp("Nemotron-3-Tiny")
    model.save_pretrained(directory)
    write_tokenizer_files(directory, template=TEMPLATE)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return directory, state


def copy_checkpoint(directory, into):
    into.mkdir()
    for f in directory.iterdir():
        (into / f.name).write_bytes(f.read_bytes())
    return into


@pytest.mark.parametrize("layout", ["per_expert", "packed"])
def test_moe_layers_convert_leaf_by_leaf(moe_checkpoint, tmp_path, layout):
    directory, state = moe_checkpoint
    p = "model.layers.2.mixer."
    if layout == "packed":  # transformers' in-memory names: experts.up_proj [E, I, H]
        directory = copy_checkpoint(directory, tmp_path / "packed")
        for path in directory.glob("*.safetensors"):
            path.unlink()
        write_safetensors(directory / "model.safetensors", {
            k: v for k, v in state.items()})
    artifact = load_artifact(convert(directory, tmp_path / f"{layout}.ninfer"))
    config, layer = artifact.config, artifact.params["layers"][2]
    assert config.layer_types == ("mamba", "attention", "moe", "mlp")
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
            config.shared_expert_intermediate_size, config.num_expert_groups,
            config.num_topk_groups, config.routed_scaling_factor) == (4, 2, 12, 20, 2, 1, 2.5)
    np.testing.assert_array_equal(layer["router"], state[p + "gate.weight"].T)
    np.testing.assert_array_equal(layer["router_bias"], state[p + "gate.e_score_correction_bias"])
    np.testing.assert_array_equal(layer["experts_up"],
                                  np.swapaxes(state[p + "experts.up_proj"], 1, 2))
    np.testing.assert_array_equal(layer["experts_down"],
                                  np.swapaxes(state[p + "experts.down_proj"], 1, 2))
    np.testing.assert_array_equal(layer["shared_w_down"],
                                  state[p + "shared_experts.down_proj.weight"].T)
    assert set(layer) == {"norm", "router", "router_bias", "experts_up", "experts_down",
                          "shared_w_up", "shared_w_down"}


def test_moe_latent_projections_are_refused(moe_checkpoint, tmp_path):
    broken = copy_checkpoint(moe_checkpoint[0], tmp_path / "latent")
    hf = json.loads((broken / "config.json").read_text())
    hf["moe_latent_size"] = 8
    (broken / "config.json").write_text(json.dumps(hf))
    with pytest.raises(Exception, match="moe_latent_size"):
        convert(broken, tmp_path / "latent.ninfer")


def test_nemotron_h_8b_state_and_kv_sizes():
    summary = model_summary(PRESETS["nemotron-h-8b"].config, {"embed": "bf16"})
    assert summary["layers"]["counts"] == {"mamba": 24, "mlp": 24, "full": 4}
    assert summary["layers"]["pattern"].startswith("M-M-M-M*-M-")
    conv = 3 * (128 * 64 + 2 * 8 * 128) * 2  # K-1 taps of x|B|C, bf16
    ssm = 128 * 64 * 128 * 4
    state = summary["state"]
    assert (state["mixer"], state["layers"], state["groups"], state["conv_taps"]) == (
        "mamba2", 24, 8, 4)
    assert (state["conv_per_layer"], state["recurrent_per_layer"], state["total"]) == (
        conv, ssm, 24 * (conv + ssm))
    assert summary["kv"]["bytes_per_token"] == 4 * 2 * 8 * 128 * 2
    assert summary["attention"]["kinds"]["full"]["rotary_dims"] == 0  # no RoPE
    assert summary["moe"] is None


def test_inspect_a_tiny_int8_nemotron_artifact(tmp_path):
    out = tmp_path / "nemotron.ninfer"
    result = CliRunner().invoke(main, ["init-random", "--preset", "nemotron-h-tiny", str(out),
                                       "--weights", "int8", "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(CliRunner().invoke(main, ["inspect-artifact", str(out), "--json"]).output)
    rows = {r["name"]: r for r in report["tensors"]}
    assert rows["layers.0.in_proj.int8"]["format"] == "int8"
    assert rows["layers.0.A_log"]["dtype"] == "float32"
    assert report["model"]["layers"]["pattern"] == "1 mamba, 1 full, 1 mlp"
    text = CliRunner().invoke(main, ["inspect-artifact", str(out)]).output
    assert "layer types   1 mamba, 1 full, 1 mlp: 1 mamba, 1 full, 1 mlp" in text
    assert "full attn     1 layer(s), 1 kv heads of 16, no RoPE" in text
    # 4 heads of 16 in 2 groups of state 16, conv 4 taps: 3 x (64 + 2*2*16) conv channels
    assert "1 mamba2 layer(s) of 2 groups, each conv [3, 128]" in text
    assert "recurrent [4, 16, 16] f32" in text
