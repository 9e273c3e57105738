"""GGUF -> artifact contents: config from the `<arch>.*` keys, weights dequantized with the gguf
package, the byte-level BPE tokenizer rebuilt so ids equal llama.cpp's, the chat template copied.

llama.cpp's converter permutes the Q and K projection rows of `llama` models so that its RoPE
can rotate interleaved pairs. Our model rotates halves (rotate_half), so those rows are put
back in their original order here. `qwen3` GGUFs are stored unpermuted.
"""
from __future__ import annotations

import pathlib

import numpy as np

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact.format import ArtifactContents
from ninfer_jax.artifact.tensor_groups import tensor_group
from ninfer_jax.artifact.templates import builtin_template
from ninfer_jax.artifact.tokenizer_build import AddedSpec, build_bpe_tokenizer
from ninfer_jax.errors import ArtifactError
from ninfer_jax.kernels.quant_matmul.formats import BLOCK_FORMATS, block_leaf
from ninfer_jax.model.config import ModelConfig

# GGUF token types (llama.cpp's llama_token_type): 3 control, 4 user-defined.
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
LAYER_TENSORS = {"attn_norm": "attn_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv",
                 "attn_output": "wo", "ffn_norm": "mlp_norm", "ffn_gate": "w_gate",
                 "ffn_up": "w_up", "ffn_down": "w_down", "attn_q_norm": "q_norm",
                 "attn_k_norm": "k_norm"}
GLOBAL_TENSORS = {"token_embd": "embed", "output_norm": "final_norm", "output": "lm_head"}


