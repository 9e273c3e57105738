"""Model configuration: the architecture hyper-parameters stored in an artifact's metadata.

One dataclass for the dense families (`llama`, `qwen3`); hybrid families extend it with their
own fields later. `to_dict`/`from_dict` are the metadata.json representation.

Params pytree (weights stored as [in, out] so a projection is `x @ w`):
    embed        [V, H]
    final_norm   [H]
    lm_head      [H, V]            absent when tie_word_embeddings (embed.T is used)
    layers       list of L dicts:
        attn_norm [H]
        wq [H, NH*D]  wk [H, NK*D]  wv [H, NK*D]  wo [NH*D, H]
        q_norm [D]  k_norm [D]      qwen3 only (per-head RMSNorm before RoPE)
        mlp_norm [H]
        w_gate [H, F]  w_up [H, F]  w_down [F, H]
A quantized weight leaf is a dict (see kernels/quant_matmul) instead of a plain array.
"""
from __future__ import annotations

import dataclasses
from typing import Any

ARCHITECTURES = ("llama", "qwen3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # llama3-style scaling dict, or None
    tie_word_embeddings: bool = False
    qk_norm: bool = False  # qwen3
    max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {self.architecture!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")

    def __hash__(self):
        # Explicit because rope_scaling is a dict; the config is a static argument of jitted steps.
        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        return hash(tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v for v in values))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown model config fields: {sorted(unknown)}")
        return cls(**data)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat name -> shape for every tensor of the text model (plain-array form)."""
        H, V, F = self.hidden_size, self.vocab_size, self.intermediate_size
        NH, NK, D = self.num_heads, self.num_kv_heads, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"embed": (V, H), "final_norm": (H,)}
        if not self.tie_word_embeddings:
            shapes["lm_head"] = (H, V)
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes.update({
                p + "attn_norm": (H,), p + "wq": (H, NH * D), p + "wk": (H, NK * D),
                p + "wv": (H, NK * D), p + "wo": (NH * D, H), p + "mlp_norm": (H,),
                p + "w_gate": (H, F), p + "w_up": (H, F), p + "w_down": (F, H),
            })
            if self.qk_norm:
                shapes[p + "q_norm"] = (D,)
                shapes[p + "k_norm"] = (D,)
        return shapes
