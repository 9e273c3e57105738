"""Tiny random Hugging Face models as a numerical reference, and a loader into our params pytree.

The models are built in the test, saved with save_pretrained and read back from their safetensors
so the weights take the same path a real checkpoint would. Weights are drawn wider than HF's
default init (and norms away from 1) so that every term of the forward pass matters.
"""
from __future__ import annotations

import pathlib
import types

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from ninfer_jax.model.config import ModelConfig

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def tiny_hf_model(architecture: str, seed: int = 0):
    """A random f32 eager-attention model: llama (llama3 rope scaling, untied head) or qwen3
    (QK-norm, head_dim decoupled from hidden/heads, tied embeddings)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, rms_norm_eps=1e-6,
                  max_position_embeddings=256, attn_implementation="eager")
    if architecture == "llama":
        hf_config = LlamaConfig(**common, head_dim=8, tie_word_embeddings=False,
                                rope_parameters={**LLAMA3_ROPE, "rope_theta": 500.0})
        model = LlamaForCausalLM(hf_config)
    else:
        hf_config = Qwen3Config(**common, head_dim=16, tie_word_embeddings=True,
                                rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
        model = Qwen3ForCausalLM(hf_config)
    randomize(model)
    return model.float().eval()


def saved_tiny_model(architecture: str, checkpoint_dir: pathlib.Path, seed: int = 0):
    """(HF model, artifact stand-in with .config and .params) of tiny_hf_model(architecture,
    seed), its weights saved to `checkpoint_dir` and read back the way a checkpoint is."""
    model = tiny_hf_model(architecture, seed=seed)
    model.save_pretrained(checkpoint_dir)
    config = model_config_from_hf(model.config)
    return model, types.SimpleNamespace(config=config, params=load_params(checkpoint_dir, config))


def randomize(model) -> None:
    """Random weights with norm weights around 1 (not the ones transformers starts from), so a
    norm left out or applied twice changes the numbers."""
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.copy_(1.0 + 0.3 * torch.randn_like(tensor))
            else:
                tensor.copy_(0.15 * torch.randn_like(tensor))


def model_config_from_hf(hf_config) -> ModelConfig:
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    theta = rope.pop("rope_theta", 10000.0)
    scaling = rope if rope.get("rope_type", "default") != "default" else None
    return ModelConfig(
        architecture=hf_config.model_type, vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size, intermediate_size=hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers, num_heads=hf_config.num_attention_heads,
        num_kv_heads=hf_config.num_key_value_heads, head_dim=hf_config.head_dim,
        rms_norm_eps=hf_config.rms_norm_eps, rope_theta=theta, rope_scaling=scaling,
        tie_word_embeddings=hf_config.tie_word_embeddings,
        qk_norm=hf_config.model_type == "qwen3",
        max_position_embeddings=hf_config.max_position_embeddings)


_LAYER_NAMES = {  # ours -> HF suffix under model.layers.{i}.; projections are transposed
    "attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight", "wo": "self_attn.o_proj.weight",
    "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}


def load_params(checkpoint_dir: pathlib.Path, config: ModelConfig) -> dict:
    """Our params pytree (numpy f32) from a save_pretrained directory."""
    tensors = {}
    for path in sorted(pathlib.Path(checkpoint_dir).glob("*.safetensors")):
        tensors.update(load_file(str(path)))

    def get(name, transpose=False):
        array = np.asarray(tensors[name], dtype=np.float32)
        return np.ascontiguousarray(array.T) if transpose else array

    params = {"embed": get("model.embed_tokens.weight"), "final_norm": get("model.norm.weight")}
    if not config.tie_word_embeddings:
        params["lm_head"] = get("lm_head.weight", transpose=True)
    params["layers"] = []
    for i in range(config.num_layers):
        layer = {}
        for ours, theirs in _LAYER_NAMES.items():
            if ours in ("q_norm", "k_norm") and not config.qk_norm:
                continue
            layer[ours] = get(f"model.layers.{i}.{theirs}", transpose=ours.startswith("w"))
        params["layers"].append(layer)
    return params


def reference_logits(model, token_ids) -> np.ndarray:
    """HF logits [T, V] (f32) of one full causal forward over token_ids."""
    with torch.no_grad():
        out = model(torch.tensor([list(token_ids)], dtype=torch.long))
    return out.logits[0].float().numpy()


def hf_greedy(model, prompt, num_new) -> list[int]:
    """The num_new tokens HF's greedy decoding appends to prompt (one full forward each)."""
    tokens = list(prompt)
    for _ in range(num_new):
        tokens.append(int(reference_logits(model, tokens)[-1].argmax()))
    return tokens[len(prompt):]
