"""Pieces every converter shares: dtype casting, weight-format records, special-token and
chat-format metadata derived from a tokenizer and a template, and progress reporting."""
from __future__ import annotations

import sys
from typing import Callable

import numpy as np
from tokenizers import Tokenizer

from ninfer_jax.model.config import ModelConfig

DTYPES = ("f32", "bf16")
# Control spellings recorded under special_tokens.named when the vocabulary has them.
NAMED_CONTROLS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
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
    formats = {"embed": dtype, "layers": dtype, "norms": "f32"}
    if not config.tie_word_embeddings:
        formats["lm_head"] = dtype
    return formats


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
