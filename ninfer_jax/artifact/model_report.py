"""What `ninfer inspect-artifact` says about a model beyond its tensors (the report's `model`
entry), the same facts under the same labels for every family: the layer kinds and their
pattern, each attention kind's shape, RoPE and window, the attention options, the recurrent
state per sequence of the state layers (Gated DeltaNet, Mamba-2), the KV bytes per token (paged
layers, and Gemma's sliding rings, of which a sequence holds only its window plus one step's
tokens), the MoE shape with its router, the MTP head and the remaining extras. A fact a family
lacks reads as absent (None, 0, off), never as a missing label.

Sizes assume the engine keeps KV and conv state in the artifact's float dtype (`embed`'s
format: f32 or bf16) and the delta-rule or SSM state in f32 (model/config.py state_shapes)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_jax.artifact.components import mtp_expected_shapes
from ninfer_jax.artifact.weights_io import human_bytes
from ninfer_jax.model.config import ModelConfig

# Short names of the layer kinds in patterns and attention labels (Nemotron-H's "attention"
# layers are full attention without RoPE).
_SHORT = {"linear_attention": "linear", "full_attention": "full", "attention": "full",
          "sliding_attention": "sliding", "mamba": "mamba", "mlp": "mlp", "moe": "moe"}
# One letter a layer when runs would be too long (HF's hybrid_override_pattern letters for
# Nemotron-H's kinds, the initial for the others).
_LETTERS = {"linear_attention": "L", "full_attention": "*", "attention": "*",
            "sliding_attention": "S", "mamba": "M", "mlp": "-", "moe": "E"}
_MAX_RUNS = 8
_ATTENTION_KINDS = ("full_attention", "sliding_attention", "attention")
_FLOAT_BYTES = {"f32": 4, "bf16": 2}


def layer_types(config: ModelConfig) -> tuple[str, ...]:
    """Every layer's kind; the dense families (no layer_types) are all full attention."""
    return config.layer_types or ("full_attention",) * config.num_layers


