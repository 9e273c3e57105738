"""Hugging Face checkpoint directory -> artifact contents: config.json, *.safetensors,
tokenizer.json (copied as is), tokenizer_config.json / chat_template.jinja for the template,
generation_config.json for the end-of-sequence ids. Projection weights are transposed from
torch's [out, in] to our [in, out].

Dense `LlamaForCausalLM`, `Qwen3ForCausalLM` and the language model of
`Qwen3VLForConditionalGeneration` (`model.language_model.*`, MRoPE sections kept) are mapped
here; the hybrid Qwen3.5 / 3.6 / Qwen3-Next classes by hf_hybrid_config.py (config) and
hf_hybrid.py (tensors, MTP head); GLM MoE (`Glm4MoeForCausalLM`) by hf_glm.py (config) and
hf_hybrid.py (tensors); Gemma 4 (`Gemma4ForCausalLM`,
`Gemma4ForConditionalGeneration`'s text model) by hf_gemma.py; Nemotron-H
(`NemotronHForCausalLM`) by hf_nemotron.py. A checkpoint with a `vision_config` (Qwen3-VL,
Qwen3.5) also gets the vision component, its tensors `model.visual.*` mapped by hf_vision.py.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any

from tokenizers import Tokenizer

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact import hf_gemma, hf_hybrid, hf_nemotron, hf_vision
from ninfer_jax.artifact.components import (VISION_PREFIX, add_vision_tensor,
                                            vision_expected_shapes)
from ninfer_jax.artifact.hf_glm import GLM_ARCHITECTURES, glm_model_config
from ninfer_jax.artifact.hf_hybrid_config import (HYBRID_ARCHITECTURES, hybrid_model_config,
                                                  rope_from, text_config)
from ninfer_jax.artifact.format import ArtifactContents
from ninfer_jax.artifact.safetensors_io import SafetensorsFile
from ninfer_jax.artifact.templates import builtin_template
from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.config import ModelConfig

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3",
                 "Qwen3VLForConditionalGeneration": "qwen3"}
MULTIMODAL_TEXT_PREFIX = "model.language_model."  # the wrapper's language model (-> model.)
LAYER_TENSORS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "wq",
                 "self_attn.k_proj": "wk", "self_attn.v_proj": "wv", "self_attn.o_proj": "wo",
                 "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm",
                 "post_attention_layernorm": "mlp_norm", "mlp.gate_proj": "w_gate",
                 "mlp.up_proj": "w_up", "mlp.down_proj": "w_down"}
GLOBAL_TENSORS = {"model.embed_tokens": "embed", "model.norm": "final_norm", "lm_head": "lm_head"}


def _read_json(path: pathlib.Path, required: bool = True) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ArtifactError(path, "missing")
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(path, f"not valid JSON ({exc})") from None


def convert_hf(directory: pathlib.Path, *, name: str | None, dtype: str,
               progress: common.ProgressFn | None = None) -> ArtifactContents:
    hf_config = _read_json(directory / "config.json")
    sources = _sources(directory)
    config = model_config(hf_config, directory / "config.json",
                          mtp_layers=hf_hybrid.mtp_layer_count([n for _, n in sources]))
    tokenizer_file = directory / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ArtifactError(tokenizer_file, "missing")
    tokenizer_json = tokenizer_file.read_text(encoding="utf-8")
    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer_config = _read_json(directory / "tokenizer_config.json", required=False)
    template, template_origin = _chat_template(directory, tokenizer_config)
    source = {"kind": "huggingface", "directory": directory.name,
              "architectures": hf_config.get("architectures"), "chat_template": template_origin}
    # Gemma 4's towers are not ours (hf_gemma converts its text model only): only Qwen-VL
    # checkpoints get the vision component.
    vision = (None if config.is_gemma else
              hf_vision.vision_config(hf_config, directory / "config.json", config.hidden_size))
    params = _params(directory, sources, config, dtype, progress)
    formats = common.float_weight_formats(config, dtype)
    if vision:
        params["vision"] = _vision_params(directory, sources, vision, dtype)
        formats["vision"] = dtype
    return ArtifactContents(
        name=name or directory.name.lower(), config=config, params=params,
        tokenizer_json=tokenizer_json, chat_template=template,
        special_tokens=_special_tokens(directory, hf_config, tokenizer_config, tokenizer),
        chat_format=common.detect_chat_format(template, tokenizer), source=source,
        weight_formats=formats, vision_config=vision,
        components={"text": True, "mtp": config.mtp_num_layers > 0, "dflash": False,
                    "vision": vision is not None})


def _vision_params(directory: pathlib.Path, sources: list, vision, dtype: str) -> dict:
    """The vision tree from the checkpoint's tower tensors, complete or an error."""
    tree: dict = {}
    for file, hf_name in sources:
        if hf_vision.is_vision_tensor(hf_name):
            name = hf_vision.vision_name(file.path, hf_name)
            array = hf_vision.vision_array(name, file.get(hf_name))
            add_vision_tensor(tree, name, common.store(VISION_PREFIX + name, array, dtype))
    from ninfer_jax.artifact.weights_io import subtree

    expected = vision_expected_shapes(vision)
    missing = [n for n in expected if subtree({"vision": tree}, n) is None]
    if missing:
        raise ArtifactError(directory, f"vision tensors missing for {', '.join(missing[:5])}")
    return tree


