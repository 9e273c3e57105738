"""Pieces every converter shares: dtype casting, weight-format records, quantization of the
projection matrices, special-token and chat-format metadata derived from a tokenizer and a
template, placing tensors in the params tree, and progress reporting."""
from __future__ import annotations

import concurrent.futures
import os
import sys
from typing import Any, Callable

import numpy as np
from tokenizers import Tokenizer

from ninfer_jax.artifact.components import mtp_expected_shapes
from ninfer_jax.artifact.tensor_groups import tensor_group
from ninfer_jax.model.config import ModelConfig

DTYPES = ("f32", "bf16")
# Weight-only quantized formats of projection matrices (layout: kernels/quant_matmul/formats.py).
QUANTIZED = ("int8", "fp8", "int4", "nvfp4")
GGUF_STORED = "gguf"  # keep a GGUF's block formats as stored (gguf_convert.keep_blocks)
WEIGHT_CHOICES = DTYPES + QUANTIZED + (GGUF_STORED,)
# The 2-D [in, out] layer matrices a quantized format applies to (and lm_head, mtp.fc). The
# rest stays in the float dtype: routers and gates (tiny, decide routing), the conv taps, the
# per-head in_b / in_a, and the stacked experts (kernels/quant_matmul has no [E, in, out] layout).
QUANTIZED_LAYER_LEAVES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "in_qkv", "in_z",
                          "out", "shared_w_gate", "shared_w_up", "shared_w_down", "in_proj")
# Leaves quantized at once by a converter or init-random (quantize_projections)
QUANTIZE_THREADS = 8
# Control spellings recorded under special_tokens.named when the vocabulary has them.
NAMED_CONTROLS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                  "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>", "[gMASK]", "<sop>", "<|system|>",
                  "<|user|>", "<|assistant|>", "<|observation|>", "<arg_key>", "</arg_key>",
                  "<arg_value>", "</arg_value>", "<bos>", "<eos>", "<|turn>", "<turn|>",
                  "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
                  "<|channel>", "<channel|>", "<|think|>")
REASONING_MARKERS = {"open": "<think>", "close": "</think>"}
GEMMA_REASONING_MARKERS = {"open": "<|channel>thought", "close": "<channel|>"}

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
    """Norm vectors and the `norms` group's per-head vectors (dt_bias, A_log) always stay f32
    (tiny, precision-sensitive); everything else takes `dtype`."""
    return cast(array, "f32" if tensor_group(name) == "norms" else dtype)


def float_weight_formats(config: ModelConfig, dtype: str) -> dict[str, str]:
    return weight_formats(config, dtype, None)


def weight_formats(config: ModelConfig, dtype: str, quantized: str | None) -> dict[str, str]:
    """metadata.weight_formats: embed and norms stay float; projections may be quantized."""
    formats = {"embed": dtype, "layers": quantized or dtype, "norms": "f32"}
    if not config.tie_word_embeddings:
        formats["lm_head"] = quantized or dtype
    if config.mtp_num_layers:
        formats["mtp"] = quantized or dtype
    if config.hidden_size_per_layer_input:  # Gemma's per-layer inputs stay float
        formats["ple_embed"] = formats["ple_model_proj"] = dtype
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


def quantize_projections(params: dict, fmt: str, progress: ProgressFn | None = None,
                         threads: int = 1) -> dict:
    """Replace every projection matrix (QUANTIZED_LAYER_LEAVES of the text and MTP layers,
    untied lm_head, mtp.fc) by its `fmt` leaf, `threads` leaves at a time (numpy releases
    the GIL inside its array passes: an 8B init-random --weights int8 spent over 60 s here on
    one core of a 16-core machine, run 50b)."""
    mtp = params.get("mtp") or {}
    layers = [*params.get("layers", []), *mtp.get("layers", [])]
    jobs = [(params, "lm_head")] if "lm_head" in params else []
    jobs += [(mtp, "fc")] if "fc" in mtp else []
    layer_jobs = [[(layer, key) for key in layer if key in QUANTIZED_LAYER_LEAVES]
                  for layer in layers]

    def run(job) -> None:
        holder, key = job
        holder[key] = quantize(holder[key], fmt)

    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        for _ in pool.map(run, jobs):
            pass
        # A layer's leaves in parallel, then the next layer's: progress stays per layer and
        # at most a layer's float copies are alive at once.
        for index, layer_leaves in enumerate(layer_jobs, start=1):
            if progress:
                progress(index, len(layers), f"quantizing layer {index - 1} to {fmt}")
            for _ in pool.map(run, layer_leaves):
                pass
    return params


