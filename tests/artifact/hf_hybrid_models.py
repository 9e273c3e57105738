"""Tiny transformers models of the hybrid Qwen families, randomised (norm weights included:
the zero-centred norms start at 0) and saved with save_pretrained, plus a fake MTP head that
transformers itself never writes (it drops mtp.* on load)."""
from __future__ import annotations

import json
import pathlib

import numpy as np

from ninfer_jax.artifact.safetensors_io import write_safetensors
from test_hf_convert import write_tokenizer_files

HIDDEN, VOCAB = 32, 264  # the byte tokenizer of tiny_artifacts has 263 ids
TEXT = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=6, linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                             "partial_rotary_factor": 0.25}, eos_token_id=262)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
           shared_expert_intermediate_size=20)
FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
FULL_LAYER = 1  # the full-attention layer of TEXT's pattern
MEDIA_IDS = dict(image_token_id=256, video_token_id=257, vision_start_token_id=258,
                 vision_end_token_id=259)  # inside the tiny vocabulary


def build_model(family: str, seed: int = 0, multimodal: bool = False):
    import torch
    import transformers

    torch.manual_seed(seed)
    if family == "qwen3_5" and multimodal:
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                      out_hidden_size=HIDDEN, patch_size=4, num_position_embeddings=16)
        rope = dict(TEXT["rope_parameters"], mrope_section=[1, 1, 0], mrope_interleaved=True)
        model = transformers.Qwen3_5ForConditionalGeneration(transformers.Qwen3_5Config(
            text_config=dict(TEXT, intermediate_size=48, rope_parameters=rope),
            vision_config=vision, **MEDIA_IDS))
    elif family == "qwen3_5":
        model = transformers.Qwen3_5ForCausalLM(
            transformers.Qwen3_5TextConfig(intermediate_size=48, **TEXT))
    elif family == "qwen3_5_moe":
        model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**TEXT, **MOE))
    else:  # qwen3_next: layer 2 keeps a dense MLP (mlp_only_layers)
        model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
            intermediate_size=48, mlp_only_layers=[2], **TEXT, **MOE))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()


def state(model) -> dict[str, np.ndarray]:
    """The model's tensors as transformers holds them in memory (packed experts)."""
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def save_checkpoint(model, directory: pathlib.Path, *, mtp: bool = True) -> dict:
    """save_pretrained + tokenizer files (+ a fake mtp.* file); returns the mtp tensors."""
    model.save_pretrained(directory)
    write_tokenizer_files(directory)
    if not mtp:
        return {}
    tensors = fake_mtp_tensors(directory)
    write_safetensors(directory / "mtp.safetensors", tensors)
    return tensors


def fake_mtp_tensors(directory: pathlib.Path, seed: int = 7) -> dict[str, np.ndarray]:
    """An MTP head shaped as the checkpoint's own full-attention layer (its MLP included):
    mtp.fc [H, 2H], three norms [H], mtp.layers.0.* with fresh random values."""
    from ninfer_jax.artifact.safetensors_io import SafetensorsFile

    rng = np.random.default_rng(seed)
    shapes = {"mtp.fc.weight": (HIDDEN, 2 * HIDDEN), "mtp.norm.weight": (HIDDEN,),
              "mtp.pre_fc_norm_embedding.weight": (HIDDEN,),
              "mtp.pre_fc_norm_hidden.weight": (HIDDEN,)}
    layer = f"layers.{FULL_LAYER}."
    for file in map(SafetensorsFile, directory.glob("*.safetensors")):
        for name in file.names():
            if layer in name:
                shapes["mtp.layers.0." + name.split(layer, 1)[1]] = tuple(file.get(name).shape)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def write_packed_checkpoint(model, directory: pathlib.Path) -> None:
    """The in-memory (transformers v5) layout written as is: experts as gate_up_proj
    [E, 2I, H] and down_proj [E, H, I] instead of one tensor per expert."""
    directory.mkdir(parents=True)
    write_safetensors(directory / "model.safetensors", state(model))
    config = json.loads(model.config.to_json_string())
    config["architectures"] = [type(model).__name__]
    (directory / "config.json").write_text(json.dumps(config))
    write_tokenizer_files(directory)