def model_config(hf: dict[str, Any], path: pathlib.Path, mtp_layers: int = 0) -> ModelConfig:
    """Our config of a checkpoint; `mtp_layers` is how many MTP layers its tensors hold."""
    architectures = hf.get("architectures") or []
    hybrid = [HYBRID_ARCHITECTURES[a] for a in architectures if a in HYBRID_ARCHITECTURES]
    if hybrid:
        return hybrid_model_config(hf, path, architecture=hybrid[0], mtp_layers=mtp_layers)
    if any(a in GLM_ARCHITECTURES for a in architectures):
        return glm_model_config(hf, path)
    if any(a in hf_gemma.GEMMA_ARCHITECTURES for a in architectures):
        return hf_gemma.gemma_model_config(hf, path)
    if any(a in hf_nemotron.NEMOTRON_ARCHITECTURES for a in architectures):
        return hf_nemotron.nemotron_model_config(hf, path)
    known = [ARCHITECTURES[a] for a in architectures if a in ARCHITECTURES]
    if not known:
        supported = [*ARCHITECTURES, *HYBRID_ARCHITECTURES, *GLM_ARCHITECTURES,
                     *hf_gemma.GEMMA_ARCHITECTURES, *hf_nemotron.NEMOTRON_ARCHITECTURES]
        raise ArtifactError(path, f"architectures {architectures} not supported "
                                  f"(supported: {', '.join(supported)})")
    wrapper, hf = hf, text_config(hf)
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ArtifactError(path, "attention/MLP biases are not supported")
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in hf.get("layer_types") or []):
        raise ArtifactError(path, "sliding-window layers are not supported")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    mrope_section = tuple(rope.pop("mrope_section", None) or ())
    rope.pop("mrope_interleaved", None)
    rope_theta, rope_scaling = rope_from(rope, hf)
    heads = int(hf["num_attention_heads"])
    try:
        return ModelConfig(
            architecture=known[0], vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]), intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(wrapper.get("tie_word_embeddings",
                                                 hf.get("tie_word_embeddings", False))),
            qk_norm=known[0] == "qwen3", mrope_section=mrope_section,
            max_position_embeddings=int(hf.get("max_position_embeddings", 8192)))
    except (KeyError, ValueError, TypeError) as exc:
        raise ArtifactError(path, f"incomplete or invalid config ({exc})") from None


def _sources(directory: pathlib.Path) -> list[tuple[SafetensorsFile, str]]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ArtifactError(directory, "no *.safetensors files")
    return [(f, name) for f in map(SafetensorsFile, files) for name in f.names()]