def special_tokens(tokenizer: Tokenizer, *, eos_ids: list[int], bos_id: int | None,
                   pad_id: int | None, add_bos: bool) -> dict:
    named = {text: tokenizer.token_to_id(text) for text in NAMED_CONTROLS
             if tokenizer.token_to_id(text) is not None}
    return {"bos_id": bos_id, "eos_ids": list(dict.fromkeys(eos_ids)), "pad_id": pad_id,
            "add_bos": add_bos, "named": named}


def detect_chat_format(template: str, tokenizer: Tokenizer) -> dict:
    """What the output parsers need to know, guessed from the template's own markup."""
    if "<|tool_call>" in template:
        tool_format = "gemma4"
    elif "<TOOLCALL>" in template:
        tool_format = "nemotron"
    elif "<arg_key>" in template:
        tool_format = "glm_xml"
    elif "<function=" in template:
        tool_format = "qwen_xml"
    elif "<tool_call>" in template:
        tool_format = "hermes"
    else:
        tool_format = None
    has_markers = all(tokenizer.token_to_id(m) is not None for m in REASONING_MARKERS.values())
    reasoning = dict(REASONING_MARKERS) if has_markers and "<think>" in template else None
    if "<|channel>" in template and tokenizer.token_to_id("<channel|>") is not None:
        reasoning = dict(GEMMA_REASONING_MARKERS)  # Gemma 4's thought channel
    return {"tool_call_format": tool_format, "reasoning": reasoning,
            "thinking_default": reasoning is not None}


def add_to_params(params: dict, name: str, array: np.ndarray, num_layers: int = 0) -> None:
    """Place an array under its dotted params name (`embed`, `layers.3.wq`, `mtp.fc`,
    `mtp.layers.0.wq`); a `layers` list starts with num_layers entries and grows as needed."""
    if name.startswith("mtp."):
        add_to_params(params.setdefault("mtp", {}), name[4:], array)
    elif name.startswith("layers."):
        _, index, leaf = name.split(".", 2)
        layers = params.setdefault("layers", [{} for _ in range(num_layers)])
        layers.extend({} for _ in range(int(index) + 1 - len(layers)))
        layers[int(index)][leaf] = array
    else:
        params[name] = array


def collect_params(sources: list, config: ModelConfig, dtype: str,
                   progress: ProgressFn | None,
                   name_of: Callable[[Any, str], str | None],
                   layout: Callable[[str, np.ndarray], np.ndarray]) -> dict:
    """The params tree from (SafetensorsFile, hf_name) pairs read one at a time:
    `name_of(file, hf_name)` names a tensor (None: not used), `layout(name, array)` turns the
    float32 array into the layout model/config.py stores (e.g. a transpose)."""
    params: dict = {}
    for index, (file, hf_name) in enumerate(sources, start=1):
        if progress:
            progress(index, len(sources), hf_name)
        name = name_of(file, hf_name)
        if name is None:
            continue
        array = layout(name, np.asarray(file.get(hf_name), dtype=np.float32))
        add_to_params(params, name, store(name, array, dtype), config.num_layers)
    return params


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the text model and of the MTP head (when the config has one)."""
    return {**config.expected_shapes(), **mtp_expected_shapes(config)}


def check_complete(params: dict, config: ModelConfig, source: str) -> None:
    from ninfer_jax.artifact.weights_io import subtree

    missing = [name for name in expected_shapes(config) if subtree(params, name) is None]
    if missing:
        raise ValueError(f"{source}: tensors missing for {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''}")


def apply_quantization(contents, quantized: str | None, progress: ProgressFn | None = None):
    """Quantize an ArtifactContents' projections in place (no-op for None) and record it."""
    if quantized is None:
        return contents
    quantize_projections(contents.params, quantized, progress,
                         threads=min(QUANTIZE_THREADS, os.cpu_count() or 1))
    vision = contents.weight_formats.get("vision")  # the tower stays float
    contents.weight_formats = weight_formats(contents.config, contents.weight_formats["embed"],
                                             quantized)
    if vision:
        contents.weight_formats["vision"] = vision
    return contents
