"""`ninfer convert` of a GLM MoE checkpoint (Glm4MoeForCausalLM saved by transformers, plus the
next-token-prediction layer GLM checkpoints store after the decoder layers): config fields,
every leaf equal to its transformed HF tensor, the NTP layer left out, the router bias kept in
f32 under bf16 storage, and the GLM tool format detected from the template."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ninfer_jax.artifact.convert import convert
from ninfer_jax.artifact.format import load_artifact
from ninfer_jax.artifact.safetensors_io import write_safetensors
from test_hf_convert import write_tokenizer_files

GLM_TEMPLATE = ("[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% endfor %}"
                "{# calls: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value> #}")
E, LAYERS = 4, 2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.Glm4MoeForCausalLM(transformers.Glm4MoeConfig(
        vocab_size=264, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=12,
        n_routed_experts=E, n_shared_experts=2, num_experts_per_tok=2, n_group=2, topk_group=1,
        routed_scaling_factor=1.5, first_k_dense_replace=1, attention_bias=True,
        partial_rotary_factor=0.5, eos_token_id=262))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
        model.model.layers[1].mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
    directory = tmp_path_factory.mktemp("GLM-Tiny")
    model.save_pretrained(directory)
    write_tokenizer_files(directory, template=GLM_TEMPLATE)
    ntp = {f"model.layers.{LAYERS}.eh_proj.weight": np.ones((32, 64), np.float32),
           f"model.layers.{LAYERS}.self_attn.q_proj.weight": np.ones((64, 32), np.float32)}
    write_safetensors(directory / "model-ntp.safetensors", ntp)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return directory, state


def test_glm_checkpoint_converts_leaf_by_leaf(checkpoint, tmp_path):
    directory, state = checkpoint
    artifact = load_artifact(convert(directory, tmp_path / "glm.ninfer"))
    config, params = artifact.config, artifact.params
    assert (config.architecture, config.mlp_only_layers, config.num_experts) == (
        "glm4_moe", (0,), E)
    assert (config.num_expert_groups, config.num_topk_groups, config.routed_scaling_factor,
            config.partial_rotary_factor, config.attention_bias, config.qk_norm) == (
        2, 1, 1.5, 0.5, True, False)
    assert config.shared_expert_intermediate_size == 2 * 12
    assert artifact.chat_format["tool_call_format"] == "glm_xml"
    assert len(params["layers"]) == LAYERS  # the NTP layer is not a decoder layer
    dense, moe = params["layers"]
    p = "model.layers.1."
    np.testing.assert_array_equal(moe["bq"], state[p + "self_attn.q_proj.bias"])
    np.testing.assert_array_equal(moe["wk"], state[p + "self_attn.k_proj.weight"].T)
    np.testing.assert_array_equal(moe["router"], state[p + "mlp.gate.weight"].T)
    np.testing.assert_array_equal(moe["router_bias"], state[p + "mlp.gate.e_score_correction_bias"])
    np.testing.assert_array_equal(moe["shared_w_down"],
                                  state[p + "mlp.shared_experts.down_proj.weight"].T)
    gate_up = state[p + "mlp.experts.gate_up_proj"]  # transformers' packed [E, 2I, H]
    np.testing.assert_array_equal(moe["experts_gate_up"], gate_up.transpose(0, 2, 1))
    np.testing.assert_array_equal(moe["experts_down"],
                                  state[p + "mlp.experts.down_proj"].transpose(0, 2, 1))
    np.testing.assert_array_equal(dense["w_gate"], state["model.layers.0.mlp.gate_proj.weight"].T)
    assert "router" not in dense and "shared_gate" not in moe


def test_bf16_storage_keeps_the_router_bias_in_f32(checkpoint, tmp_path):
    directory, _ = checkpoint
    artifact = load_artifact(convert(directory, tmp_path / "glm16.ninfer", dtype="bf16"))
    moe = artifact.params["layers"][1]
    assert moe["router_bias"].dtype == np.float32 and moe["router"].dtype.name == "bfloat16"


def test_a_glm_config_without_experts_is_refused(checkpoint, tmp_path):
    directory, _ = checkpoint
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in directory.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    hf = json.loads((broken / "config.json").read_text())
    del hf["n_routed_experts"]
    (broken / "config.json").write_text(json.dumps(hf))
    with pytest.raises(Exception, match="n_routed_experts"):
        convert(broken, tmp_path / "x.ninfer")


def test_a_published_style_config_with_top_level_rope_fields():
    """GLM-4.5-Air's config.json keeps rope_theta and partial_rotary_factor at the top level
    (rope_scaling null) and advertises its NTP layer in num_nextn_predict_layers."""
    import pathlib

    from ninfer_jax.artifact.presets import GLM4_5_AIR
    from ninfer_jax.artifact.hf_convert import model_config

    hf = {"architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "head_dim": 128,
          "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 10944,
          "max_position_embeddings": 131072, "moe_intermediate_size": 1408, "n_group": 1,
          "n_routed_experts": 128, "n_shared_experts": 1, "norm_topk_prob": True,
          "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46,
          "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5,
          "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
          "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1,
          "use_qk_norm": False, "vocab_size": 151552, "first_k_dense_replace": 1}
    assert model_config(hf, pathlib.Path("config.json")) == GLM4_5_AIR