def _params(directory: pathlib.Path, sources: list, config: ModelConfig, dtype: str,
            progress: common.ProgressFn | None) -> dict:
    if config.is_hybrid or config.is_glm:
        params = hf_hybrid.hybrid_params(sources, config, dtype, progress)
    elif config.is_gemma:
        params = hf_gemma.gemma_params(sources, config, dtype, progress)
    elif config.is_nemotron:
        params = hf_nemotron.nemotron_params(sources, config, dtype, progress)
    else:
        params = _dense_params(sources, config, dtype, progress)
    try:
        common.check_complete(params, config, str(directory))
    except ValueError as exc:
        raise ArtifactError(directory, str(exc)) from None
    return params


def _dense_params(sources: list, config: ModelConfig, dtype: str,
                  progress: common.ProgressFn | None) -> dict:
    def name_of(file, hf_name):
        if hf_vision.is_vision_tensor(hf_name):
            return None  # the vision component (_vision_params)
        name = _params_name(file.path, hf_name)
        return None if name == "lm_head" and config.tie_word_embeddings else name

    return common.collect_params(sources, config, dtype, progress, name_of,
                                 lambda name, a: a.T if a.ndim == 2 and name != "embed" else a)


def _params_name(path: pathlib.Path, hf_name: str) -> str | None:
    if hf_name.startswith(MULTIMODAL_TEXT_PREFIX):
        hf_name = "model." + hf_name[len(MULTIMODAL_TEXT_PREFIX):]
    base = hf_name.removesuffix(".weight")
    if base in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[base]
    if base.endswith("rotary_emb.inv_freq"):
        return None  # recomputed from rope_theta
    parts = base.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_TENSORS:
        return f"layers.{int(parts[2])}.{LAYER_TENSORS[parts[3]]}"
    raise ArtifactError(path, f"unsupported tensor {hf_name!r}")


def _chat_template(directory: pathlib.Path, tokenizer_config: dict) -> tuple[str, str]:
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default") or next(iter(named.values()), None)
    if template:
        return template, "tokenizer_config.json"
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text(encoding="utf-8"), "chat_template.jinja"
    from_json = _read_json(directory / "chat_template.json", required=False).get("chat_template")
    if from_json:
        return from_json, "chat_template.json"
    return builtin_template("chatml"), "built-in chatml (the checkpoint had none)"


def _token_id(tokenizer: Tokenizer, value) -> int | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", ...} in older configs
        value = value.get("content")
    return tokenizer.token_to_id(value) if isinstance(value, str) else None


def _special_tokens(directory: pathlib.Path, hf_config: dict, tokenizer_config: dict,
                    tokenizer: Tokenizer) -> dict:
    generation = _read_json(directory / "generation_config.json", required=False)
    hf_config = {**text_config(hf_config), **hf_config}  # a wrapper's ids may sit in either
    eos = generation.get("eos_token_id", hf_config.get("eos_token_id"))
    eos_ids = eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
    if not eos_ids and _token_id(tokenizer, tokenizer_config.get("eos_token")) is not None:
        eos_ids = [_token_id(tokenizer, tokenizer_config["eos_token"])]
    if not eos_ids:
        raise ArtifactError(directory, "no eos_token_id in generation_config.json, "
                                       "config.json or tokenizer_config.json")
    bos_id = generation.get("bos_token_id", hf_config.get("bos_token_id"))
    if bos_id is None:
        bos_id = _token_id(tokenizer, tokenizer_config.get("bos_token"))
    pad_id = hf_config.get("pad_token_id")
    if pad_id is None:
        pad_id = _token_id(tokenizer, tokenizer_config.get("pad_token"))
    # BOS is "added" when the tokenizer's own post-processor puts it in front of the text.
    add_bos = bos_id is not None and tokenizer.encode("", add_special_tokens=True).ids[:1] == [bos_id]
    return common.special_tokens(tokenizer, eos_ids=[int(i) for i in eos_ids], bos_id=bos_id,
                                 pad_id=pad_id, add_bos=add_bos)
