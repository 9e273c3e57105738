"""`ninfer convert` of Gemma 4 checkpoints: a Gemma4ForCausalLM saved by transformers (its
per_layer_config form of the full layers' shape) and the same tensors in the multimodal
wrapper's layout (model.language_model.* beside a vision tower, a published-style config with
text_config and global_head_dim): config fields, every leaf equal to its transformed HF
tensor, the KV-shared layers' leftover k/v tensors and the tower skipped, the Gemma tool format
and thought-channel markers detected from the template; then inspect-artifact's Gemma lines."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_jax.artifact.convert import convert
from ninfer_jax.artifact.format import load_artifact
from ninfer_jax.artifact.safetensors_io import write_safetensors
from ninfer_jax.cli.main import main
from test_hf_convert import write_tokenizer_files

GEMMA_TEMPLATE = ("{% for m in messages %}<|turn>{{ m.role }}\n{{ m.content }}<turn|>\n"
                  "{% endfor %}{# <|channel>thought ... <channel|>; "
                  "<|tool_call>call:NAME{...}<tool_call|> #}")
TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


@pytest.fixture(scope="module")
def model():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Gemma4TextConfig(
        vocab_size=264, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
        num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=6,
        layer_types=TYPES, hidden_size_per_layer_input=4, vocab_size_per_layer_input=264,
        num_kv_shared_layers=2, final_logit_softcapping=30.0, eos_token_id=262)
    model = transformers.Gemma4ForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model


def test_saved_gemma_checkpoint_converts_leaf_by_leaf(model, tmp_path):
    directory = tmp_path / "Gemma4-Tiny"
    model.save_pretrained(directory)
    write_tokenizer_files(directory, template=GEMMA_TEMPLATE)
    artifact = load_artifact(convert(directory, tmp_path / "gemma.ninfer"))
    check_leaves(artifact, {k: v.detach().numpy() for k, v in model.state_dict().items()})


def test_multimodal_wrapper_layout_converts_its_text_model(model, tmp_path):
    directory = tmp_path / "Gemma4-Wrapped"
    directory.mkdir()
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    stored = {k.replace("model.", "model.language_model.", 1): v for k, v in state.items()}
    stored["model.vision_tower.patch.weight"] = np.ones((4, 4), np.float32)
    for layer in (2, 3):  # KV-shared layers: k/v a checkpoint may still hold, never read
        stored[f"model.language_model.layers.{layer}.self_attn.k_proj.weight"] = np.ones(
            (16, 32), np.float32)
    write_safetensors(directory / "model.safetensors", stored)
    text = {k: v for k, v in model.config.to_dict().items() if k != "per_layer_config"}
    text |= {"global_head_dim": 16, "num_global_key_value_heads": 1}
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
        "vision_config": {"hidden_size": 4}}))
    write_tokenizer_files(directory, template=GEMMA_TEMPLATE)
    artifact = load_artifact(convert(directory, tmp_path / "wrapped.ninfer"))
    check_leaves(artifact, state)


def check_leaves(artifact, state):
    config, params = artifact.config, artifact.params
    assert (config.architecture, config.layer_types, config.sliding_window) == (
        "gemma4", tuple(TYPES), 6)
    assert (config.global_head_dim, config.global_num_kv_heads, config.attention_k_eq_v) == (
        16, 1, True)
    assert (config.num_kv_shared_layers, config.hidden_size_per_layer_input) == (2, 4)
    assert config.final_logit_softcapping == 30.0 and config.tie_word_embeddings
    assert artifact.chat_format["tool_call_format"] == "gemma4"
    assert artifact.chat_format["reasoning"] is None  # the byte vocabulary has no <channel|>
    np.testing.assert_array_equal(params["embed"], state["model.embed_tokens.weight"])
    np.testing.assert_array_equal(params["ple_embed"],
                                  state["model.embed_tokens_per_layer.weight"])
    np.testing.assert_array_equal(params["ple_model_proj"],
                                  state["model.per_layer_model_projection.weight"].T)
    for i, layer in enumerate(params["layers"]):
        p = f"model.layers.{i}."
        np.testing.assert_array_equal(layer["wq"], state[p + "self_attn.q_proj.weight"].T)
        np.testing.assert_array_equal(layer["post_mlp_norm"],
                                      state[p + "post_feedforward_layernorm.weight"])
        np.testing.assert_array_equal(layer["layer_scalar"], state[p + "layer_scalar"])
        np.testing.assert_array_equal(layer["ple_gate"], state[p + "per_layer_input_gate.weight"].T)
    assert "wv" not in params["layers"][1] and "wv" in params["layers"][0]
    assert not {"wk", "wv", "k_norm"} & (set(params["layers"][2]) | set(params["layers"][3]))


def test_inspect_a_tiny_gemma_artifact(tmp_path):
    out = tmp_path / "gemma.ninfer"
    result = CliRunner().invoke(main, ["init-random", "--preset", "gemma4-tiny", str(out),
                                       "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(CliRunner().invoke(main, ["inspect-artifact", str(out), "--json"]).output)
    # f32 KV: the full layer's pages 1 head of 32, the sliding layer's ring 2 heads of 16
    assert report["model"]["kv"]["bytes_per_token"] == 2 * 1 * 32 * 4
    assert report["model"]["kv"]["sliding_bytes_per_token"] == 2 * 2 * 16 * 4
    text = CliRunner().invoke(main, ["inspect-artifact", str(out)]).output
    assert "layer types   1 sliding, 1 full: 1 sliding, 1 full" in text
    assert "sliding attn  1 layer(s), 2 kv heads of 16, RoPE on 16 dims, theta 10000, " \
        "window 16" in text
    assert "full attn     1 layer(s), 1 kv heads of 32, RoPE on 8 dims" in text
    assert "keys as values on" in text
    assert "per-layer inputs 8, logit soft cap 30.0" in text
