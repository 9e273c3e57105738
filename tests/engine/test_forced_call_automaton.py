"""ForcedToolCall's device automaton on real tokenizers (SmolLM2's 49k vocabulary, Qwen's
151k, Gemma 4's) against the host policy, for every tool-call format: a stand-in model whose
sample is a hash of (seed, committed output) drives both, the host policy committing whole
forced runs through `adjust`, the automaton one token per step through the same `advance`
the compiled step runs. Samples are drawn mostly from tokens spelling pieces of the offered
names, so names are often written by the model, cut short by a completion, or finished and
run past; with thinking before the answer (prefilled or model-opened) too."""
from __future__ import annotations

import functools
import hashlib
import pathlib

import numpy as np
import pytest

from ninfer_jax.engine.policies import ForcedToolCall, PlainEncode
from ninfer_jax.engine.policy_lanes import DevicePolicy
from ninfer_jax.model import token_automaton
from ninfer_jax.text import tool_parsers
from ninfer_jax.text.tokenizer import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / "artifacts" / "smollm2-135m-instruct.ninfer" / "tokenizer.json"
NAMES = ["get_weather", "get_time", "search_web", "get"]
FORMATS = [tool_parsers.HermesFormat, tool_parsers.QwenXmlFormat, tool_parsers.GlmXmlFormat,
           tool_parsers.GemmaFormat, tool_parsers.NemotronFormat]


@functools.cache
def tokenizer(name: str) -> Tokenizer:
    if name == "smollm2":
        if not SMOLLM2.exists():
            pytest.skip("the SmolLM2 artifact is not here")
        return Tokenizer(SMOLLM2.read_text(), eos_ids=[2])
    from ninfer_jax.artifact.random_init import init_random
    contents = init_random(name)
    return Tokenizer(contents.tokenizer_json,
                     eos_ids=contents.metadata()["special_tokens"]["eos_ids"])


@functools.cache
def pools(name: str):
    """(blank tokens, tokens whose text is a piece of an offered name and its terminator)."""
    tok = tokenizer(name)
    pieces = {n + end for n in NAMES for end in ('"', ">", "{", "\n")}
    blank, named = [], []
    for token in range(tok.vocab_size):
        text = tok.decode([token])
        if not text.strip():
            blank.append(token)
        elif any(text in piece for piece in pieces):
            named.append(token)
    return blank, named


def make(name, fmt, **fields):
    tok = tokenizer(name)
    options = dict(decode=tok.decode, encode=PlainEncode(tok),
                   prefix_ids=tok.encode(fmt.call_prefix, special=True), names=NAMES,
                   terminator=fmt.name_terminator, open_id=None, close_id=None,
                   starts_in_reasoning=False, may_open_thinking=False)
    options.update(fields)
    return ForcedToolCall(**options)


def both(name, policy_maker, seed, length=28, markers=(), sample=None):
    """(host output, device output, device forced flags) for the stand-in model `sample`
    (by default a hash of (seed, output) over blank, marker, name-piece and any tokens)."""
    vocab = tokenizer(name).vocab_size
    blank, named = pools(name)

    def hashed(output):
        h = int(hashlib.sha256(repr((seed, tuple(output))).encode()).hexdigest(), 16)
        kind, h = h % 20, h // 20
        if kind < 2:
            return blank[h % len(blank)]
        if kind < 4 and markers:
            return markers[h % len(markers)]
        return named[h % len(named)] if kind < 18 else h % vocab
    sample = sample or hashed
    host, output = policy_maker(), []
    while len(output) < length:
        output += host.adjust(list(output), sample(output))
    device = DevicePolicy.compile(policy_maker(), vocab)
    assert device is not None  # it runs on the device
    table = np.stack([np.zeros(token_automaton.ROW_WIDTH, np.int32), device.row()])
    committed, flags = [], []
    while len(committed) < length:
        emitted, node, counter, forced = token_automaton.advance(
            np, table, np.int32([1]), np.int32([sample(committed)]), np.int32([len(committed)]))
        table[1, :2] = node[0], counter[0]
        device.commit(int(emitted[0]), bool(forced[0]))  # the mirror follows the lane
        assert (device.node, device.counter) == (int(node[0]), int(counter[0]))
        committed.append(int(emitted[0]))
        flags.append(bool(forced[0]))
    return output[:length], committed, flags


