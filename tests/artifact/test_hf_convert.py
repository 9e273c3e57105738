"""Hugging Face checkpoint conversion: llama and qwen3 directories (written here with numpy,
and one saved by transformers itself) convert to our [in, out] params."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from ninfer_jax.artifact.convert import convert
from ninfer_jax.artifact.format import load_artifact
from ninfer_jax.artifact.safetensors_io import write_safetensors
from ninfer_jax.errors import ArtifactError
from tiny_artifacts import byte_tokenizer

QWEN_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def hf_tensors(layers, hidden, heads, kv_heads, head_dim, ffn, vocab, *, qk_norm, tied, seed=0):
    """torch-layout ([out, in]) tensors under Hugging Face names."""
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not tied:
        shapes["lm_head.weight"] = (vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                       p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                       p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                       p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                       p + "post_attention_layernorm.weight": (hidden,),
                       p + "mlp.gate_proj.weight": (ffn, hidden),
                       p + "mlp.up_proj.weight": (ffn, hidden),
                       p + "mlp.down_proj.weight": (hidden, ffn)})
        if qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (head_dim,)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def write_tokenizer_files(directory, template=QWEN_TEMPLATE, eos="<|im_end|>"):
    (directory / "tokenizer.json").write_text(byte_tokenizer().to_str())
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "eos_token": eos, "bos_token": None}))


@pytest.fixture
def qwen3_dir(tmp_path):
    directory = tmp_path / "Qwen3-Tiny"
    directory.mkdir()
    tensors = hf_tensors(2, 32, 4, 2, 16, 48, 264, qk_norm=True, tied=True)
    names = list(tensors)
    write_safetensors(directory / "model-00001-of-00002.safetensors",
                      {n: tensors[n] for n in names[:10]})
    write_safetensors(directory / "model-00002-of-00002.safetensors",
                      {n: tensors[n] for n in names[10:]})
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 264, "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "tie_word_embeddings": True, "max_position_embeddings": 4096}))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [262, 260]}))
    write_tokenizer_files(directory)
    return directory, tensors


def test_qwen3_directory(qwen3_dir, tmp_path):
    directory, tensors = qwen3_dir
    artifact = load_artifact(convert(directory, tmp_path / "q.ninfer"))
    config = artifact.config
    assert (config.architecture, config.head_dim, config.qk_norm, config.tie_word_embeddings,
            config.rope_theta, config.rope_scaling) == ("qwen3", 16, True, True, 1e6, None)
    assert artifact.name == "qwen3-tiny"
    assert artifact.eos_ids == [262, 260]
    assert artifact.chat_template == QWEN_TEMPLATE
    assert "lm_head" not in artifact.params
    layer = artifact.params["layers"][1]
    np.testing.assert_array_equal(layer["wq"], tensors["model.layers.1.self_attn.q_proj.weight"].T)
    np.testing.assert_array_equal(layer["w_down"], tensors["model.layers.1.mlp.down_proj.weight"].T)
    np.testing.assert_array_equal(layer["k_norm"], tensors["model.layers.1.self_attn.k_norm.weight"])
    np.testing.assert_array_equal(artifact.params["embed"], tensors["model.embed_tokens.weight"])


def test_llama_directory_bf16_source_and_scaling(tmp_path):
    directory = tmp_path / "llama"
    directory.mkdir()
    tensors = hf_tensors(1, 32, 4, 4, 8, 64, 264, qk_norm=False, tied=False, seed=3)
    write_safetensors(directory / "model.safetensors",
                      {n: t.astype(ml_dtypes.bfloat16) for n, t in tensors.items()})
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 264, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "rope_theta": 500000.0, "rope_scaling": scaling, "eos_token_id": 262}))
    (directory / "tokenizer.json").write_text(byte_tokenizer().to_str())
    (directory / "chat_template.jinja").write_text("{{ messages[0].content }}")
    artifact = load_artifact(convert(directory, tmp_path / "l.ninfer", dtype="bf16"))
    config = artifact.config
    assert (config.num_kv_heads, config.head_dim, config.rope_theta) == (4, 8, 500000.0)
    assert config.rope_scaling == scaling
    assert artifact.chat_template == "{{ messages[0].content }}"
    wo = artifact.params["layers"][0]["wo"]
    assert str(wo.dtype) == "bfloat16"
    expected = tensors["model.layers.0.self_attn.o_proj.weight"].astype(ml_dtypes.bfloat16).T
    np.testing.assert_array_equal(wo, expected)
    assert artifact.params["lm_head"].shape == (32, 264)


def test_unknown_architecture_is_refused(qwen3_dir, tmp_path):
    directory, _ = qwen3_dir
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError) as info:
        convert(directory, tmp_path / "x.ninfer")
    assert info.value.path == str(directory / "config.json")
    assert not (tmp_path / "x.ninfer").exists()


def test_unknown_tensor_is_refused(qwen3_dir, tmp_path):
    directory, _ = qwen3_dir
    write_safetensors(directory / "extra.safetensors",
                      {"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)})
    with pytest.raises(ArtifactError, match="unsupported tensor 'model.layers.0.self_attn.q_proj.bias'"):
        convert(directory, tmp_path / "x.ninfer")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_checkpoint_saved_by_transformers(arch, tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=264, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, eos_token_id=262)
    if arch == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            head_dim=16, tie_word_embeddings=True, **common))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            tie_word_embeddings=False, **common))
    model.save_pretrained(tmp_path / "hf")
    write_tokenizer_files(tmp_path / "hf")
    artifact = load_artifact(convert(tmp_path / "hf", tmp_path / "out.ninfer"))
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    layer = artifact.params["layers"][1]
    np.testing.assert_array_equal(layer["wk"], state["model.layers.1.self_attn.k_proj.weight"].T)
    np.testing.assert_array_equal(layer["w_gate"], state["model.layers.1.mlp.gate_proj.weight"].T)
    assert ("lm_head" in artifact.params) == (arch == "llama")
    if arch == "llama":
        np.testing.assert_array_equal(artifact.params["lm_head"], state["lm_head.weight"].T)
