"""Tiny random transformers models of the hybrid families, and their weights in our params pytree.

qwen3_5 and qwen3_5_moe use the text-only causal LMs (Qwen3_5ForCausalLM,
Qwen3_5MoeForCausalLM; the Qwen3_5*ForConditionalGeneration classes wrap a vision tower);
qwen3_next is text-only. Every parameter is randomised, the zero-centred norms (zeros at init,
so a 1 + w bug would not show), the DeltaNet's plain output norm, A_log and dt_bias included.
Weights are mapped from the model's state_dict; Qwen3-Next's per-key-head grouped in_proj_qkvz /
in_proj_ba are un-grouped into our Q | K | V, z, b and a leaves.
"""
from __future__ import annotations

import numpy as np
import torch
from transformers import (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig,
                          Qwen3_5TextConfig, Qwen3NextConfig, Qwen3NextForCausalLM)

from ninfer_jax.model.config import ModelConfig

ARCHITECTURES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
_OUR_ARCHITECTURE = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe",
                     "qwen3_next": "qwen3_next"}
_COMMON = dict(
    vocab_size=96, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=256,
    linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=12,
    linear_num_key_heads=2, linear_num_value_heads=4, attn_implementation="eager",
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5})
_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=12,
            shared_expert_intermediate_size=20)


def tiny_hybrid_model(architecture: str, seed: int = 0):
    """A random f32 eager model; qwen3_5 ties its embeddings, qwen3_next has a dense-MLP layer."""
    torch.manual_seed(seed)
    if architecture == "qwen3_5":
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**_COMMON, intermediate_size=40,
                                                     tie_word_embeddings=True))
    elif architecture == "qwen3_5_moe":
        model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**_COMMON, **_MOE))
    else:
        model = Qwen3NextForCausalLM(Qwen3NextConfig(**_COMMON, **_MOE, intermediate_size=40,
                                                     mlp_only_layers=[2]))
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            tensor.copy_(_random_like(name, tensor))
    return model.float().eval()


def _random_like(name: str, tensor):
    noise = torch.randn_like(tensor)
    if name.endswith("linear_attn.norm.weight"):  # plain weight around 1
        return 1.0 + 0.3 * noise
    if name.endswith("norm.weight"):  # zero-centred: applied as 1 + w
        return 0.3 * noise
    if name.endswith("A_log"):  # decays exp(A_log) * softplus(.) around 0.1: memory spans chunks
        return -2.0 + 0.5 * noise
    if name.endswith("dt_bias") or name.endswith("conv1d.weight"):
        return 0.5 * noise
    return 0.15 * noise


def model_config_from_hf(hf_config) -> ModelConfig:
    rope = dict(hf_config.rope_parameters)
    architecture = _OUR_ARCHITECTURE[hf_config.model_type]
    num_experts = getattr(hf_config, "num_experts", 0)
    sparse_step = getattr(hf_config, "decoder_sparse_step", 1)
    mlp_only = sorted(set(getattr(hf_config, "mlp_only_layers", None) or ()) | {
        i for i in range(hf_config.num_hidden_layers) if (i + 1) % sparse_step})
    return ModelConfig(
        architecture=architecture, vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=getattr(hf_config, "intermediate_size", 0),
        num_layers=hf_config.num_hidden_layers, num_heads=hf_config.num_attention_heads,
        num_kv_heads=hf_config.num_key_value_heads, head_dim=hf_config.head_dim,
        rms_norm_eps=hf_config.rms_norm_eps, rope_theta=rope["rope_theta"],
        tie_word_embeddings=hf_config.tie_word_embeddings,
        max_position_embeddings=hf_config.max_position_embeddings,
        layer_types=tuple(hf_config.layer_types),
        partial_rotary_factor=rope.get("partial_rotary_factor", 1.0), attn_output_gate=True,
        linear_num_key_heads=hf_config.linear_num_key_heads,
        linear_num_value_heads=hf_config.linear_num_value_heads,
        linear_key_head_dim=hf_config.linear_key_head_dim,
        linear_value_head_dim=hf_config.linear_value_head_dim,
        linear_conv_kernel_dim=hf_config.linear_conv_kernel_dim,
        num_experts=num_experts, num_experts_per_tok=getattr(hf_config, "num_experts_per_tok", 0),
        moe_intermediate_size=getattr(hf_config, "moe_intermediate_size", 0),
        shared_expert_intermediate_size=getattr(hf_config, "shared_expert_intermediate_size", 0),
        # Qwen3.5-MoE's router always renormalises (its config has no norm_topk_prob)
        norm_topk_prob=getattr(hf_config, "norm_topk_prob", True),
        mlp_only_layers=tuple(mlp_only) if num_experts else ())