def layer_pattern(types: tuple[str, ...]) -> str:
    """The shortest repeating period as runs, e.g. `(3 linear, 1 full) x 16`; one letter a
    layer (_LETTERS, e.g. `M-M-M*-...`) when the period has more than _MAX_RUNS runs."""
    n = len(types)
    period = next(p for p in range(1, n + 1) if n % p == 0 and types == types[:p] * (n // p))
    runs: list[list] = []
    for kind in types[:period]:
        if runs and runs[-1][1] == kind:
            runs[-1][0] += 1
        else:
            runs.append([1, kind])
    if len(runs) > _MAX_RUNS:
        return "".join(_LETTERS[kind] for kind in types)
    text = ", ".join(f"{count} {_SHORT[kind]}" for count, kind in runs)
    return f"({text}) x {n // period}" if n // period > 1 else text


def model_summary(config: ModelConfig, weight_formats: dict[str, str]) -> dict[str, Any]:
    """JSON-ready facts about any config (the report's `model` entry)."""
    float_bytes = _FLOAT_BYTES.get(weight_formats.get("embed"), 2)
    types = layer_types(config)
    kv_layer = {i: 2 * config.layer_kv_heads(i) * config.layer_head_dim(i) * float_bytes
                for i in config.cache_layers()}
    rings = set(config.ring_layers())
    return {
        "layers": {"counts": {_SHORT[kind]: types.count(kind) for kind in dict.fromkeys(types)},
                   "pattern": layer_pattern(types)},
        "attention": _attention(config, types),
        "state": _state(config, float_bytes),
        "kv": {"bytes_per_token": sum(b for i, b in kv_layer.items() if i not in rings),
               "sliding_bytes_per_token": sum(b for i, b in kv_layer.items() if i in rings),
               "layers": len(kv_layer), "shared_layers": config.num_kv_shared_layers},
        "moe": _moe(config, types),
        "mtp": _mtp(config, float_bytes),
        "extras": {"per_layer_input_width": config.hidden_size_per_layer_input,
                   "final_logit_softcapping": config.final_logit_softcapping},
    }


def _attention(config: ModelConfig, types: tuple[str, ...]) -> dict[str, Any]:
    kinds = {}
    for kind in _ATTENTION_KINDS:
        if kind not in types:
            continue
        i = types.index(kind)
        D = config.layer_head_dim(i)
        kinds[_SHORT[kind]] = {
            "layers": types.count(kind), "kv_heads": config.layer_kv_heads(i), "head_dim": D,
            "window": config.sliding_window if kind == "sliding_attention" else None,
            **_rope(config, kind, D)}
    shapes = config.expected_shapes()
    first = next((f"layers.{i}." for i, kind in enumerate(types) if kind in _ATTENTION_KINDS),
                 None)
    return {"kinds": kinds, "options": {
        "biases": f"{first}bq" in shapes, "qk_norm": f"{first}q_norm" in shapes,
        "output_gate": config.attn_output_gate, "keys_as_values": config.attention_k_eq_v}}


def _rope(config: ModelConfig, kind: str, D: int) -> dict[str, Any]:
    """RoPE of one attention kind: Nemotron-H has none, Gemma's full layers rotate their own
    share over their own base, every other kind the first D * partial_rotary_factor dims."""
    if config.is_nemotron:
        return {"rotary_dims": 0, "rope_theta": None}
    if config.is_gemma:
        if kind == "sliding_attention":
            return {"rotary_dims": D, "rope_theta": config.rope_theta}
        return {"rotary_dims": 2 * int(config.partial_rotary_factor * D // 2),
                "rope_theta": config.global_rope_theta}
    return {"rotary_dims": int(D * config.partial_rotary_factor),
            "rope_theta": config.rope_theta}


def _state(config: ModelConfig, float_bytes: int) -> dict[str, Any] | None:
    num_layers = len(config.state_layers())
    if not num_layers:
        return None
    shapes = config.state_shapes()
    conv = int(np.prod(shapes["conv"])) * float_bytes
    recurrent = int(np.prod(shapes["recurrent"])) * 4
    # Groups: the B/C groups of Mamba-2, the key heads of the Gated DeltaNet (each shared by
    # a run of value heads), the same sharing under each family's name.
    groups = config.mamba_num_groups if config.is_nemotron else config.linear_num_key_heads
    return {"mixer": "mamba2" if config.is_nemotron else "gated_deltanet",
            "layers": num_layers, "groups": groups, "conv_taps": shapes["conv"][0] + 1,
            "conv_shape": list(shapes["conv"]), "recurrent_shape": list(shapes["recurrent"]),
            "conv_per_layer": conv, "recurrent_per_layer": recurrent,
            "total": num_layers * (conv + recurrent)}


def _moe(config: ModelConfig, types: tuple[str, ...]) -> dict[str, Any] | None:
    if not config.num_experts:
        return None
    grouped = config.is_glm or config.is_nemotron  # model/moe_mlp.py's two routers
    dense = ([i for i, kind in enumerate(types) if kind == "mlp"] if config.is_nemotron
             else list(config.mlp_only_layers))
    return {"experts": config.num_experts, "top_k": config.num_experts_per_tok,
            "expert_width": config.moe_intermediate_size,
            "activation": "relu2" if config.is_nemotron else "swiglu",
            "shared_expert_width": config.shared_expert_intermediate_size,
            "shared_expert_gate": config.is_hybrid, "renormalise_top_k": config.norm_topk_prob,
            "dense_layers": dense,
            "router": {"scores": "sigmoid" if grouped else "softmax",
                       "correction_bias": grouped, "groups": config.num_expert_groups,
                       "top_groups": config.num_topk_groups,
                       "scaling": config.routed_scaling_factor}}


def _mtp(config: ModelConfig, float_bytes: int) -> dict[str, Any] | None:
    if not config.mtp_num_layers:
        return None
    shapes = mtp_expected_shapes(config)
    return {"layers": config.mtp_num_layers,
            "parameters": sum(int(np.prod(s)) for s in shapes.values()),
            "kv_bytes_per_token": config.mtp_num_layers * 2 * config.num_kv_heads
            * config.head_dim * float_bytes}


def format_model(summary: dict[str, Any]) -> list[str]:
    """The readable lines of a `model` entry, each under a 14-column label."""
    layers, attention = summary["layers"], summary["attention"]
    counts = ", ".join(f"{n} {kind}" for kind, n in layers["counts"].items())
    lines = [f"layer types   {counts}: {layers['pattern']}"]
    lines += [f"{kind + ' attn':<14}{_attention_kind_line(facts)}"
              for kind, facts in attention["kinds"].items()]
    options = attention["options"]
    lines.append(f"attn options  q/k/v biases {_on(options['biases'])}, q/k norm "
                 f"{_on(options['qk_norm'])}, output gate {_on(options['output_gate'])}, "
                 f"keys as values {_on(options['keys_as_values'])}")
    if summary["state"]:
        lines.append(_state_line(summary["state"]))
    lines.append(_kv_line(summary["kv"]))
    if summary["moe"]:
        lines.append(_moe_line(summary["moe"]))
    if summary["mtp"]:
        mtp = summary["mtp"]
        lines.append(f"MTP head      {mtp['layers']} layer(s), {mtp['parameters']:,} parameters, "
                     f"KV/token {human_bytes(mtp['kv_bytes_per_token'])} (mtp component)")
    extras = summary["extras"]
    lines.append(f"extras        per-layer inputs {extras['per_layer_input_width'] or 'off'}, "
                 f"logit soft cap {extras['final_logit_softcapping'] or 'off'}")
    return lines


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _attention_kind_line(facts: dict[str, Any]) -> str:
    rope = (f"RoPE on {facts['rotary_dims']} dims, theta {facts['rope_theta']:g}"
            if facts["rotary_dims"] else "no RoPE")
    window = f", window {facts['window']}" if facts["window"] else ""
    return (f"{facts['layers']} layer(s), {facts['kv_heads']} kv heads of {facts['head_dim']}, "
            f"{rope}{window}")


def _state_line(state: dict[str, Any]) -> str:
    return (f"state/seq     {human_bytes(state['total'])} ({state['total']:,} bytes): "
            f"{state['layers']} {state['mixer']} layer(s) of {state['groups']} groups, each conv "
            f"{state['conv_shape']} {human_bytes(state['conv_per_layer'])} + recurrent "
            f"{state['recurrent_shape']} f32 {human_bytes(state['recurrent_per_layer'])}")


def _kv_line(kv: dict[str, Any]) -> str:
    rings = (f" + {human_bytes(kv['sliding_bytes_per_token'])} in the sliding rings (window + "
             "a step's tokens per sequence)" if kv["sliding_bytes_per_token"] else "")
    return (f"KV/token      {human_bytes(kv['bytes_per_token'])} ({kv['bytes_per_token']:,} "
            f"bytes in pages){rings}; {kv['layers']} layer(s) with their own KV, "
            f"{kv['shared_layers']} KV-shared")


def _moe_line(moe: dict[str, Any]) -> str:
    router = moe["router"]
    scores = "sigmoid + correction bias" if router["correction_bias"] else router["scores"]
    return (f"MoE           {moe['experts']} {moe['activation']} experts of "
            f"{moe['expert_width']}, top-{moe['top_k']}"
            f"{' renormalised' if moe['renormalise_top_k'] else ''}, shared expert of "
            f"{moe['shared_expert_width']}{' (gated)' if moe['shared_expert_gate'] else ''}, "
            f"dense layers {moe['dense_layers']}; router {scores}, top-{router['top_groups']} "
            f"of {router['groups']} groups, scaling {router['scaling']:g}")
