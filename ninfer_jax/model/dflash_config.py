"""A DFlash / DFlash2 drafter's hyper-parameters (model/dflash.py has the forward). No jax
here: the artifact code reads and checks configs without it."""
from __future__ import annotations

import dataclasses
from typing import Any

VARIANTS = ("dflash", "dflash2")
# Dense architectures a drafter may serve (their module, model/llama.py, gives the taps);
# the hybrid families (ModelConfig.is_hybrid) are the others.
DENSE_TARGETS = ("llama", "qwen3")


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    """A drafter's hyper-parameters (metadata.json `dflash_config` / `dflash2_config`)."""

    variant: str  # "dflash" or "dflash2"
    num_layers: int
    hidden_size: int  # the target's
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    target_layer_ids: tuple[int, ...]
    block_size: int  # the block it was trained on (drafts per pass: block_size - 1)
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float = 0.0  # 0: none
    sliding_window: int = 0  # 0: every layer sees the whole context
    causal: bool = False  # block keys t' <= t only (the reference's is_causal)
    # DFlash2 only (0 for DFlash)
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0

    def __post_init__(self):
        object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}")
        if self.num_heads % self.num_kv_heads or not self.target_layer_ids:
            raise ValueError("num_heads must be a multiple of num_kv_heads, and "
                             "target_layer_ids must name at least one layer")
        is_v2 = self.variant == "dflash2"
        if is_v2 != bool(self.conv_kernel_size and self.selector_top_k):
            raise ValueError("dflash2 (and only it) has conv_kernel_size and selector_top_k")
        if is_v2 and self.hidden_size % self.conv_group_size:
            raise ValueError("hidden_size must be a multiple of conv_group_size")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError("mask_token_id is outside the vocabulary")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["target_layer_ids"] = list(self.target_layer_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DFlashConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown dflash config keys {sorted(unknown)}")
        return cls(**data)

    def expected_shapes(self, prefix: str = "") -> dict[str, tuple[int, ...]]:
        """Dotted name -> shape of every tensor (names as in the params tree)."""
        H, D, NH, NK, F = (self.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads,
                           self.intermediate_size)
        shapes = {"fc": (len(self.target_layer_ids) * H, H), "hidden_norm": (H,), "norm": (H,)}
        for i in range(self.num_layers):
            layer = {"attn_norm": (H,), "wq": (H, NH * D), "wk": (H, NK * D), "wv": (H, NK * D),
                     "wo": (NH * D, H), "q_norm": (D,), "k_norm": (D,), "mlp_norm": (H,),
                     "w_gate": (H, F), "w_up": (H, F), "w_down": (F, H)}
            if self.variant == "dflash2":
                taps, groups = self.conv_kernel_size, H // self.conv_group_size
                for conv in ("attn_conv", "mlp_conv"):
                    layer[f"{conv}_base"] = (2, taps, H)
                    layer[f"{conv}_proj"] = (H, 2 * taps * groups)
            shapes.update({f"layers.{i}.{name}": shape for name, shape in layer.items()})
        if self.variant == "dflash2":
            r, V = self.selector_rank, self.vocab_size
            shapes.update({"selector.hidden_projection": (H, r),
                           "selector.predecessor": (V, r), "selector.successor": (V, r)})
        return {prefix + name: shape for name, shape in shapes.items()}

    def check_target(self, model_config) -> None:
        """ValueError unless this drafter fits the target model."""
        if self.hidden_size != model_config.hidden_size or \
                self.vocab_size != model_config.vocab_size:
            raise ValueError(f"the {self.variant} drafter's hidden size or vocabulary differs "
                             "from the target model's")
        if max(self.target_layer_ids) >= model_config.num_layers or \
                min(self.target_layer_ids) < 0:
            raise ValueError(f"{self.variant} target_layer_ids {list(self.target_layer_ids)} "
                             f"outside the target's {model_config.num_layers} layers")