def load_params(model, config: ModelConfig) -> dict:
    """Our params pytree (numpy f32) from the model's state_dict."""
    tensors = {name: t.detach().float().numpy() for name, t in model.state_dict().items()}

    def linear(name):  # torch [out, in] -> ours [in, out]
        return np.ascontiguousarray(tensors[name].T)

    params = {"embed": tensors["model.embed_tokens.weight"],
              "final_norm": tensors["model.norm.weight"]}
    if not config.tie_word_embeddings:
        params["lm_head"] = linear("lm_head.weight")
    params["layers"] = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        layer = {"attn_norm": tensors[p + "input_layernorm.weight"],
                 "mlp_norm": tensors[p + "post_attention_layernorm.weight"]}
        if config.layer_types[i] == "full_attention":
            layer.update({ours: linear(p + f"self_attn.{theirs}_proj.weight")
                          for ours, theirs in (("wq", "q"), ("wk", "k"), ("wv", "v"),
                                               ("wo", "o"))})
            layer["q_norm"] = tensors[p + "self_attn.q_norm.weight"]
            layer["k_norm"] = tensors[p + "self_attn.k_norm.weight"]
        else:
            layer.update(_deltanet_leaves(tensors, p + "linear_attn.", config))
        layer.update(_mlp_leaves(tensors, p + "mlp.", config.is_moe_layer(i)))
        params["layers"].append(layer)
    return params


def _deltanet_leaves(tensors, p: str, config: ModelConfig) -> dict:
    if p + "in_proj_qkvz.weight" in tensors:
        qkv, z, b, a = _ungroup_qwen3_next(tensors[p + "in_proj_qkvz.weight"],
                                           tensors[p + "in_proj_ba.weight"], config)
    else:
        qkv, z, b, a = (tensors[p + f"in_proj_{n}.weight"] for n in ("qkv", "z", "b", "a"))
    return {"in_qkv": qkv.T, "in_z": z.T, "in_b": b.T, "in_a": a.T,
            "conv": np.ascontiguousarray(tensors[p + "conv1d.weight"][:, 0, :].T),
            "dt_bias": tensors[p + "dt_bias"], "A_log": tensors[p + "A_log"],
            "gdn_norm": tensors[p + "norm.weight"],
            "out": np.ascontiguousarray(tensors[p + "out_proj.weight"].T)}


def _ungroup_qwen3_next(qkvz, ba, config: ModelConfig):
    """Rows grouped per key head [q | k | v (r heads) | z (r heads)] and [b (r) | a (r)],
    r = Hv / Hk, back to Q | K | V, z, b, a in head order (value head g*r + j)."""
    Hk, dk = config.linear_num_key_heads, config.linear_key_head_dim
    r, dv = config.linear_num_value_heads // Hk, config.linear_value_head_dim
    hidden = qkvz.shape[-1]
    grouped = qkvz.reshape(Hk, 2 * dk + 2 * r * dv, hidden)
    q, k = grouped[:, :dk], grouped[:, dk:2 * dk]
    v, z = grouped[:, 2 * dk:2 * dk + r * dv], grouped[:, 2 * dk + r * dv:]
    qkv = np.concatenate([x.reshape(-1, hidden) for x in (q, k, v)])
    ba = ba.reshape(Hk, 2 * r, hidden)
    return qkv, z.reshape(-1, hidden), ba[:, :r].reshape(-1, hidden), ba[:, r:].reshape(-1, hidden)


def _mlp_leaves(tensors, p: str, is_moe: bool) -> dict:
    def linear(name):
        return np.ascontiguousarray(tensors[p + name].T)

    if not is_moe:
        return {"w_gate": linear("gate_proj.weight"), "w_up": linear("up_proj.weight"),
                "w_down": linear("down_proj.weight")}
    leaves = {"router": linear("gate.weight"),
              "experts_gate_up": np.ascontiguousarray(
                  tensors[p + "experts.gate_up_proj"].transpose(0, 2, 1)),
              "experts_down": np.ascontiguousarray(
                  tensors[p + "experts.down_proj"].transpose(0, 2, 1))}
    if p + "shared_expert_gate.weight" in tensors:
        leaves.update({"shared_gate": linear("shared_expert_gate.weight"),
                       "shared_w_gate": linear("shared_expert.gate_proj.weight"),
                       "shared_w_up": linear("shared_expert.up_proj.weight"),
                       "shared_w_down": linear("shared_expert.down_proj.weight")})
    return leaves


def reference_logits(model, token_ids) -> np.ndarray:
    """HF logits [T, V] (f32) of one full causal forward over token_ids."""
    with torch.no_grad():
        out = model(torch.tensor([list(token_ids)], dtype=torch.long))
    return out.logits[0].float().numpy()
