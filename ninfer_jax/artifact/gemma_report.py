"""What `ninfer inspect-artifact` says about a Gemma 4 model beyond its tensors (the report's
`gemma` entry): the sliding / full layer pattern and window, each kind's attention shape and
RoPE, KV sharing, per-layer inputs, the soft cap, and the KV bytes per token of the layers
that keep their own KV (in the artifact's float dtype, `embed`'s format): the full layers'
pages, which grow with the context, and the sliding layers' rings (model/gemma.py), of which a
sequence holds only its window plus one step's tokens."""
from __future__ import annotations

from typing import Any

from ninfer_jax.artifact.weights_io import human_bytes
from ninfer_jax.model.config import ModelConfig

_FLOAT_BYTES = {"f32": 4, "bf16": 2}


def gemma_summary(config: ModelConfig, weight_formats: dict[str, str]) -> dict[str, Any]:
    float_bytes = _FLOAT_BYTES.get(weight_formats.get("embed"), 2)
    types = config.layer_types
    full = next((i for i, t in enumerate(types) if t == "full_attention"), None)
    kinds = {"sliding_attention": types.count("sliding_attention"),
             "full_attention": types.count("full_attention")}
    attention = {"sliding": {"kv_heads": config.num_kv_heads, "head_dim": config.head_dim,
                             "window": config.sliding_window, "rope_theta": config.rope_theta}}
    if full is not None:
        D = config.layer_head_dim(full)
        attention["full"] = {
            "kv_heads": config.layer_kv_heads(full), "head_dim": D,
            "keys_as_values": config.attention_k_eq_v, "rope_theta": config.global_rope_theta,
            "rotary_dims": 2 * int(config.partial_rotary_factor * D // 2)}
    per_layer = {i: 2 * config.layer_kv_heads(i) * config.layer_head_dim(i) * float_bytes
                 for i in config.cache_layers()}
    rings = set(config.ring_layers())
    kv = sum(b for i, b in per_layer.items() if i not in rings)
    ring = sum(b for i, b in per_layer.items() if i in rings)
    return {"layers": kinds, "attention": attention,
            "kv_shared_layers": config.num_kv_shared_layers,
            "cache_layers": len(config.cache_layers()),
            "per_layer_input_width": config.hidden_size_per_layer_input,
            "final_logit_softcapping": config.final_logit_softcapping,
            "kv_bytes_per_token": kv, "sliding_kv_bytes_per_token": ring}


def format_gemma(summary: dict[str, Any]) -> list[str]:
    """The readable lines of a `gemma` entry."""
    layers, attention = summary["layers"], summary["attention"]
    sliding = attention["sliding"]
    lines = [f"layer types   {layers['sliding_attention']} sliding_attention (window "
             f"{sliding['window']}), {layers['full_attention']} full_attention",
             f"sliding attn  {sliding['kv_heads']} kv heads of {sliding['head_dim']}, RoPE "
             f"theta {sliding['rope_theta']:g}"]
    if "full" in attention:
        full = attention["full"]
        lines.append(f"full attn     {full['kv_heads']} kv heads of {full['head_dim']}"
                     f"{', keys as values' if full['keys_as_values'] else ''}, RoPE on "
                     f"{full['rotary_dims']} dims, theta {full['rope_theta']:g}")
    lines.append(f"KV/token      {human_bytes(summary['kv_bytes_per_token'])} "
                 f"({summary['kv_bytes_per_token']:,} bytes in pages, full layers) + "
                 f"{human_bytes(summary['sliding_kv_bytes_per_token'])} in the sliding rings "
                 f"(window + a step's tokens per sequence); {summary['cache_layers']} layers "
                 f"with their own KV, {summary['kv_shared_layers']} KV-shared")
    lines.append(f"extras        per-layer inputs {summary['per_layer_input_width'] or 'off'}, "
                 f"logit soft cap {summary['final_logit_softcapping'] or 'off'}")
    return lines
