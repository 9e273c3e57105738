"""init-random: presets, seeded determinism, finite scaled weights, quantized projections."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact.components import mtp_expected_shapes
from ninfer_jax.artifact.format import load_artifact
from ninfer_jax.artifact.random_init import (PRESETS, QWEN3_VOCAB, init_random, random_params,
                                             random_tensor)


def test_qwen3_tiny_artifact(qwen3_tiny_dir):
    artifact = load_artifact(qwen3_tiny_dir)
    assert artifact.name == "qwen3-tiny"
    assert artifact.config.architecture == "qwen3" and artifact.config.qk_norm
    assert artifact.config.vocab_size == artifact.load_tokenizer().vocab_size == 151669
    assert artifact.eos_ids == [151645, 151643]
    assert artifact.chat_format == {"tool_call_format": "hermes",
                                    "reasoning": {"open": "<think>", "close": "</think>"},
                                    "thinking_default": True}
    assert artifact.metadata["source"] == {"kind": "random", "preset": "qwen3-tiny", "seed": 1}
    assert "<tools>" in artifact.chat_template
    for name, shape in artifact.config.expected_shapes().items():
        leaf = artifact.params
        for part in name.split("."):
            leaf = leaf[int(part)] if part.isdigit() else leaf[part]
        assert leaf.shape == shape and np.isfinite(leaf).all(), name


def test_seeds_are_reproducible_and_distinct():
    config = PRESETS["qwen3-tiny"].config
    small = dict(config.__dict__, vocab_size=512)
    from ninfer_jax.model.config import ModelConfig

    tiny = ModelConfig(**small)
    a = random_params(tiny, seed=3, dtype="f32")
    b = random_params(tiny, seed=3, dtype="f32")
    c = random_params(tiny, seed=4, dtype="f32")
    np.testing.assert_array_equal(a["layers"][1]["wq"], b["layers"][1]["wq"])
    assert not np.array_equal(a["layers"][1]["wq"], c["layers"][1]["wq"])
    assert not np.array_equal(a["layers"][0]["wq"], a["layers"][1]["wq"])


def test_scaling_keeps_projections_near_unit_gain():
    w = random_tensor(0, "layers.0.w_up", (256, 512), 1 / 16, "f32")
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    gain = np.sqrt(np.mean((x @ w) ** 2) / np.mean(x ** 2))
    assert 0.8 < gain < 1.2


def test_large_tensors_repeat_a_seeded_block_quickly():
    shape = (4096, 2048)  # larger than one block: tiled at a random phase
    w = random_tensor(5, "layers.0.w_gate", shape, 0.02, "bf16")
    assert w.shape == shape and str(w.dtype) == "bfloat16"
    values = w.astype(np.float32)
    assert np.isfinite(values).all() and 0.015 < values.std() < 0.025
    other = random_tensor(5, "layers.1.w_gate", shape, 0.02, "bf16")
    assert not np.array_equal(w, other)


def test_eight_billion_presets_have_the_published_shapes():
    def count(name):
        return sum(int(np.prod(s)) for s in PRESETS[name].config.expected_shapes().values())

    assert 8.1e9 < count("qwen3-8b") < 8.3e9
    assert 7.9e9 < count("llama3-8b") < 8.1e9
    assert PRESETS["llama3-8b"].config.vocab_size == 128256
    assert "Llama-3-layout stand-in vocabulary" in PRESETS["llama3-8b"].notes


def test_llama3_metadata_uses_the_llama3_layout():
    contents = init_random("llama3-8b", tiny=True)
    special = contents.special_tokens
    assert special["eos_ids"] == [128009, 128001]  # <|eot_id|>, <|end_of_text|>
    assert special["bos_id"] == 128000 and special["add_bos"] is True
    assert special["named"]["<|start_header_id|>"] == 128006
    assert contents.chat_format == {"tool_call_format": "hermes", "reasoning": None,
                                    "thinking_default": False}
    assert contents.chat_template.startswith("{#- Llama-3-style")
    assert contents.source == {"kind": "random", "preset": "llama3-8b", "seed": 0, "tiny": True}
    assert contents.name == "llama3-8b-tiny"
    assert init_random("qwen3-tiny", tiny=True).name == "qwen3-tiny"  # already tiny


def test_qwen35_dense_tiny_metadata_says_it_is_a_dense_stand_in():
    contents = init_random("qwen3.5-dense-tiny", seed=0)
    assert contents.config.architecture == "qwen3"
    assert contents.chat_format["tool_call_format"] == "qwen_xml"
    assert "standing in" in contents.notes
    assert contents.config.vocab_size == 248077
    assert "<function=" in contents.chat_template


def test_hybrid_presets_have_the_published_shapes():
    def count(name, component=False):
        config = PRESETS[name].config
        shapes = mtp_expected_shapes(config) if component else config.expected_shapes()
        return sum(int(np.prod(s)) for s in shapes.values())

    # Text model without the vision tower (about 0.4B in each published checkpoint).
    assert 26.8e9 < count("qwen3.5-27b") < 27.0e9
    assert 34.5e9 < count("qwen3.6-35b-a3b") < 34.8e9
    assert 0.4e9 < count("qwen3.5-27b", True) < 0.45e9  # one gated-attention layer + MLP
    dense, moe = PRESETS["qwen3.5-27b"].config, PRESETS["qwen3.6-35b-a3b"].config
    assert dense.layer_types.count("full_attention") == 16 and dense.layer_types[3] == "full_attention"
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (256, 8, 512)
    assert dense.vocab_size == moe.vocab_size == 248320
    # Qwen3.5-27B: 48 GDN layers of conv [3, 10240] bf16 + recurrent [48, 128, 128] f32.
    state = dense.state_shapes()
    assert state == {"conv": (3, 10240), "recurrent": (48, 128, 128)}


def test_qwen35_tiny_is_a_hybrid_with_an_mtp_head():
    contents = init_random("qwen3.5-tiny", seed=0)
    config = contents.config
    assert (config.architecture, config.layer_types) == ("qwen3_5",
                                                         ("linear_attention", "full_attention"))
    assert config.attn_output_gate and config.num_experts == 0 and config.mtp_num_layers == 1
    assert contents.components["mtp"] and contents.weight_formats["mtp"] == "f32"
    assert contents.chat_format["tool_call_format"] == "qwen_xml"
    linear, full = contents.params["layers"]
    assert full["wq"].shape == (64, 2 * 4 * 16)  # query and gate columns per head
    assert linear["in_qkv"].shape == (64, config.linear_conv_dim)
    # Zero-centred norms around 0 (applied as 1 + w); the GDN output norm around 1.
    assert abs(float(full["q_norm"].mean())) < 0.1 and abs(float(linear["gdn_norm"].mean()) - 1) < 0.1
    assert abs(float(contents.params["mtp"]["norm"].mean())) < 0.1
    assert np.all((linear["A_log"] >= 0) & (linear["A_log"] <= np.log(16)))
    assert linear["A_log"].dtype == linear["dt_bias"].dtype == np.float32


def test_qwen36_tiny_moe_has_experts_everywhere():
    contents = init_random("qwen3.6-tiny-moe", seed=0)
    config = contents.config
    assert config.architecture == "qwen3_5_moe" and config.mlp_only_layers == ()
    for layer in (*contents.params["layers"], *contents.params["mtp"]["layers"]):
        assert layer["experts_gate_up"].shape == (8, 64, 64)
        assert layer["experts_down"].shape == (8, 32, 64)
        assert layer["router"].shape == (64, 8) and layer["shared_w_up"].shape == (64, 32)
        assert "w_gate" not in layer


@pytest.mark.parametrize("fmt", ["int8", "fp8", "int4", "nvfp4"])
def test_hybrid_presets_quantize_their_projections(fmt, tmp_path):
    from ninfer_jax.artifact.format import save_artifact
    from ninfer_jax.kernels.quant_matmul.formats import format_of

    contents = init_random("qwen3.6-tiny-moe", weights=fmt)
    assert contents.weight_formats == {"embed": "f32", "layers": fmt, "norms": "f32",
                                       "mtp": fmt, "vision": "f32"}  # the tower stays float
    artifact = load_artifact(save_artifact(tmp_path / "q.ninfer", contents), mtp=True)
    linear, full = artifact.params["layers"]
    head = artifact.params["mtp"]
    for leaf in (linear["in_qkv"], linear["in_z"], linear["out"], full["wq"], full["wo"],
                 linear["shared_w_down"], head["fc"], head["layers"][0]["wk"]):
        assert format_of(leaf) == fmt
    for leaf in ("experts_gate_up", "experts_down", "router", "shared_gate", "conv", "in_a"):
        assert isinstance(linear[leaf], np.ndarray) and linear[leaf].dtype == np.float32, leaf


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_projection_formats(fmt, tmp_path):
    from ninfer_jax.artifact.format import save_artifact
    from ninfer_jax.kernels.quant_matmul.formats import dequantize_numpy, format_of

    contents = init_random("qwen3-tiny", weights=fmt)
    assert contents.weight_formats == {"embed": "f32", "layers": fmt, "norms": "f32"}
    artifact = load_artifact(save_artifact(tmp_path / "q.ninfer", contents))
    wq = artifact.params["layers"][0]["wq"]
    assert format_of(wq) == fmt
    float_wq = random_tensor(0, "layers.0.wq", (64, 64), 1 / 8, "f32")
    approx = dequantize_numpy(wq)[:64]
    assert np.abs(approx - float_wq).max() < 0.25 * np.abs(float_wq).max()
    assert artifact.params["layers"][0]["attn_norm"].dtype == np.float32


def test_format_choices_resolve():
    assert common.resolve_formats(None, None) == ("f32", None)
    assert common.resolve_formats(None, "bf16") == ("bf16", None)
    assert common.resolve_formats("bf16", "int8") == ("bf16", "int8")
    with pytest.raises(ValueError, match="contradicts"):
        common.resolve_formats("f32", "bf16")


def test_llama3_template_renders_calls_and_results_in_llama3_turns():
    from ninfer_jax.text.chat_template import ChatRenderer
    from ninfer_jax.text.conversation import Conversation, Message, ToolCall
    from ninfer_jax.text.tokenizer import Tokenizer

    contents = init_random("llama3-8b", tiny=True)
    tokenizer = Tokenizer(contents.tokenizer_json, eos_ids=contents.special_tokens["eos_ids"],
                          bos_id=contents.special_tokens["bos_id"])
    renderer = ChatRenderer(contents.chat_template, tokenizer, contents.chat_format)
    call = ToolCall("c1", "lookup", '{"q": "x"}')
    prompt = renderer.render(Conversation([
        Message("user", "Find x"), Message("assistant", "", tool_calls=[call]),
        Message("tool", "42", tool_call_id="c1")], []))
    assert prompt.text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nFind x<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<tool_call>\n"
        '{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call><|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert prompt.ids[:2] == [128000, 128006]
    assert prompt.ids[-2:] == [128007, *tokenizer.encode("\n\n")]


@pytest.mark.parametrize("preset, weights", [
    *((name, None) for name in PRESETS),
    *((name, fmt) for name in ("qwen3.5-27b", "qwen3.6-35b-a3b") for fmt in ("int8", "nvfp4"))])
def test_full_size_metadata_is_valid_before_any_weight_is_drawn(preset, weights):
    from ninfer_jax.artifact.format import check_metadata

    metadata = init_random(preset, tiny=True, weights=weights).metadata()
    metadata["config"] = PRESETS[preset].config.to_dict()  # the 8B shapes, no 8B weights
    if PRESETS[preset].vision:  # and the full-size tower that feeds them
        metadata["vision_config"] = PRESETS[preset].vision.to_dict()
    for variant in ("dflash", "dflash2"):  # and full-size drafters
        if f"{variant}_config" in metadata:
            from ninfer_jax.artifact.drafters import preset_dflash_config

            metadata[f"{variant}_config"] = preset_dflash_config(
                PRESETS[preset].config, variant, tiny=False).to_dict()
    assert check_metadata(metadata, pathlib.Path("m")) == PRESETS[preset].config


def test_dense_presets_get_drafters_only_when_asked():
    """Dense llama / qwen3 presets take random DFlash / DFlash2 drafters (and the reduced
    proposal head) with drafters=True, fitting the target; other dense families refuse."""
    assert not init_random("qwen3-tiny").components["dflash"]
    contents = init_random("qwen3-tiny", drafters=True)
    for variant in ("dflash", "dflash2"):
        assert contents.components[variant] and variant in contents.params
        drafter = contents.metadata()[f"{variant}_config"]
        assert drafter["hidden_size"] == contents.config.hidden_size
    assert contents.components["draft_head"]
    with pytest.raises(ValueError, match="not gemma4"):
        init_random("gemma4-tiny", drafters=True)


def test_inconsistent_metadata_fails_before_writing(tmp_path):
    from ninfer_jax.artifact.format import save_artifact
    from ninfer_jax.errors import ArtifactError

    contents = init_random("qwen3-tiny")
    contents.special_tokens = dict(contents.special_tokens, eos_ids=[QWEN3_VOCAB])
    with pytest.raises(ArtifactError, match="eos id 151669 is outside the vocabulary"):
        save_artifact(tmp_path / "bad.ninfer", contents)
    assert list(tmp_path.iterdir()) == []  # not even a staging directory
