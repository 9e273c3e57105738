"""Hybrid config.json spellings that the tiny transformers models do not write: a multimodal
Qwen3.5 config in the published layout (text_config, full_attention_interval, mRoPE keys),
Qwen3-Next's decoder_sparse_step, an explicit attn_output_gate."""
from __future__ import annotations

import pathlib

import pytest

from ninfer_jax.artifact.hf_convert import model_config
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.errors import ArtifactError

PATH = pathlib.Path("config.json")
QWEN3_5_27B_TEXT = {
    "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120,
    "intermediate_size": 17408, "num_hidden_layers": 64, "num_attention_heads": 24,
    "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
    "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
    "attn_output_gate": True, "mtp_num_hidden_layers": 1, "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                        "mrope_interleaved": True}}


def test_published_multimodal_layout_gives_the_27b_preset_config():
    hf = {"architectures": ["Qwen3_5ForConditionalGeneration"], "tie_word_embeddings": False,
          "text_config": QWEN3_5_27B_TEXT, "vision_config": {"depth": 27}}
    config = model_config(hf, PATH, mtp_layers=1)
    assert config == PRESETS["qwen3.5-27b"].config
    assert config.rope_scaling is None  # mRoPE keys dropped: text-only positions


def test_qwen3_next_sparse_step_becomes_mlp_only_layers():
    hf = dict(QWEN3_5_27B_TEXT, architectures=["Qwen3NextForCausalLM"], num_hidden_layers=8,
              num_experts=16, num_experts_per_tok=2, moe_intermediate_size=64,
              shared_expert_intermediate_size=0, decoder_sparse_step=2, mlp_only_layers=[3],
              norm_topk_prob=False)
    config = model_config(hf, PATH)
    assert config.architecture == "qwen3_next" and config.mtp_num_layers == 0
    assert config.mlp_only_layers == (0, 2, 3, 4, 6)
    assert [config.is_moe_layer(i) for i in range(8)] == [False, True, False, False,
                                                          False, True, False, True]
    assert config.norm_topk_prob is False and config.shared_expert_intermediate_size == 0
    assert config.layer_types[3] == config.layer_types[7] == "full_attention"


def test_attention_gate_can_be_turned_off_and_biases_are_refused():
    hf = dict(QWEN3_5_27B_TEXT, architectures=["Qwen3_5ForCausalLM"], attn_output_gate=False)
    assert model_config(hf, PATH).attn_output_gate is False
    with pytest.raises(ArtifactError, match="biases"):
        model_config(dict(hf, attention_bias=True), PATH)
    with pytest.raises(ArtifactError, match="incomplete or invalid config"):
        model_config({k: v for k, v in hf.items() if k != "linear_num_key_heads"}, PATH)