@pytest.mark.parametrize("name", ["smollm2", "qwen3-tiny", "gemma4-tiny"])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.__name__)
def test_the_automaton_commits_the_host_policys_tokens(name, fmt):
    prefix = tokenizer(name).encode(fmt.call_prefix, special=True)
    first_name_token = set()
    for seed in range(60):
        host, device, flags = both(name, lambda: make(name, fmt), seed)
        assert device == host
        starts = [i + len(prefix) for i in range(len(device)) if device[i:i + len(prefix)] == prefix]
        if starts and starts[0] < len(device):
            first_name_token.add("forced" if flags[starts[0]] else "written")
    # names the model began itself, and names completed for it from their first token
    assert first_name_token == {"forced", "written"}


@pytest.mark.parametrize("name", ["smollm2", "qwen3-tiny"])
def test_thinking_first_prefilled_or_model_opened(name):
    tok = tokenizer(name)
    open_id, close_id = tok.encode("<think>", special=True), tok.encode("</think>", special=True)
    if len(open_id) != 1 or len(close_id) != 1:
        pytest.skip("no one-token think markers")
    markers = (open_id[0], close_id[0])
    for fields in (dict(starts_in_reasoning=True), dict(may_open_thinking=True)):
        def maker():
            return make(name, tool_parsers.HermesFormat, open_id=open_id[0],
                        close_id=close_id[0], **fields)
        calls = 0
        for seed in range(25):
            host, device, flags = both(name, maker, seed, markers=markers)
            assert device == host
            calls += any(flags)
        assert calls  # some thought ended and the call was forced after it


@pytest.mark.parametrize("name", ["smollm2", "qwen3-tiny"])
@pytest.mark.parametrize("opens", [False, True], ids=["answer", "may-open-thinking"])
def test_a_model_that_writes_only_blanks_gets_the_call_after_the_cap(name, opens):
    """Blank and empty-text tokens are kept before the call, at most MAX_LEADING_BLANKS of
    them; then the prefix is forced whatever is sampled (else a model writing newlines
    forever never calls), on the host and on the device alike."""
    tok = tokenizer(name)
    blank, _ = pools(name)
    fmt = tool_parsers.HermesFormat
    prefix = tok.encode(fmt.call_prefix, special=True)
    open_id, close_id = tok.encode("<think>", special=True), tok.encode("</think>", special=True)
    markers = (dict(open_id=open_id[0], close_id=close_id[0], may_open_thinking=True)
               if opens and len(open_id) == len(close_id) == 1 else {})
    if opens and not markers:
        pytest.skip("no one-token think markers")
    cap = ForcedToolCall.max_leading_blanks
    for seed in range(4):
        def sample(output, seed=seed):
            h = int(hashlib.sha256(repr((seed, tuple(output))).encode()).hexdigest(), 16)
            return blank[h % len(blank)]
        host, device, flags = both(name, lambda: make(name, fmt, **markers), seed,
                                   length=cap + len(prefix) + 2, sample=sample)
        assert device == host
        assert all(not tok.decode([t]).strip() for t in device[:cap])
        assert device[cap:cap + len(prefix)] == prefix and flags[cap]


def test_vocabulary_sized_sets_stay_compact():
    """Qwen3's 151,936 model rows for 151,669 tokens: the padded ids decode to nothing, so
    every name state keeps them; they are stored once (the shared set), not per node, and six
    long names fit a lane."""
    names = [f"tool_number_{i}_with_a_long_name" for i in range(6)]
    policy = make("qwen3-tiny", tool_parsers.HermesFormat, names=names)
    automaton = policy.automaton(151_936)
    assert len(automaton.shared) >= 151_936 - tokenizer("qwen3-tiny").vocab_size
    assert sum(node.shared for node in automaton.nodes) > 10
    assert DevicePolicy.compile(policy, 151_936) is not None
