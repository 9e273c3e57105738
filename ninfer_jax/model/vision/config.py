"""The vision tower's hyper-parameters (the artifact's `vision` component metadata) and its tree.

Qwen3-VL and Qwen3.5 share one tower: a Conv3d patch embedding over temporal_patch x patch x
patch pixels, a learned square position grid resampled to each image, ViT blocks with 2D
rotary attention inside each frame, and a patch merger that folds merge x merge patches into
one text-model token. Qwen3-VL also taps the outputs of a few blocks (`deepstack_layers`) through
their own mergers; those features are added to the text model's first hidden states.

Params pytree (weights stored [in, out], as in the text model):
    patch_embed [C*Tp*P*P, Hv]  patch_bias [Hv]      (the Conv3d kernel flattened C, Tp, P, P)
    pos_embed   [G*G, Hv]                            (G = sqrt(num_position_embeddings))
    blocks: list of `depth` dicts:
        attn_norm [Hv] attn_norm_bias [Hv]  wqkv [Hv, 3Hv] bqkv [3Hv]  wo [Hv, Hv] bo [Hv]
        mlp_norm [Hv] mlp_norm_bias [Hv]  w_fc1 [Hv, F] b_fc1 [F]  w_fc2 [F, Hv] b_fc2 [Hv]
    merger: norm [Hv] norm_bias [Hv]  w_fc1 [M, M] b_fc1 [M]  w_fc2 [M, O] b_fc2 [O]
    deepstack: list, one merger per deepstack layer, its norm over M (after the shuffle):
        norm [M] norm_bias [M]  w_fc1 [M, M] b_fc1 [M]  w_fc2 [M, O] b_fc2 [O]
Shape letters: Hv vision hidden, F its MLP width, M = Hv * merge^2, O the text hidden size.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int  # the text model's hidden size
    num_position_embeddings: int  # a square number: the learned position grid
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    deepstack_layers: tuple[int, ...] = ()  # block indices tapped (Qwen3-VL); () for Qwen3.5
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"  # the blocks' MLP; the merger always uses exact gelu
    # Placeholder and delimiter token ids of the text vocabulary.
    image_token_id: int = 0
    video_token_id: int = 0
    vision_start_token_id: int = 0
    vision_end_token_id: int = 0

    def __post_init__(self):
        object.__setattr__(self, "deepstack_layers", tuple(self.deepstack_layers))
        if self.hidden_size % self.num_heads:
            raise ValueError("vision hidden_size must be a multiple of num_heads")
        if self.head_dim % 4:
            raise ValueError("the vision head dim must be a multiple of 4 (2D rotary)")
        if math.isqrt(self.num_position_embeddings) ** 2 != self.num_position_embeddings:
            raise ValueError("num_position_embeddings must be a square number")
        if any(not 0 <= i < self.depth for i in self.deepstack_layers):
            raise ValueError("deepstack_layers must be block indices below depth")
        if self.hidden_act not in ("gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"unsupported vision hidden_act {self.hidden_act!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values of one pixel_values row: C * Tp * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merged_dim(self) -> int:
        return self.hidden_size * self.spatial_merge_size ** 2

    @property
    def merge_unit(self) -> int:
        """Patches folded into one text token."""
        return self.spatial_merge_size ** 2

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "VisionConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown vision config fields: {sorted(unknown)}")
        return cls(**data)

    def expected_shapes(self, prefix: str = "") -> dict[str, tuple[int, ...]]:
        """Flat name -> shape of every tensor of the tower, names prefixed with `prefix`."""
        Hv, F, M, O = self.hidden_size, self.intermediate_size, self.merged_dim, \
            self.out_hidden_size
        shapes = {"patch_embed": (self.patch_dim, Hv), "patch_bias": (Hv,),
                  "pos_embed": (self.num_position_embeddings, Hv)}
        for i in range(self.depth):
            p = f"blocks.{i}."
            shapes.update({
                p + "attn_norm": (Hv,), p + "attn_norm_bias": (Hv,), p + "wqkv": (Hv, 3 * Hv),
                p + "bqkv": (3 * Hv,), p + "wo": (Hv, Hv), p + "bo": (Hv,),
                p + "mlp_norm": (Hv,), p + "mlp_norm_bias": (Hv,), p + "w_fc1": (Hv, F),
                p + "b_fc1": (F,), p + "w_fc2": (F, Hv), p + "b_fc2": (Hv,)})
        mergers = [("merger.", Hv)] + [(f"deepstack.{j}.", M)
                                       for j in range(len(self.deepstack_layers))]
        for p, norm_dim in mergers:
            shapes.update({p + "norm": (norm_dim,), p + "norm_bias": (norm_dim,),
                           p + "w_fc1": (M, M), p + "b_fc1": (M,), p + "w_fc2": (M, O),
                           p + "b_fc2": (O,)})
        return {prefix + name: shape for name, shape in shapes.items()}
