"""A tiny random transformers Qwen3-VL model as the reference of the vision tower and of the
multimodal forward, with loaders of its save_pretrained safetensors into our params.

Weights are drawn wider than HF's init and norms (LayerNorm weights and biases, RMSNorm
weights) away from their defaults, so that every term matters. The prompt builder lays out
media spans as the Qwen3-VL processor does: <vision_start> placeholders <vision_end> per image,
and per video frame (temporal patch) a timestamp text token before its own delimited span.
"""
from __future__ import annotations

import pathlib

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from ninfer_jax.artifact import hf_vision
from ninfer_jax.artifact.components import add_vision_tensor
from ninfer_jax.artifact.convert_common import add_to_params

IMAGE, VIDEO, START, END = 120, 121, 122, 123
MROPE_SECTION = (4, 2, 2)


def tiny_qwen3_vl(seed: int = 0):
    """A random f32 eager-attention Qwen3-VL: 3 text layers, a 3-block tower with deepstack
    taps after blocks 0 and 2, patch 4, merge 2, a 4 x 4 learned position grid."""
    torch.manual_seed(seed)
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=128, hidden_size=48, intermediate_size=80,
                         num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                         head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=512,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                          "mrope_section": list(MROPE_SECTION),
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2,
                           patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
                           out_hidden_size=48, num_position_embeddings=16,
                           deepstack_visual_indexes=[0, 2]),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    model = Qwen3VLForConditionalGeneration(config)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                tensor.copy_(1.0 + 0.3 * torch.randn_like(tensor))
            elif tensor.ndim == 1:
                tensor.copy_(0.1 * torch.randn_like(tensor))
            else:
                fan_in = tensor[0].numel() if tensor.ndim > 2 else tensor.shape[-1]
                scale = 1.0 if "embed_tokens" in name or "pos_embed" in name else 1.5
                tensor.copy_(scale * torch.randn_like(tensor) / (fan_in ** 0.5
                                                                  if scale != 1.0 else 1.0))
    return model.float().eval()


def load_tensors(checkpoint_dir: pathlib.Path) -> dict[str, np.ndarray]:
    tensors = {}
    for path in sorted(pathlib.Path(checkpoint_dir).glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def load_vision_params(tensors: dict[str, np.ndarray]) -> dict:
    """Our vision tree from the checkpoint's model.visual.* tensors (the converter's mapping)."""
    params: dict = {}
    for hf_name, array in sorted(tensors.items()):
        if hf_vision.is_vision_tensor(hf_name):
            name = hf_vision.vision_name(pathlib.Path("<test>"), hf_name)
            add_vision_tensor(params, name, hf_vision.vision_array(name, array))
    return params


def vision_reference(model, pixel_values: np.ndarray, grids):
    """HF merged embeddings [n, O] and deepstack features [S, n, O] of one tower pass."""
    with torch.no_grad():
        out = model.model.visual(torch.from_numpy(pixel_values),
                                 grid_thw=torch.tensor(grids, dtype=torch.long))
    return (out.pooler_output.numpy(),
            np.stack([feature.numpy() for feature in out.deepstack_features]))


def load_text_params(tensors: dict[str, np.ndarray], config) -> dict:
    """Our text params from the wrapper's model.language_model.* and lm_head tensors, named
    by the converter's mapping (hf_convert)."""
    from ninfer_jax.artifact import hf_convert

    params: dict = {}
    for hf_name, array in tensors.items():
        if hf_vision.is_vision_tensor(hf_name):
            continue
        name = hf_convert._params_name(pathlib.Path("<test>"), hf_name)
        array = np.asarray(array, np.float32)
        if array.ndim == 2 and name != "embed":
            array = np.ascontiguousarray(array.T)
        add_to_params(params, name, array, config.num_layers)
    return params


def media_prompt(rng, image_tokens: list[int], video_frame_tokens: list[int]) -> np.ndarray:
    """Text, then each image as <start> placeholders <end> with text between, then the video
    as a timestamp token and a delimited span per frame, then closing text."""
    text = lambda n: list(rng.integers(0, 100, n))  # noqa: E731
    tokens = text(3)
    for count in image_tokens:
        tokens += [START] + [IMAGE] * count + [END] + text(2)
    for count in video_frame_tokens:
        tokens += text(1) + [START] + [VIDEO] * count + [END]
    return np.array(tokens + text(3), np.int64)


def multimodal_reference_logits(model, tokens, image_pixels, image_grids, video_pixels,
                                video_grids) -> np.ndarray:
    """HF logits [T, V] of one full forward over a prompt with images and a video."""
    types = np.zeros_like(tokens)
    types[tokens == IMAGE] = 1
    types[tokens == VIDEO] = 2
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(tokens)[None],
                    pixel_values=torch.from_numpy(image_pixels),
                    image_grid_thw=torch.tensor(image_grids),
                    pixel_values_videos=torch.from_numpy(video_pixels),
                    video_grid_thw=torch.tensor(video_grids),
                    mm_token_type_ids=torch.from_numpy(types)[None])
    return out.logits[0].numpy()
