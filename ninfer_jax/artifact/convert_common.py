"""Pieces every converter shares: dtype casting, weight-format records, special-token and
chat-format metadata derived from a tokenizer and a template, and progress reporting."""
from __future__ import annotations

import sys
from typing import Callable

import numpy as np
from tokenizers import Tokenizer

from ninfer_jax.model.config import ModelConfig

DTYPES = ("f32", "bf16")
# Weight-only quantized formats of projection matrices (layout: kernels/quant_matmul/formats.py).
QUANTIZED = ("int8", "fp8", "int4", "nvfp4")
WEIGHT_CHOICES = DTYPES + QUANTIZED
# Control spellings recorded under special_tokens.named when the vocabulary has them.
NAMED_CONTROLS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                  "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>")
REASONING_MARKERS = {"open": "<think>", "close": "</think>"}

ProgressFn = Callable[[int, int, str], None]


def stderr_progress(index: int, total: int, name: str) -> None:
    print(f"tensor {index} of {total}: {name}", file=sys.stderr, flush=True)


def cast(array: np.ndarray, dtype: str) -> np.ndarray:
    """A float matrix in the artifact's storage dtype (f32 or bf16)."""
    if dtype == "f32":
        return np.ascontiguousarray(array, dtype=np.float32)
    if dtype == "bf16":
        import ml_dtypes

        return np.ascontiguousarray(np.asarray(array, np.float32).astype(ml_dtypes.bfloat16))
    raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")


def store(name: str, array: np.ndarray, dtype: str) -> np.ndarray:
    """Norm vectors always stay f32 (tiny, precision-sensitive); matrices take `dtype`."""
    return cast(array, "f32" if name.endswith("norm") else dtype)


def float_weight_formats(config: ModelConfig, dtype: str) -> dict[str, str]:
    return weight_formats(config, dtype, None)


def weight_formats(config: ModelConfig, dtype: str, quantized: str | None) -> dict[str, str]:
    """metadata.weight_formats: embed and norms stay float; projections may be quantized."""
    formats = {"embed": dtype, "layers": quantized or dtype, "norms": "f32"}
    if not config.tie_word_embeddings:
        formats["lm_head"] = quantized or dtype
    return formats


def resolve_formats(dtype: str | None, weights: str | None, default_dtype: str = "f32"
                    ) -> tuple[str, str | None]:
    """(float storage dtype, quantized projection format or None) from --dtype / --weights.

    `--weights bf16` alone means everything bf16; `--weights int8` keeps the float dtype
    (given or default) for embeddings; contradicting float choices are an error."""
    if weights is not None and weights not in WEIGHT_CHOICES:
        raise ValueError(f"unknown weight format {weights!r}; expected one of {WEIGHT_CHOICES}")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    if weights in DTYPES:
        if dtype is not None and dtype != weights:
            raise ValueError(f"--weights {weights} contradicts --dtype {dtype}")
        return weights, None
    return dtype or default_dtype, weights


def quantize(array: np.ndarray, fmt: str):
    """One projection matrix [in, out] as a quantized leaf (a dict of arrays)."""
    from ninfer_jax.kernels.quant_matmul.formats import quantize as quantize_leaf

    return quantize_leaf(array, fmt)


def is_projection(name: str) -> bool:
    return name == "lm_head" or (name.startswith("layers.") and not name.endswith("norm"))


def quantize_projections(params: dict, fmt: str, progress: ProgressFn | None = None) -> dict:
    """Replace every projection matrix (layer matrices, untied lm_head) by its `fmt` leaf."""
    if "lm_head" in params:
        params["lm_head"] = quantize(params["lm_head"], fmt)
    layers = params.get("layers", [])
    for index, layer in enumerate(layers, start=1):
        if progress:
            progress(index, len(layers), f"quantizing layer {index - 1} to {fmt}")
        for key, value in layer.items():
            if not key.endswith("norm"):
                layer[key] = quantize(value, fmt)
    return params


def special_tokens(tokenizer: Tokenizer, *, eos_ids: list[int], bos_id: int | None,
                   pad_id: int | None, add_bos: bool) -> dict:
    named = {text: tokenizer.token_to_id(text) for text in NAMED_CONTROLS
             if tokenizer.token_to_id(text) is not None}
    return {"bos_id": bos_id, "eos_ids": list(dict.fromkeys(eos_ids)), "pad_id": pad_id,
            "add_bos": add_bos, "named": named}


def detect_chat_format(template: str, tokenizer: Tokenizer) -> dict:
    """What the output parsers need to know, guessed from the template's own markup."""
    if "<function=" in template:
        tool_format = "qwen_xml"
    elif "<tool_call>" in template:
        tool_format = "hermes"
    else:
        tool_format = None
    has_markers = all(tokenizer.token_to_id(m) is not None for m in REASONING_MARKERS.values())
    reasoning = dict(REASONING_MARKERS) if has_markers and "<think>" in template else None
    return {"tool_call_format": tool_format, "reasoning": reasoning,
            "thinking_default": reasoning is not None}


def add_to_params(params: dict, name: str, array: np.ndarray, num_layers: int) -> None:
    """Place an array under its dotted params name (`embed`, `layers.3.wq`)."""
    if name.startswith("layers."):
        _, index, leaf = name.split(".", 2)
        layers = params.setdefault("layers", [{} for _ in range(num_layers)])
        layers[int(index)][leaf] = array
    else:
        params[name] = array


def check_complete(params: dict, config: ModelConfig, source: str) -> None:
    from ninfer_jax.artifact.weights_io import subtree

    missing = [name for name in config.expected_shapes() if subtree(params, name) is None]
    if missing:
        raise ValueError(f"{source}: tensors missing for {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''}")


def apply_quantization(contents, quantized: str | None, progress: ProgressFn | None = None):
    """Quantize an ArtifactContents' projections in place (no-op for None) and record it."""
    if quantized is None:
        return contents
    quantize_projections(contents.params, quantized, progress)
    contents.weight_formats = weight_formats(contents.config, contents.weight_formats["embed"],
                                             quantized)
    return contents
