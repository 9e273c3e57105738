"""GGUF conversion: a tiny GGUF written here (several quant types, llama.cpp's Q/K row
permutation) converts back to the original matrices; the default model's artifact metadata."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize, quantize

from ninfer_jax.artifact.convert import convert
from ninfer_jax.artifact.format import load_artifact
from ninfer_jax.artifact.gguf_convert import permute_rope_rows, unpermute_rope_rows
from ninfer_jax.errors import ArtifactError
from tiny_artifacts import byte_tokenizer

Q = gguf.GGMLQuantizationType
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 64, 64, 4, 2, 16, 2
# GGUF tensor -> (storage type, hf-orientation shape [out, in] or [n])
TENSOR_TYPES = {"attn_norm": Q.F32, "attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.BF16,
                "attn_output": Q.Q8_0, "ffn_norm": Q.F32, "ffn_gate": Q.F16, "ffn_up": Q.Q5_0,
                "ffn_down": Q.F32}


def _round_trip(matrix: np.ndarray, qtype) -> np.ndarray:
    """What a GGUF reader dequantizes back for `matrix` stored as `qtype`."""
    if qtype == Q.F32:
        return matrix
    return np.asarray(dequantize(quantize(matrix, qtype), qtype), np.float32).reshape(matrix.shape)


def _hf_shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    shapes = {"token_embd": (vocab, HIDDEN), "output_norm": (HIDDEN,), "output": (vocab, HIDDEN)}
    per_layer = {"attn_norm": (HIDDEN,), "attn_q": (HEADS * HEAD_DIM, HIDDEN),
                 "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN),
                 "attn_output": (HIDDEN, HEADS * HEAD_DIM), "ffn_norm": (HIDDEN,),
                 "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    for i in range(LAYERS):
        shapes.update({f"blk.{i}.{k}": s for k, s in per_layer.items()})
    return shapes


def _qtype(name: str):
    types = {"token_embd": Q.Q8_0, "output": Q.F16, "output_norm": Q.F32, **TENSOR_TYPES}
    return types[name.split(".")[-1]]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """Write a two-layer llama GGUF; return (path, original hf-orientation matrices)."""
    tokenizer = byte_tokenizer()
    vocab = tokenizer.get_vocab_size()
    tokens = [tokenizer.id_to_token(i) for i in range(vocab)]
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    writer.add_token_merges(["h e", "l l", "he ll", "Ġ w"])
    writer.add_eos_token_id(tokenizer.token_to_id("<|im_end|>"))
    writer.add_bos_token_id(tokenizer.token_to_id("<|endoftext|>"))
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    rng = np.random.default_rng(7)
    originals = {}
    for name, shape in _hf_shapes(vocab).items():
        matrix = rng.standard_normal(shape).astype(np.float32)
        originals[name] = _round_trip(matrix, _qtype(name))
        stored = matrix
        if name.endswith(("attn_q", "attn_k")):
            stored = permute_rope_rows(matrix, HEADS if name.endswith("attn_q") else KV_HEADS)
        qtype = _qtype(name)
        if qtype == Q.F32:
            writer.add_tensor(f"{name}.weight", stored)
        else:
            writer.add_tensor(f"{name}.weight", quantize(stored, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, originals


def test_permutation_inverse():
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(8 * 3, 5)
    np.testing.assert_array_equal(unpermute_rope_rows(permute_rope_rows(w, 3), 3), w)
    assert not np.array_equal(permute_rope_rows(w, 3), w)


def test_tiny_gguf_converts_to_original_matrices(tiny_gguf, tmp_path):
    path, originals = tiny_gguf
    progress = []
    out = convert(path, tmp_path / "tiny.ninfer", name="tiny-gguf",
                  progress=lambda i, n, name: progress.append((i, n)))
    artifact = load_artifact(out)
    assert progress[0] == (1, len(originals)) and progress[-1] == (len(originals),) * 2
    config = artifact.config
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
            config.head_dim, config.intermediate_size) == (LAYERS, HIDDEN, HEADS, KV_HEADS,
                                                           HEAD_DIM, FFN)
    assert config.rope_theta == 500000.0 and config.rms_norm_eps == 1e-6
    assert not config.tie_word_embeddings
    params = artifact.params
    np.testing.assert_array_equal(params["embed"], originals["token_embd"])
    np.testing.assert_array_equal(params["lm_head"], originals["output"].T)
    np.testing.assert_array_equal(params["final_norm"], originals["output_norm"])
    names = {"attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo",
             "ffn_gate": "w_gate", "ffn_up": "w_up", "ffn_down": "w_down"}
    for layer in range(LAYERS):
        for gguf_name, ours in names.items():
            np.testing.assert_array_equal(params["layers"][layer][ours],
                                          originals[f"blk.{layer}.{gguf_name}"].T,
                                          err_msg=f"layer {layer} {ours}")
        np.testing.assert_array_equal(params["layers"][layer]["mlp_norm"],
                                      originals[f"blk.{layer}.ffn_norm"])


def test_tiny_gguf_tokenizer_and_metadata(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    artifact = load_artifact(convert(path, tmp_path / "t.ninfer", dtype="bf16"), weights=False)
    reference = byte_tokenizer()
    tokenizer = artifact.load_tokenizer()
    text = "hello world <|im_start|>x"
    assert tokenizer.encode(text) == reference.encode(text).ids
    assert artifact.metadata["special_tokens"]["eos_ids"] == [reference.token_to_id("<|im_end|>")]
    assert artifact.weight_formats["layers"] == "bf16"
    assert artifact.metadata["source"]["kind"] == "gguf"
    assert artifact.name == "tiny"


def test_unsupported_source_is_named(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a gguf at all")
    with pytest.raises(ArtifactError) as info:
        convert(bogus, tmp_path / "out.ninfer")
    assert info.value.path == str(bogus)
    assert not (tmp_path / "out.ninfer").exists()


def test_exception_during_conversion_leaves_no_output(tiny_gguf, tmp_path):
    path, _ = tiny_gguf

    def interrupt(index, total, name):
        if index == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(path, tmp_path / "out.ninfer", progress=interrupt)
    assert list(tmp_path.iterdir()) == []


def test_default_artifact_metadata(default_artifact_path):
    artifact = load_artifact(default_artifact_path, weights=False)
    assert artifact.name == "smollm2-135m-instruct"
    assert artifact.eos_ids == [2]
    assert artifact.chat_format == {"tool_call_format": None, "reasoning": None,
                                    "thinking_default": False}
    config = artifact.config
    assert (config.architecture, config.num_layers, config.hidden_size, config.vocab_size,
            config.tie_word_embeddings) == ("llama", 30, 576, 49152, True)
    assert config.rope_theta == 100000.0
    # make setup keeps the GGUF's blocks (DEFAULT_WEIGHTS): q8_0 table, q4_1 layers
    assert artifact.weight_formats == {"embed": "q8_0", "layers": "q4_1", "norms": "f32"}
