"""The `ninfer init-random` presets: architecture and sizes, vocabulary, special tokens, chat
template and format of each, and `tiny_config`, which shrinks any of them for CI.

Dense: `qwen3-tiny`, `qwen3.5-dense-tiny` (the dense qwen3 body with the Qwen3.5 tokenizer,
template and XML tool calls: what serving tests use until the hybrid forward is served),
`qwen3-8b`, `llama3-8b`. Hybrid: `qwen3.5-tiny` and `qwen3.6-tiny-moe` (tiny_config of the
two full-size shapes, with the unpadded tokenizer vocabulary and tied embeddings to stay a few
tens of MB), `qwen3.5-27b` (dense MLP) and `qwen3.6-35b-a3b` (256 experts), all with an MTP
head. Full-size hybrid shapes, from the published model cards and configs (27B: hidden 5120, 64 layers, 24 / 4 heads of 256, GDN 16 / 48 heads of 128, FFN 17408;
35B-A3B: hidden 2048, 40 layers, 16 / 2 heads of 256, GDN 16 / 32 heads of 128, 256 experts
top-8 of width 512 plus a shared expert of 512; both vocab 248320 padded, 262144 positions).
GLM MoE: `glm4.5-air` (GLM-4.5-Air's published config: hidden 4096, 46 layers, 96 / 8 heads of
128 with q/k/v biases and RoPE on half of each head, a dense first layer of 10944, then 128
experts top-8 of width 1408 plus one shared expert, sigmoid router; vocab 151552 padded,
131072 positions) and `glm4.5-tiny` (its tiny_config, with the unpadded GLM-layout stand-in
vocabulary and tied embeddings). Their turns are opened by role tokens and never closed: a
reply ends at the next role token the model writes (<|user|>, <|observation|>).
Gemma 4: `gemma4-31b` (the dense Gemma 4 31B shape, checked against its config.json's
text_config as public test fixtures quote it (code search; rope thetas 1e4 sliding, 1e6 full,
262144 positions): hidden 5376, 60 layers, five sliding layers (window 1024, 32 / 16 heads
of 256) to every full layer (4 kv heads of 512, keys reused as values, proportional RoPE on a
quarter), FFN 21504, soft cap 30, vocab 262144) and `gemma4-tiny` (its tiny_config with
per-layer inputs added, on the Gemma-layout stand-in vocabulary). Their replies end at <turn|>
or, after a tool call, at <|tool_response>; thoughts use the <|channel>thought ... <channel|>
channel.
Nemotron-H: `nemotron-h-8b` (Nemotron-H-8B-Base-8K's shape, checked against its config.json as
quoted by two independent public test fixtures (code search): hidden 4096, 52 layers
in the pattern M-M-M-M*-M-M-M-M-M*-... (24 Mamba-2, 4 attention, 24 relu2 MLP layers of 21504),
Mamba-2 128 heads of 64 with 8 groups of state 128, attention 32 / 8 heads of 128, vocab 131072,
8192 positions, untied) and `nemotron-h-tiny` (its tiny_config: one Mamba-2, one attention and
one MLP layer, tied embeddings); `nemotron-3-nano-30b-a3b` (Nemotron 3 Nano 30B-A3B: hidden
2688, 52 layers MEMEM*EMEMEM*... (23 Mamba-2, 6 attention 32 / 2 heads of 128, 23 MoE layers
of 128 relu2 experts of 1856, top 6 by the sigmoid router with correction bias, scale 2.5, a
shared expert of 3712), Mamba-2 64 heads of 64, 262144 positions) and `nemotron-3-nano-tiny`
(its tiny_config: a Mamba-2, an attention and a MoE layer). Turns open with <SPECIAL_10>System
/ <SPECIAL_11>User /
<SPECIAL_11>Assistant, a reply ends at <SPECIAL_12>; tool calls are <TOOLCALL>[JSON]</TOOLCALL>
and thoughts <think> ... </think>.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.vision.config import VisionConfig

QWEN3_VOCAB = 151669  # 151,643 ranks + 26 control tokens
QWEN3_5_VOCAB = 248077  # 248,044 ranks + 33 control tokens
QWEN3_5_PADDED_VOCAB = 248320  # the published checkpoints' embedding rows
LLAMA3_VOCAB = 128256  # 128,000 ranks + 256 control tokens
GLM4_VOCAB = 151365  # 151,329 ranks + 36 control tokens
GLM4_PADDED_VOCAB = 151552  # the published checkpoints' embedding rows
GLM_EOS = ("<|user|>", "<|observation|>", "<|endoftext|>")  # the role tokens end a reply
QWEN_EOS = ("<|im_end|>", "<|endoftext|>")  # end of turn first: it also ends a chat reply
# What `tiny` changes: dimensions only (the query heads keep the preset's grouping).
TINY_DIMS = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4,
             "head_dim": 16}
# Hybrid presets at tiny size: one layer of each kind, 2 GDN key heads (value heads keep the
# preset's ratio) of 16, and 8 experts of 32 with top-2 (a shared expert of 32 if it has one).
TINY_LAYER_TYPES = ("linear_attention", "full_attention")
TINY_LINEAR = {"linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16}
TINY_MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
# Gemma at tiny size: a sliding layer (window 16, so short chats already pass it) then a full
# layer with its own head dim of 32 (kv heads keep the preset's grouping), no KV sharing.
TINY_GEMMA = {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 16,
              "num_kv_shared_layers": 0}
GEMMA4_VOCAB = 151658  # the stand-in: 151,643 ranks + 15 control tokens
GEMMA_EOS = ("<turn|>", "<|tool_response>", "<eos>")
THINK_MARKERS = ("<think>", "</think>")
NEMOTRON_VOCAB = 131072
NEMOTRON_EOS = ("<SPECIAL_12>", "<SPECIAL_2>")
# Nemotron-H at tiny size: one block of each kind, Mamba-2 with 4 heads of 16 in 2 groups.
TINY_NEMOTRON = {"layer_types": ("mamba", "attention", "mlp"), "num_layers": 3,
                 "mamba_num_heads": 4, "mamba_head_dim": 16, "mamba_state_size": 16,
                 "mamba_num_groups": 2}
GEMMA_MARKERS = ("<|channel>thought", "<channel|>")


@dataclasses.dataclass(frozen=True)
class Preset:
    config: ModelConfig
    vocabulary: str  # qwen_vocab kind
    template: str  # templates/<name>.jinja
    tool_call_format: str
    dtype: str  # default storage dtype
    notes: str
    eos: tuple[str, ...] = QWEN_EOS  # spellings of the end tokens
    pad: str = "<|endoftext|>"
    bos: str | None = None  # written by the template; also prepended to raw prompts
    thinks: bool = True  # reasoning markers, thinking unless the request says not
    markers: tuple[str, str] = THINK_MARKERS  # (open, close) of the reasoning block
    vision: VisionConfig | None = None  # the artifact's vision component, when it has one


TINY_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
               "num_position_embeddings": 16}


def tiny_vision(vision: VisionConfig, text: ModelConfig) -> VisionConfig:
    """The tower at TINY_VISION dims feeding `text`; patch, merge sizes and token ids kept, a
    deepstack tap (if the tower has any) after each of its blocks."""
    taps = tuple(range(TINY_VISION["depth"])) if vision.deepstack_layers else ()
    return dataclasses.replace(vision, **TINY_VISION, out_hidden_size=text.hidden_size,
                               deepstack_layers=taps)


def _mrope_for(config: ModelConfig) -> tuple[int, ...]:
    """Interleaved MRoPE counts for a tiny head: the rotary frequencies split about evenly,
    row and column first."""
    half = int(config.head_dim * config.partial_rotary_factor) // 2
    spatial = -(-half // 3)
    return (half - 2 * spatial, spatial, spatial)


def tiny_config(config: ModelConfig) -> ModelConfig:
    """The same model at TINY_DIMS: vocabulary, norms, RoPE, tying, qk-norm, the query heads
    per KV head, the GDN value heads per key head, MTP layers and attention gate unchanged."""
    group = config.num_heads // config.num_kv_heads
    fields = dict(TINY_DIMS, num_kv_heads=max(1, TINY_DIMS["num_heads"] // group))
    if config.is_hybrid:
        ratio = config.linear_num_value_heads // config.linear_num_key_heads
        fields.update(TINY_LINEAR, layer_types=TINY_LAYER_TYPES, mlp_only_layers=(),
                      linear_num_value_heads=TINY_LINEAR["linear_num_key_heads"] * ratio)
    if config.num_experts:
        shared = TINY_MOE["moe_intermediate_size"] if config.shared_expert_intermediate_size else 0
        fields.update(TINY_MOE, shared_expert_intermediate_size=shared)
    if config.is_gemma:
        full = config.cache_layers()[-1] if config.global_num_kv_heads else 0
        full_group = config.num_heads // config.layer_kv_heads(full)
        fields.update(TINY_GEMMA, global_head_dim=32 if config.global_head_dim else 0,
                      global_num_kv_heads=max(1, TINY_DIMS["num_heads"] // full_group)
                      if config.global_num_kv_heads else 0,
                      hidden_size_per_layer_input=8 if config.hidden_size_per_layer_input
                      else 0)
    if config.is_nemotron:
        fields.update(TINY_NEMOTRON)
        if config.num_experts:  # the MLP block becomes the MoE one
            fields["layer_types"] = ("mamba", "attention", "moe")
    tiny = dataclasses.replace(config, **fields, mrope_section=())
    return dataclasses.replace(tiny, mrope_section=_mrope_for(tiny) if config.mrope_section
                               else ())


def _dense(arch, vocab, hidden, ffn, layers, heads, kv_heads, head_dim, theta, eps, tied,
           max_positions, mrope_section=()):
    return ModelConfig(architecture=arch, vocab_size=vocab, hidden_size=hidden,
                       intermediate_size=ffn, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=head_dim, rms_norm_eps=eps,
                       rope_theta=theta, tie_word_embeddings=tied, qk_norm=arch == "qwen3",
                       max_position_embeddings=max_positions, mrope_section=mrope_section)


def _qwen_vision(out_hidden: int, *, qwen3_5: bool) -> VisionConfig:
    """The published Qwen3-VL / Qwen3.5 tower (27 blocks of 1152, 16 heads, patch 16, a 48 x 48
    position grid); Qwen3-VL taps blocks 8, 16 and 24 for deepstack."""
    ids = (248056, 248057, 248053, 248054) if qwen3_5 else (151655, 151656, 151652, 151653)
    return VisionConfig(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                        out_hidden_size=out_hidden, num_position_embeddings=2304,
                        deepstack_layers=() if qwen3_5 else (8, 16, 24),
                        image_token_id=ids[0], video_token_id=ids[1],
                        vision_start_token_id=ids[2], vision_end_token_id=ids[3])


def _qwen3_5(arch, hidden, ffn, layers, heads, kv_heads, value_heads, **moe) -> ModelConfig:
    """A published Qwen3.5 / 3.6 hybrid shape: every fourth layer gated full attention (head
    dim 256, RoPE on its first quarter), the rest Gated DeltaNet (16 key heads of 128)."""
    return ModelConfig(
        architecture=arch, vocab_size=QWEN3_5_PADDED_VOCAB, hidden_size=hidden,
        intermediate_size=ffn, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=256, rms_norm_eps=1e-6, rope_theta=1e7, tie_word_embeddings=False,
        qk_norm=True, max_position_embeddings=262144,
        layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                          for i in range(layers)),
        partial_rotary_factor=0.25, attn_output_gate=True, linear_num_key_heads=16,
        linear_num_value_heads=value_heads, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, mtp_num_layers=1, mrope_section=(11, 11, 10), **moe)


GLM4_5_AIR = ModelConfig(
    architecture="glm4_moe", vocab_size=GLM4_PADDED_VOCAB, hidden_size=4096,
    intermediate_size=10944, num_layers=46, num_heads=96, num_kv_heads=8, head_dim=128,
    rms_norm_eps=1e-5, rope_theta=1e6, tie_word_embeddings=False, qk_norm=False,
    max_position_embeddings=131072, partial_rotary_factor=0.5, attention_bias=True,
    num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1408,
    shared_expert_intermediate_size=1408, norm_topk_prob=True, mlp_only_layers=(0,),
    routed_scaling_factor=1.0)
GEMMA4_31B = ModelConfig(
    architecture="gemma4", vocab_size=262144, hidden_size=5376, intermediate_size=21504,
    num_layers=60, num_heads=32, num_kv_heads=16, head_dim=256, rms_norm_eps=1e-6,
    rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=262144,
    layer_types=tuple("full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                      for i in range(60)),
    sliding_window=1024, global_head_dim=512, global_num_kv_heads=4, global_rope_theta=1e6,
    partial_rotary_factor=0.25, attention_k_eq_v=True, final_logit_softcapping=30.0)
NEMOTRON_H_8B = ModelConfig(
    architecture="nemotron_h", vocab_size=NEMOTRON_VOCAB, hidden_size=4096,
    intermediate_size=21504, num_layers=52, num_heads=32, num_kv_heads=8, head_dim=128,
    rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=8192,
    layer_types=tuple({"M": "mamba", "*": "attention", "-": "mlp"}[c] for c in
                      "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
    mamba_num_heads=128, mamba_head_dim=64, mamba_state_size=128, mamba_num_groups=8,
    mamba_conv_kernel=4)
# Nemotron 3 Nano 30B-A3B (NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's config.json as quoted in
# public code, e.g. several config fixtures found via the code search: hidden 2688, 52 layers
# "MEMEM*EMEMEM*...", 128 relu2 experts of 1856, top 6, routed scale 2.5, one group, a
# shared expert of 3712, GQA 32/2 of 128, Mamba-2 64 heads of 64, state 128, 8 groups).
NEMOTRON_3_NANO = ModelConfig(
    architecture="nemotron_h", vocab_size=NEMOTRON_VOCAB, hidden_size=2688,
    intermediate_size=1856, num_layers=52, num_heads=32, num_kv_heads=2, head_dim=128,
    rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=262144,
    layer_types=tuple({"M": "mamba", "*": "attention", "E": "moe"}[c] for c in
                      "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"),
    mamba_num_heads=64, mamba_head_dim=64, mamba_state_size=128, mamba_num_groups=8,
    mamba_conv_kernel=4, num_experts=128, num_experts_per_tok=6, moe_intermediate_size=1856,
    shared_expert_intermediate_size=3712, norm_topk_prob=True, num_expert_groups=1,
    num_topk_groups=1, routed_scaling_factor=2.5)
QWEN3_5_27B = _qwen3_5("qwen3_5", 5120, 17408, 64, 24, 4, 48)
QWEN3_6_35B_A3B = _qwen3_5("qwen3_5_moe", 2048, 0, 40, 16, 2, 32, num_experts=256,
                           num_experts_per_tok=8, moe_intermediate_size=512,
                           shared_expert_intermediate_size=512)


QWEN3_VL_TINY = _dense("qwen3", QWEN3_VOCAB, 64, 128, 2, 4, 2, 16, 5e6, 1e-6, True, 40960,
                       mrope_section=(2, 3, 3))
QWEN3_5_DENSE_TINY = _dense("qwen3", QWEN3_5_VOCAB, 64, 128, 2, 4, 2, 16, 1e7, 1e-6, True, 40960,
                            mrope_section=(2, 3, 3))


def _tiny_hybrid(config: ModelConfig) -> ModelConfig:
    return dataclasses.replace(tiny_config(config), vocab_size=QWEN3_5_VOCAB,
                               tie_word_embeddings=True, max_position_embeddings=40960)


_GLM_NOTES = ("random weights; a GLM-4.5-layout stand-in vocabulary (Qwen's first 151,329 BPE "
              "ranks plus GLM-4.5's 36 control tokens at their ids, since Zhipu's vocabulary is "
              "not available offline) and a GLM-4.5-style template written for ninfer-jax, with "
              "GLM's XML tool calls")
_GEMMA_NOTES = ("random weights; a Gemma-4-layout stand-in vocabulary (Qwen's 151,643 BPE ranks "
                "plus Gemma 4's chat control tokens after them, since Google's vocabulary is "
                "not available offline) and a Gemma-4-style template written for ninfer-jax, "
                "with Gemma's <|tool_call>call:NAME{...} tool calls")
_NEMOTRON_NOTES = ("random weights; a Nemotron-H-layout stand-in vocabulary (Qwen's first 131,058 "
                   "BPE ranks plus Nemotron-style control tokens after them, since NVIDIA's "
                   "vocabulary is not available offline) and a Nemotron-style template written "
                   "for ninfer-jax, with <TOOLCALL>[...]</TOOLCALL> JSON tool calls")
_QWEN3_5_NOTES = "random weights; Qwen3.5 tokenizer and template written for ninfer-jax"
PRESETS = {
    "qwen3-tiny": Preset(
        _dense("qwen3", QWEN3_VOCAB, 64, 128, 2, 4, 2, 16, 1e6, 1e-6, True, 40960),
        "qwen3", "qwen3", "hermes", "f32",
        "random weights; Qwen3 tokenizer and a Qwen3-style template written for ninfer-jax"),
    "qwen3-vl-tiny": Preset(
        QWEN3_VL_TINY, "qwen3", "qwen3", "hermes", "f32",
        "random weights; Qwen3 tokenizer and template, a Qwen3-VL-shaped tiny model: MRoPE "
        "text body and a vision tower with deepstack taps", vision=tiny_vision(
            _qwen_vision(64, qwen3_5=False), QWEN3_VL_TINY)),
    "qwen3.5-dense-tiny": Preset(
        QWEN3_5_DENSE_TINY, "qwen3_5", "qwen3_5", "qwen_xml", "f32",
        "random weights; Qwen3.5 tokenizer and template with a dense qwen3 body standing in "
        "for the hybrid Qwen3.5 architecture (see qwen3.5-tiny), and a tiny Qwen3.5 vision "
        "tower", vision=tiny_vision(_qwen_vision(64, qwen3_5=True), QWEN3_5_DENSE_TINY)),
    "qwen3.5-tiny": Preset(
        _tiny_hybrid(QWEN3_5_27B), "qwen3_5", "qwen3_5", "qwen_xml", "f32",
        _QWEN3_5_NOTES + "; hybrid Qwen3.5 (Gated DeltaNet + gated attention, dense MLP, "
                         "MTP head, vision tower) at tiny size",
        vision=tiny_vision(_qwen_vision(5120, qwen3_5=True), _tiny_hybrid(QWEN3_5_27B))),
    "qwen3.6-tiny-moe": Preset(
        _tiny_hybrid(QWEN3_6_35B_A3B), "qwen3_5", "qwen3_5", "qwen_xml", "f32",
        _QWEN3_5_NOTES + "; hybrid Qwen3.6-MoE (Gated DeltaNet + gated attention, routed "
                         "and shared experts, MTP head, vision tower) at tiny size",
        vision=tiny_vision(_qwen_vision(2048, qwen3_5=True), _tiny_hybrid(QWEN3_6_35B_A3B))),
    "qwen3-8b": Preset(
        _dense("qwen3", 151936, 4096, 12288, 36, 32, 8, 128, 1e6, 1e-6, False, 40960),
        "qwen3", "qwen3", "hermes", "bf16", "random weights in Qwen3-8B shapes, for benchmarks"),
    "qwen3.5-27b": Preset(
        QWEN3_5_27B, "qwen3_5", "qwen3_5", "qwen_xml", "bf16",
        "random weights in Qwen3.5-27B shapes (with its MTP head and vision tower), for "
        "benchmarks", vision=_qwen_vision(5120, qwen3_5=True)),
    "qwen3.6-35b-a3b": Preset(
        QWEN3_6_35B_A3B, "qwen3_5", "qwen3_5", "qwen_xml", "bf16",
        "random weights in Qwen3.6-35B-A3B shapes (with its MTP head), for benchmarks"),
    "glm4.5-tiny": Preset(
        dataclasses.replace(tiny_config(GLM4_5_AIR), vocab_size=GLM4_VOCAB,
                            tie_word_embeddings=True),
        "glm4", "glm4_5", "glm_xml", "f32",
        _GLM_NOTES + "; GLM-4.5-Air's MoE (dense first layer, routed and shared experts) at "
                     "tiny size", eos=GLM_EOS),
    "glm4.5-air": Preset(
        GLM4_5_AIR, "glm4", "glm4_5", "glm_xml", "bf16",
        _GLM_NOTES + "; GLM-4.5-Air shapes, for benchmarks", eos=GLM_EOS),
    "gemma4-tiny": Preset(
        dataclasses.replace(tiny_config(GEMMA4_31B), vocab_size=GEMMA4_VOCAB,
                            hidden_size_per_layer_input=8,
                            vocab_size_per_layer_input=GEMMA4_VOCAB),
        "gemma4", "gemma4", "gemma4", "f32", _GEMMA_NOTES + "; Gemma 4 at tiny size (a "
        "sliding and a full layer of their own head dims, per-layer inputs)",
        eos=GEMMA_EOS, pad="<pad>", bos="<bos>", markers=GEMMA_MARKERS),
    "gemma4-31b": Preset(
        GEMMA4_31B, "gemma4", "gemma4", "gemma4", "bf16",
        _GEMMA_NOTES + "; Gemma 4 31B shapes, for benchmarks", eos=GEMMA_EOS, pad="<pad>",
        bos="<bos>", markers=GEMMA_MARKERS),
    "nemotron-h-tiny": Preset(
        dataclasses.replace(tiny_config(NEMOTRON_H_8B), tie_word_embeddings=True),
        "nemotron", "nemotron_h", "nemotron", "f32",
        _NEMOTRON_NOTES + "; Nemotron-H at tiny size (a Mamba-2, an attention and a relu2 MLP "
                          "layer)", eos=NEMOTRON_EOS, pad="<SPECIAL_0>"),
    "nemotron-h-8b": Preset(
        NEMOTRON_H_8B, "nemotron", "nemotron_h", "nemotron", "bf16",
        _NEMOTRON_NOTES + "; Nemotron-H-8B-Base-8K shapes (as its published config.json, "
                          "quoted in public code), for benchmarks", eos=NEMOTRON_EOS,
        pad="<SPECIAL_0>"),
    "nemotron-3-nano-tiny": Preset(
        dataclasses.replace(tiny_config(NEMOTRON_3_NANO), tie_word_embeddings=True),
        "nemotron", "nemotron_h", "nemotron", "f32",
        _NEMOTRON_NOTES + "; Nemotron 3 Nano at tiny size (a Mamba-2, an attention and a MoE "
                          "layer: 8 relu2 experts, top 2, a shared expert)",
        eos=NEMOTRON_EOS, pad="<SPECIAL_0>"),
    "nemotron-3-nano-30b-a3b": Preset(
        NEMOTRON_3_NANO, "nemotron", "nemotron_h", "nemotron", "bf16",
        _NEMOTRON_NOTES + "; Nemotron 3 Nano 30B-A3B shapes, for benchmarks",
        eos=NEMOTRON_EOS, pad="<SPECIAL_0>"),
    "llama3-8b": Preset(
        _dense("llama", LLAMA3_VOCAB, 4096, 14336, 32, 32, 8, 128, 500000.0, 1e-5, False, 8192),
        "llama3", "llama3", "hermes", "bf16",
        "random weights in Llama-3-8B shapes, for benchmarks; a Llama-3-layout stand-in "
        "vocabulary (Qwen's first 128,000 BPE ranks plus Llama-3's 256 control tokens at "
        "their ids, since Meta's vocabulary is not available offline) and a Llama-3-style "
        "header template written for ninfer-jax, with hermes-style tool calls as text",
        eos=("<|eot_id|>", "<|end_of_text|>"), pad="<|end_of_text|>", bos="<|begin_of_text|>",
        thinks=False),
}
