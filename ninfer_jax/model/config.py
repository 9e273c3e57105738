"""Model configuration: the architecture hyper-parameters stored in an artifact's metadata.

One dataclass for every family: the dense `llama` and `qwen3`, the hybrid `qwen3_5`
(dense MLP), `qwen3_5_moe` and `qwen3_next` (MoE), the GLM MoE `glm4_moe`, Gemma 4 `gemma4` and
Nemotron-H `nemotron_h`, whose extra fields default to "absent" so dense configs are
unchanged. `to_dict`/`from_dict` are the metadata.json representation.

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
Fused layout (model/fused_projections.py, made at load by the runner, never stored): a layer
may hold wqkv [H, (NH + 2*NK)*D] (wq | wk | wv columns) in place of wq wk wv, and
w_gate_up [H, 2F] (gate columns first) in place of w_gate w_up; the model takes either.

Hybrid families (model/hybrid.py). Every norm weight named *_norm except `gdn_norm` is
zero-centred (applied as 1 + w). layer_types[i] says what layer i holds:
    every layer:  attn_norm [H]  mlp_norm [H]
    "full_attention" (gated attention):
        wq [H, NH*2D]      per head: D query columns then D gate columns (HF q_proj layout)
        wk [H, NK*D]  wv [H, NK*D]  wo [NH*D, H]  q_norm [D]  k_norm [D]
    "linear_attention" (Gated DeltaNet; Hk/Hv key/value heads, dk/dv their dims, K conv taps,
    conv_dim = 2*Hk*dk + Hv*dv):
        in_qkv [H, conv_dim]  (Q | K | V columns)   in_z [H, Hv*dv]
        in_b [H, Hv]  in_a [H, Hv]  conv [K, conv_dim]  dt_bias [Hv]  A_log [Hv]
        gdn_norm [dv]  (plain RMSNorm weight, not zero-centred)   out [Hv*dv, H]
    MLP, dense layers (qwen3_5, and mlp_only_layers of MoE models): w_gate w_up w_down
    MLP, MoE layers (E experts of width I, shared expert of width Is):
        router [H, E]  experts_gate_up [E, H, 2I] (gate columns first)  experts_down [E, I, H]
        shared_gate [H, 1]  shared_w_gate [H, Is]  shared_w_up [H, Is]  shared_w_down [Is, H]
        (the shared_* leaves are absent when shared_expert_intermediate_size == 0)
    Fused layout on one device (model/fused_projections.py): wqkv (wq | wk | wv),
    in_qkvzba [H, conv_dim + Hv*dv + 2*Hv] (in_qkv | in_z | in_b | in_a), w_gate_up,
    shared_w_gate_up (shared_w_gate | shared_w_up), router_shared_gate [H, E + 1]
    (router | shared_gate) in place of their parts; the model takes either.
GLM MoE family `glm4_moe` (model/glm.py): the dense layer above with plain (not zero-centred)
norms, q/k norms only when qk_norm, RoPE over the first D * partial_rotary_factor dims, and
    bq [NH*D]  bk [NK*D]  bv [NK*D]        when attention_bias
    MLP, the first layers (mlp_only_layers): w_gate w_up w_down of width F
    MLP, the other layers: router [H, E]  router_bias [E] (f32, e_score_correction_bias)
        experts_gate_up [E, H, 2I]  experts_down [E, I, H]
        shared_w_gate [H, Is]  shared_w_up [H, Is]  shared_w_down [Is, H]   (no shared_gate)
Gemma 4 text family `gemma4` (model/gemma.py): layer_types[i] is "sliding_attention" or
"full_attention"; a full layer has head dim Dg = global_head_dim and NKg = global_num_kv_heads
kv heads (each defaults to the sliding layers' D, NK). Norm weights are plain (x * w).
    every layer:  attn_norm [H]  post_attn_norm [H]  mlp_norm [H]  post_mlp_norm [H]
                  layer_scalar [1]
        wq [H, NH*Dl]  q_norm [Dl]  wo [NH*Dl, H]     (Dl, NKl: the layer's head dim, kv heads)
        wk [H, NKl*Dl]  k_norm [Dl]  wv [H, NKl*Dl]   absent on KV-shared layers (the last
            num_kv_shared_layers, which read an earlier layer's cache); wv also absent on full
            layers when attention_k_eq_v (the values are the raw key projection)
        w_gate [H, F']  w_up [H, F']  w_down [F', H]  F' = 2F on KV-shared layers when
            use_double_wide_mlp, else F
        ple_gate [H, P]  ple_proj [P, H]  ple_norm [H]   with per-layer inputs (P > 0)
    global, with per-layer inputs (P = hidden_size_per_layer_input):
        ple_embed [Vp, L*P]  ple_model_proj [H, L*P]  ple_proj_norm [P]
Nemotron-H family `nemotron_h` (model/nemotron_h.py): layer_types[i] is "mamba", "attention"
or "mlp", each a single pre-normed residual block; norm weights are plain (x * w). Mamba-2
layers have Hm heads of dim P (I = Hm*P), G groups of B/C with state size N, K conv taps,
conv_dim = I + 2*G*N:
    every layer:  norm [H]
    "mamba":      in_proj [H, I + conv_dim + Hm]  (z | x B C | dt columns, HF's layout)
                  conv [K, conv_dim]  conv_bias [conv_dim]  dt_bias [Hm]  A_log [Hm]  D [Hm]
                  mamba_norm [I]  (gated RMSNorm in G groups)  out [I, H]
    "attention":  wq [H, NH*D]  wk [H, NK*D]  wv [H, NK*D]  wo [NH*D, H]   (no RoPE)
    "mlp":        w_up [H, F]  w_down [F, H]   (squared-ReLU, no gate)
    "moe":        router [H, E]  router_bias [E] (f32, e_score_correction_bias)
                  experts_up [E, H, I]  experts_down [E, I, H]   (squared-ReLU experts, no gate)
                  shared_w_up [H, Is]  shared_w_down [Is, H]     (absent when Is == 0)
                  routed by glm4_moe's grouped sigmoid router (model/moe_mlp.py)
The MTP head is a separate artifact component (params["mtp"] when loaded):
    fc [2H, H]  pre_fc_norm_embedding [H]  pre_fc_norm_hidden [H]  norm [H]
    layers: list of mtp_num_layers dicts shaped like a "full_attention" layer (with its MLP)
"""
from __future__ import annotations