class GGUFFile:
    """Typed access to a GGUFReader's key-value fields."""

    def __init__(self, path: pathlib.Path):
        import gguf

        self.path = path
        try:
            self.reader = gguf.GGUFReader(str(path))
        except Exception as exc:
            raise ArtifactError(path, f"not a readable GGUF file ({exc})") from None

    def get(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise ArtifactError(self.path, f"GGUF key {key!r} is missing")
        return value


def convert_gguf(path: pathlib.Path, *, name: str | None, dtype: str,
                 progress: common.ProgressFn | None = None,
                 keep_blocks: bool = False) -> ArtifactContents:
    """`keep_blocks`: tensors in a GGUF block format the CPU kernel reads (q8_0, q4_0, q4_1)
    stay as stored, per weight_formats group (embed, layers, lm_head) when the whole group
    shares one such format; everything else is dequantized to `dtype`."""
    gguf_file = GGUFFile(path)
    config = _config(gguf_file)
    tokenizer = _tokenizer(gguf_file)
    template = gguf_file.get("tokenizer.chat_template") or builtin_template("chatml")
    params, kept = _params(gguf_file, config, dtype, progress, keep_blocks)
    weight_formats = common.float_weight_formats(config, dtype)
    weight_formats.update(kept)
    return ArtifactContents(
        name=name or path.stem.lower(),
        config=config, params=params, tokenizer_json=tokenizer.to_str(),
        chat_template=template,
        special_tokens=_special_tokens(gguf_file, tokenizer),
        chat_format=common.detect_chat_format(template, tokenizer),
        source={"kind": "gguf", "file": path.name,
                "general.name": gguf_file.get("general.name"),
                "chat_template": "gguf" if gguf_file.get("tokenizer.chat_template") else
                "built-in chatml (the GGUF had none)"},
        weight_formats=weight_formats,
    )


def _config(gguf_file: GGUFFile) -> ModelConfig:
    arch = gguf_file.require("general.architecture")
    if arch not in ("llama", "qwen3"):
        raise ArtifactError(gguf_file.path, f"GGUF architecture {arch!r} is not supported "
                                            "(llama and qwen3 are)")
    key = lambda suffix: f"{arch}.{suffix}"  # noqa: E731
    hidden = int(gguf_file.require(key("embedding_length")))
    num_heads = int(gguf_file.require(key("attention.head_count")))
    head_dim = int(gguf_file.get(key("attention.key_length"), hidden // num_heads))
    tokens = gguf_file.require("tokenizer.ggml.tokens")
    has_output = any(t.name == "output.weight" for t in gguf_file.reader.tensors)
    eps = float(gguf_file.get(key("attention.layer_norm_rms_epsilon"), 1e-5))
    return ModelConfig(
        architecture=arch,
        vocab_size=int(gguf_file.get(key("vocab_size"), len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(gguf_file.require(key("feed_forward_length"))),
        num_layers=int(gguf_file.require(key("block_count"))),
        num_heads=num_heads,
        num_kv_heads=int(gguf_file.get(key("attention.head_count_kv"), num_heads)),
        head_dim=head_dim,
        rms_norm_eps=float(f"{eps:.7g}"),  # GGUF stores f32: 1e-5 reads as 9.99999974e-06
        rope_theta=float(f"{float(gguf_file.get(key('rope.freq_base'), 10000.0)):.7g}"),
        tie_word_embeddings=not has_output,
        qk_norm=arch == "qwen3",
        max_position_embeddings=int(gguf_file.get(key("context_length"), 8192)),
    )


def _tokenizer(gguf_file: GGUFFile):
    model = gguf_file.require("tokenizer.ggml.model")
    if model != "gpt2":
        raise ArtifactError(gguf_file.path, f"tokenizer model {model!r} is not supported "
                                            "(byte-level BPE 'gpt2' is)")
    tokens = list(gguf_file.require("tokenizer.ggml.tokens"))
    types = list(gguf_file.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in gguf_file.require("tokenizer.ggml.merges")]
    added = [AddedSpec(text, index, special=kind == TOKEN_TYPE_CONTROL)
             for index, (text, kind) in enumerate(zip(tokens, types))
             if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)]
    try:
        return build_bpe_tokenizer({t: i for i, t in enumerate(tokens)}, merges,
                                   pre_tokenizer_kind=gguf_file.get("tokenizer.ggml.pre", "default"),
                                   added=added)
    except ValueError as exc:
        raise ArtifactError(gguf_file.path, str(exc)) from None


def _special_tokens(gguf_file: GGUFFile, tokenizer) -> dict:
    eos_ids = [int(gguf_file.require("tokenizer.ggml.eos_token_id"))]
    if gguf_file.get("tokenizer.ggml.eot_token_id") is not None:
        eos_ids.append(int(gguf_file.get("tokenizer.ggml.eot_token_id")))
    optional = lambda key: None if gguf_file.get(key) is None else int(gguf_file.get(key))  # noqa
    return common.special_tokens(
        tokenizer, eos_ids=eos_ids, bos_id=optional("tokenizer.ggml.bos_token_id"),
        pad_id=optional("tokenizer.ggml.padding_token_id"),
        add_bos=bool(gguf_file.get("tokenizer.ggml.add_bos_token", False)))


def _params(gguf_file: GGUFFile, config: ModelConfig, dtype: str,
            progress: common.ProgressFn | None, keep_blocks: bool) -> tuple[dict, dict]:
    """(params, {group: block format} for the groups kept as stored)."""
    from gguf.quants import dequantize

    tensors = gguf_file.reader.tensors
    kept = _kept_groups(gguf_file, tensors) if keep_blocks else {}
    params: dict = {}
    for index, tensor in enumerate(tensors, start=1):
        name = _params_name(gguf_file.path, tensor.name)
        if progress:
            progress(index, len(tensors), tensor.name)
        if len(tensor.shape) == 2 and tensor_group(name) in kept:
            common.add_to_params(params, name, _block_leaf(tensor, name, config),
                                 config.num_layers)
            continue
        # dequantize returns [rows, cols] = [out, in] in numpy order; ours is [in, out].
        array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        array = array.reshape([int(d) for d in reversed(tensor.shape)])
        if config.architecture == "llama" and name.rsplit(".", 1)[-1] in ("wq", "wk"):
            heads = config.num_heads if name.endswith("wq") else config.num_kv_heads
            array = unpermute_rope_rows(array, heads)
        if array.ndim == 2 and name != "embed":
            array = array.T
        common.add_to_params(params, name, common.store(name, array, dtype), config.num_layers)
    try:
        common.check_complete(params, config, str(gguf_file.path))
    except ValueError as exc:
        raise ArtifactError(gguf_file.path, str(exc)) from None
    return params, kept


def _kept_groups(gguf_file: GGUFFile, tensors) -> dict[str, str]:
    """The groups whose 2-D tensors all share one block format that the CPU kernel reads."""
    seen: dict[str, set] = {}
    for tensor in tensors:
        if len(tensor.shape) == 2:
            group = tensor_group(_params_name(gguf_file.path, tensor.name))
            seen.setdefault(group, set()).add(tensor.tensor_type.name.lower())
    return {group: types.pop() for group, types in seen.items()
            if len(types) == 1 and next(iter(types)) in BLOCK_FORMATS}


def _block_leaf(tensor, name: str, config: ModelConfig) -> dict:
    """The tensor's raw block bytes [out, blocks] as a block leaf; llama.cpp's Q/K row order
    is undone on whole rows (each row is one output's blocks), as for float weights."""
    fmt = tensor.tensor_type.name.lower()
    blocks = np.asarray(tensor.data, np.uint8).reshape(int(tensor.shape[1]), -1)
    if config.architecture == "llama" and name.rsplit(".", 1)[-1] in ("wq", "wk"):
        heads = config.num_heads if name.endswith("wq") else config.num_kv_heads
        blocks = unpermute_rope_rows(blocks, heads)
    return block_leaf(fmt, blocks)


def _params_name(path: pathlib.Path, tensor_name: str) -> str:
    base = tensor_name.removesuffix(".weight")
    if base in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[base]
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_TENSORS:
        return f"layers.{int(parts[1])}.{LAYER_TENSORS[parts[2]]}"
    raise ArtifactError(path, f"unsupported GGUF tensor {tensor_name!r}")


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation on a [out, in] matrix.

    Per head, llama.cpp stores row pairs (i, i + D/2) next to each other; rotate_half RoPE
    needs the first half of each head's rows followed by the second half.
    """
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return (weight.reshape(num_heads, head_dim // 2, 2, cols)
            .swapaxes(1, 2).reshape(rows, cols))


def permute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's permutation (the inverse of `unpermute_rope_rows`); used by tests."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return (weight.reshape(num_heads, 2, head_dim // 2, cols)
            .swapaxes(1, 2).reshape(rows, cols))