import dataclasses
from typing import Any

ARCHITECTURES = ("llama", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_next", "glm4_moe",
                 "gemma4", "nemotron_h")
HYBRID_ARCHITECTURES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
LAYER_TYPES = ("full_attention", "linear_attention")
GEMMA_LAYER_TYPES = ("full_attention", "sliding_attention")
NEMOTRON_LAYER_TYPES = ("mamba", "attention", "mlp", "moe")


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
    # Multimodal models (Qwen3-VL): rotary frequencies per (temporal, row, column) axis,
    # interleaved (model/vision/mrope.py); () without. Text-only prompts use plain RoPE, which
    # MRoPE equals when the three positions agree.
    mrope_section: tuple[int, ...] = ()
    # Hybrid families only (defaults: absent).
    layer_types: tuple[str, ...] | None = None  # per layer, one of LAYER_TYPES
    partial_rotary_factor: float = 1.0  # RoPE rotates the first head_dim * factor dims
    attn_output_gate: bool = False  # gated attention: sigmoid(gate) * attention output
    linear_num_key_heads: int = 0  # Gated DeltaNet Hk
    linear_num_value_heads: int = 0  # Hv, a multiple of Hk
    linear_key_head_dim: int = 0  # dk
    linear_value_head_dim: int = 0  # dv
    linear_conv_kernel_dim: int = 0  # K, causal depthwise conv taps
    num_experts: int = 0  # 0: dense MLP in every layer
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k router weights
    mlp_only_layers: tuple[int, ...] = ()  # MoE models: layers with a dense MLP instead
    mtp_num_layers: int = 0  # layers of the MTP head stored in the artifact's mtp component
    # GLM MoE only: q/k/v biases and the grouped sigmoid router (DeepSeek-V3 style).
    attention_bias: bool = False
    num_expert_groups: int = 1  # the E experts split into this many groups ...
    num_topk_groups: int = 1  # ... of which the best few hold every chosen expert
    routed_scaling_factor: float = 1.0  # multiplies the routed experts' combine weights
    # Gemma 4 only (layer_types from GEMMA_LAYER_TYPES; rope_theta is the sliding layers').
    sliding_window: int = 0  # a sliding layer's query sees its last sliding_window keys
    global_head_dim: int = 0  # full layers' head dim (0: head_dim)
    global_num_kv_heads: int = 0  # full layers' kv heads (0: num_kv_heads)
    global_rope_theta: float = 0.0  # full layers' proportional RoPE base; partial_rotary_factor
    # is its rotated share: the first factor * Dg/2 frequency pairs, over exponents of Dg
    attention_k_eq_v: bool = False  # full layers reuse the raw key projection as values
    final_logit_softcapping: float = 0.0  # logits = c * tanh(logits / c) when c > 0
    hidden_size_per_layer_input: int = 0  # P: per-layer input embeddings (0: none)
    vocab_size_per_layer_input: int = 0  # Vp: rows of the per-layer embedding table
    num_kv_shared_layers: int = 0  # the last layers reuse an earlier layer's KV cache
    use_double_wide_mlp: bool = False  # KV-shared layers' MLP width is 2F
    # Nemotron-H only (layer_types from NEMOTRON_LAYER_TYPES; intermediate_size is the MLP's).
    mamba_num_heads: int = 0  # Hm
    mamba_head_dim: int = 0  # P
    mamba_state_size: int = 0  # N
    mamba_num_groups: int = 0  # G: B and C are shared by Hm / G heads; the gated norm's groups
    mamba_conv_kernel: int = 0  # K, causal depthwise conv taps over x B C
    mamba_dt_min: float = 0.0  # softplus(dt + dt_bias) clamped to [min, max] ...
    mamba_dt_max: float = 0.0  # ... max 0: no upper bound (HF's time_step_limit (0, inf))

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {self.architecture!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        # metadata.json gives lists; the config is hashed as a jit static argument
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        rotary_half = int(self.head_dim * self.partial_rotary_factor) // 2
        if self.mrope_section and (len(self.mrope_section) != 3
                                   or sum(self.mrope_section) != rotary_half):
            raise ValueError(f"mrope_section must be three counts summing to {rotary_half}")
        if self.is_hybrid:
            if self.layer_types is None or len(self.layer_types) != self.num_layers:
                raise ValueError("a hybrid config needs one layer_types entry per layer")
            if set(self.layer_types) - set(LAYER_TYPES):
                raise ValueError(f"layer_types must be among {LAYER_TYPES}")
            if self.linear_num_value_heads % max(self.linear_num_key_heads, 1):
                raise ValueError("linear_num_value_heads must be a multiple of "
                                 "linear_num_key_heads")
        elif self.is_gemma:
            self._check_gemma()
        elif self.is_nemotron:
            self._check_nemotron()
        elif self.layer_types is not None:
            raise ValueError(f"{self.architecture} has no layer_types")
        elif self.num_experts and not self.is_glm:
            raise ValueError(f"{self.architecture} has no experts")
        if self.num_experts % self.num_expert_groups:
            raise ValueError("num_experts must be a multiple of num_expert_groups")

    @property
    def is_hybrid(self) -> bool:
        return self.architecture in HYBRID_ARCHITECTURES

    @property
    def is_glm(self) -> bool:
        return self.architecture == "glm4_moe"

    @property
    def is_gemma(self) -> bool:
        return self.architecture == "gemma4"

    @property
    def is_nemotron(self) -> bool:
        return self.architecture == "nemotron_h"

    @property
    def has_recurrent_state(self) -> bool:
        """Whether sequences carry a recurrent state (Gated DeltaNet, Mamba-2): one value
        after each token, which verify rows must chain and KV pages cannot rebuild."""
        return self.is_hybrid or self.is_nemotron

    @property
    def has_sliding_rings(self) -> bool:
        """Gemma 4 with sliding layers: their KV lives in per-sequence rings in the state
        slots (model/gemma.py), not in the page pool."""
        return self.is_gemma and "sliding_attention" in self.layer_types

    @property
    def has_state(self) -> bool:
        """Whether sequences hold a state slot (engine/state_slots.py): a recurrent state,
        or Gemma's sliding-window KV rings."""
        return self.has_recurrent_state or self.has_sliding_rings

    def _check_nemotron(self) -> None:
        if self.layer_types is None or len(self.layer_types) != self.num_layers:
            raise ValueError("a nemotron_h config needs one layer_types entry per layer")
        if set(self.layer_types) - set(NEMOTRON_LAYER_TYPES):
            raise ValueError(f"nemotron_h layer_types must be among {NEMOTRON_LAYER_TYPES}")
        if ("moe" in self.layer_types) != (self.num_experts > 0):
            raise ValueError("nemotron_h has routed experts exactly when it has moe layers")
        if self.mamba_num_heads % max(self.mamba_num_groups, 1):
            raise ValueError("mamba_num_heads must be a multiple of mamba_num_groups")

    def _check_gemma(self) -> None:
        if self.layer_types is None or len(self.layer_types) != self.num_layers:
            raise ValueError("a gemma4 config needs one layer_types entry per layer")
        if set(self.layer_types) - set(GEMMA_LAYER_TYPES):
            raise ValueError(f"gemma4 layer_types must be among {GEMMA_LAYER_TYPES}")
        if "sliding_attention" in self.layer_types and self.sliding_window < 1:
            raise ValueError("gemma4 sliding layers need sliding_window >= 1")
        if self.num_experts:
            raise ValueError("gemma4 MoE blocks are not supported")
        if not 0 <= self.num_kv_shared_layers < self.num_layers:
            raise ValueError("num_kv_shared_layers must leave at least one layer its own KV")
        for i in range(self.num_layers):
            self.kv_source_layer(i)  # raises when a shared layer's type has no producer
        if any(self.num_heads % self.layer_kv_heads(i) for i in range(self.num_layers)):
            raise ValueError("num_heads must be a multiple of global_num_kv_heads")

    def is_sliding_layer(self, i: int) -> bool:
        return self.is_gemma and self.layer_types[i] == "sliding_attention"

    def layer_head_dim(self, i: int) -> int:
        """Head dim of attention layer i (Gemma's full layers may differ)."""
        if self.is_gemma and not self.is_sliding_layer(i):
            return self.global_head_dim or self.head_dim
        return self.head_dim

    def layer_kv_heads(self, i: int) -> int:
        if self.is_gemma and not self.is_sliding_layer(i):
            return self.global_num_kv_heads or self.num_kv_heads
        return self.num_kv_heads

    def kv_source_layer(self, i: int) -> int:
        """The layer whose KV cache layer i attends over: itself, or for Gemma's KV-shared
        layers the last unshared layer of the same type."""
        first_shared = self.num_layers - self.num_kv_shared_layers
        if not self.is_gemma or i < first_shared:
            return i
        same = [j for j in range(first_shared) if self.layer_types[j] == self.layer_types[i]]
        if not same:
            raise ValueError(f"KV-shared layer {i} ({self.layer_types[i]}) has no earlier "
                             "layer of its type to read")
        return same[-1]

    def cache_layers(self) -> list[int]:
        """Layers holding a paged KV cache of their own, in order (attention layers only)."""
        if self.is_hybrid:
            return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]
        if self.is_nemotron:
            return [i for i, t in enumerate(self.layer_types) if t == "attention"]
        return [i for i in range(self.num_layers) if self.kv_source_layer(i) == i]

    def ring_layers(self) -> list[int]:
        """Cache layers whose KV is a sliding-window ring in the state slots (Gemma's
        sliding layers that are not KV-shared); the other cache layers are paged."""
        return [i for i in self.cache_layers() if self.is_sliding_layer(i)]

    def ring_pages(self, page_size: int, step_tokens: int) -> int:
        """Pages of one sliding layer's ring per sequence (model/gemma.py): room for the
        window behind the earliest query of a step plus the step's `step_tokens` (at most)
        of one sequence, so no key a query may see is overwritten before it attends."""
        return -(-(self.sliding_window + step_tokens - 1) // page_size)

    def state_layers(self) -> list[int]:
        """Layers holding a recurrent state per sequence (Gated DeltaNet, Mamba-2)."""
        if self.is_hybrid:
            return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]
        if self.is_nemotron:
            return [i for i, t in enumerate(self.layer_types) if t == "mamba"]
        return []

    def is_moe_layer(self, i: int) -> bool:
        if self.is_nemotron:
            return self.layer_types[i] == "moe"
        return self.num_experts > 0 and i not in self.mlp_only_layers

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a Gated DeltaNet layer's conv (Q | K | V)."""
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads * self.linear_value_head_dim)

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of a Mamba-2 layer's conv (x | B | C)."""
        return (self.mamba_num_heads * self.mamba_head_dim
                + 2 * self.mamba_num_groups * self.mamba_state_size)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-sequence recurrent state of one Gated DeltaNet or Mamba-2 layer: the conv
        state (the last K - 1 conv inputs, compute dtype) and the delta-rule or SSM state
        (float32)."""
        if self.is_nemotron:
            return {"conv": (self.mamba_conv_kernel - 1, self.mamba_conv_dim),
                    "recurrent": (self.mamba_num_heads, self.mamba_head_dim,
                                  self.mamba_state_size)}
        return {"conv": (self.linear_conv_kernel_dim - 1, self.linear_conv_dim),
                "recurrent": (self.linear_num_value_heads, self.linear_key_head_dim,
                              self.linear_value_head_dim)}

    def check_tensor_parallel(self, size: int, expert_parallel: bool = False) -> None:
        """ValueError, one line, when a mesh of `size` devices cannot split this model's heads
        (or, with `expert_parallel`, its routed experts). Here rather than in
        model/tensor_parallel.py so the launcher can check it without importing JAX."""
        if self.is_nemotron and size > 1:
            raise ValueError("--tensor-parallel is not built for nemotron_h (its Mamba-2 "
                             "layers are not split per shard)")
        if expert_parallel:
            if size < 2:
                raise ValueError("--expert-parallel needs --tensor-parallel 2 or more (it "
                                 "splits the experts over the tensor-parallel devices)")
            if not self.num_experts:
                raise ValueError(f"--expert-parallel needs a MoE model; {self.architecture} "
                                 "has no routed experts")
            if self.num_experts % size:
                raise ValueError(f"--expert-parallel: --tensor-parallel {size} does not divide "
                                 f"the model's {self.num_experts} routed experts")
        counts = {"attention heads": self.num_heads, "kv heads": self.num_kv_heads}
        if self.is_hybrid:
            counts.update({"linear key heads": self.linear_num_key_heads,
                           "linear value heads": self.linear_num_value_heads})
        for what, count in counts.items():
            if count % size:
                raise ValueError(f"--tensor-parallel {size} does not divide the model's "
                                 f"{count} {what}")

    def __hash__(self):
        # Explicit because rope_scaling is a dict; the config is a static argument of jitted steps.
        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        return hash(tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v for v in values))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        data = dict(data)
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown model config fields: {sorted(unknown)}")
        return cls(**data)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat name -> shape for every tensor of the text model (plain-array form)."""
        H, V = self.hidden_size, self.vocab_size
        NH, NK, D = self.num_heads, self.num_kv_heads, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"embed": (V, H), "final_norm": (H,)}
        if not self.tie_word_embeddings:
            shapes["lm_head"] = (H, V)
        if self.is_hybrid:
            for i in range(self.num_layers):
                shapes.update(self._hybrid_layer_shapes(i, f"layers.{i}."))
            return shapes
        if self.is_gemma:
            return self._gemma_shapes(shapes)
        if self.is_nemotron:
            for i in range(self.num_layers):
                shapes.update(self._nemotron_layer_shapes(i, f"layers.{i}."))
            return shapes
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes.update({
                p + "attn_norm": (H,), p + "wq": (H, NH * D), p + "wk": (H, NK * D),
                p + "wv": (H, NK * D), p + "wo": (NH * D, H), p + "mlp_norm": (H,)})
            if self.qk_norm:
                shapes[p + "q_norm"] = (D,)
                shapes[p + "k_norm"] = (D,)
            if self.attention_bias:
                shapes.update({p + "bq": (NH * D,), p + "bk": (NK * D,), p + "bv": (NK * D,)})
            shapes.update(self._mlp_shapes(i, p))
        return shapes

    def _gemma_shapes(self, shapes: dict) -> dict[str, tuple[int, ...]]:
        H, NH, P, L = self.hidden_size, self.num_heads, self.hidden_size_per_layer_input, \
            self.num_layers
        if P:
            shapes.update({"ple_embed": (self.vocab_size_per_layer_input, L * P),
                           "ple_model_proj": (H, L * P), "ple_proj_norm": (P,)})
        for i in range(L):
            p, D, NK = f"layers.{i}.", self.layer_head_dim(i), self.layer_kv_heads(i)
            shared = self.kv_source_layer(i) != i
            F = self.intermediate_size * (2 if shared and self.use_double_wide_mlp else 1)
            shapes.update({
                p + "attn_norm": (H,), p + "post_attn_norm": (H,), p + "mlp_norm": (H,),
                p + "post_mlp_norm": (H,), p + "layer_scalar": (1,),
                p + "wq": (H, NH * D), p + "q_norm": (D,), p + "wo": (NH * D, H),
                p + "w_gate": (H, F), p + "w_up": (H, F), p + "w_down": (F, H)})
            if not shared:
                shapes.update({p + "wk": (H, NK * D), p + "k_norm": (D,)})
                if not (self.attention_k_eq_v and not self.is_sliding_layer(i)):
                    shapes[p + "wv"] = (H, NK * D)
            if P:
                shapes.update({p + "ple_gate": (H, P), p + "ple_proj": (P, H),
                               p + "ple_norm": (H,)})
        return shapes

    def _nemotron_layer_shapes(self, i: int, p: str) -> dict[str, tuple[int, ...]]:
        H, NH, NK, D, F = (self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                           self.intermediate_size)
        kind = self.layer_types[i]
        if kind == "attention":
            layer = {"wq": (H, NH * D), "wk": (H, NK * D), "wv": (H, NK * D),
                     "wo": (NH * D, H)}
        elif kind == "mlp":
            layer = {"w_up": (H, F), "w_down": (F, H)}
        elif kind == "moe":
            E, I, Is = (self.num_experts, self.moe_intermediate_size,
                        self.shared_expert_intermediate_size)
            layer = {"router": (H, E), "router_bias": (E,), "experts_up": (E, H, I),
                     "experts_down": (E, I, H)}
            if Is:
                layer.update({"shared_w_up": (H, Is), "shared_w_down": (Is, H)})
        else:
            Hm, inner, conv = self.mamba_num_heads, self.mamba_num_heads * self.mamba_head_dim, \
                self.mamba_conv_dim
            layer = {"in_proj": (H, inner + conv + Hm), "conv": (self.mamba_conv_kernel, conv),
                     "conv_bias": (conv,), "dt_bias": (Hm,), "A_log": (Hm,), "D": (Hm,),
                     "mamba_norm": (inner,), "out": (inner, H)}
        return {p + "norm": (H,), **{p + name: shape for name, shape in layer.items()}}

    def _hybrid_layer_shapes(self, i: int, p: str) -> dict[str, tuple[int, ...]]:
        H, NH, NK, D = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        shapes = {p + "attn_norm": (H,), p + "mlp_norm": (H,)}
        if self.layer_types[i] == "full_attention":
            q_cols = NH * D * (2 if self.attn_output_gate else 1)
            shapes.update({p + "wq": (H, q_cols), p + "wk": (H, NK * D), p + "wv": (H, NK * D),
                           p + "wo": (NH * D, H), p + "q_norm": (D,), p + "k_norm": (D,)})
        else:
            Hv, dv = self.linear_num_value_heads, self.linear_value_head_dim
            shapes.update({
                p + "in_qkv": (H, self.linear_conv_dim), p + "in_z": (H, Hv * dv),
                p + "in_b": (H, Hv), p + "in_a": (H, Hv),
                p + "conv": (self.linear_conv_kernel_dim, self.linear_conv_dim),
                p + "dt_bias": (Hv,), p + "A_log": (Hv,), p + "gdn_norm": (dv,),
                p + "out": (Hv * dv, H)})
        shapes.update(self._mlp_shapes(i, p))
        return shapes

    def _mlp_shapes(self, i: int, p: str) -> dict[str, tuple[int, ...]]:
        H = self.hidden_size
        if not self.is_moe_layer(i):
            F = self.intermediate_size
            return {p + "w_gate": (H, F), p + "w_up": (H, F), p + "w_down": (F, H)}
        E, I, Is = self.num_experts, self.moe_intermediate_size, \
            self.shared_expert_intermediate_size
        shapes = {p + "router": (H, E), p + "experts_gate_up": (E, H, 2 * I),
                  p + "experts_down": (E, I, H)}
        if self.is_glm:
            shapes[p + "router_bias"] = (E,)
        if Is:
            shapes.update({p + "shared_w_gate": (H, Is), p + "shared_w_up": (H, Is),
                           p + "shared_w_down": (Is, H)})
            if not self.is_glm:  # GLM adds its shared experts ungated
                shapes[p + "shared_gate"] = (H, 1)
        return shapes
