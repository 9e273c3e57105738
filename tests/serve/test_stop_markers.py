"""Stop strings never cut inside a marker the output parser consumes (reasoning markers,
tool-call openers and closers, Gemma 4's thought channel), on the real Qwen3 and Gemma-4-style
tokenizers and templates (scripted fake model). A match that starts or ends inside a marker
is no match, so the client never gets a piece of markup ("<t" of "<think>") as text; a match
in the reasoning or answer text, or one that holds a whole marker, stops the reply as it
always did, in Chat and Anthropic Messages, streamed or not."""
import json

import pytest
from falcon import testing

from harness import RandomQwen, build_harness
from sse_util import sse_chunks, streamed_text

QWEN_REPLY = "<think>\nI think hard.\n</think>\n\nAnswer here."
GEMMA_REPLY = "<|channel>thought\nI thought hard.<channel|>Answer here."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
FULL = ("I think hard.", "Answer here.", "stop")


@pytest.fixture(scope="module")
def h3(qwen3):
    h = build_harness(qwen3, max_context=512)
    h.book.add("reply", QWEN_REPLY)
    h.book.add("call", CALL)
    yield h
    h.close()


@pytest.fixture(scope="module")
def gemma():
    h = build_harness(RandomQwen.build("gemma4-tiny"), max_context=512)
    h.book.add("reply", GEMMA_REPLY)
    yield h
    h.close()


def chat(h, key, stream=False, **fields):
    body = {"model": h.ctx.model_id, "messages": [{"role": "user", "content": f"SCRIPT:{key}"}],
            "max_tokens": 64, "stream": stream, **fields}
    return testing.TestClient(h.app).simulate_post("/v1/chat/completions", json=body)


def chat_reply(h, key, **fields) -> tuple[str, str, str]:
    """(reasoning, content, finish_reason), checked equal streamed and not."""
    choice = chat(h, key, **fields).json["choices"][0]
    whole = (choice["message"].get("reasoning_content") or "", choice["message"]["content"] or "",
             choice["finish_reason"])
    chunks = sse_chunks(chat(h, key, stream=True, **fields).text)[0]
    finish = [c["choices"][0]["finish_reason"] for c in chunks
              if c.get("choices") and c["choices"][0]["finish_reason"]]
    assert (streamed_text(chunks, "reasoning_content"), streamed_text(chunks), finish[-1]) == whole
    return whole


@pytest.mark.parametrize("stop, expected", [
    ("hin", ("I t", "", "stop")),  # "<think>" holds "hin" too: the reasoning's "think" matches
    ("/thi", FULL),  # only inside "</think>": no match
    ("k>\n\nAns", FULL),  # ends inside the answer, starts inside "</think>"
    ("</think>", ("I think hard.", "", "stop")),  # a whole marker is a stop like any text
    ("hard", ("I think", "", "stop")),  # in the reasoning, as before
    ("swer", ("I think hard.", "An", "stop")),  # in the answer, as before
])
def test_qwen_think_markers_are_atomic_for_stop_strings(h3, stop, expected):
    assert chat_reply(h3, "reply", stop=[stop]) == expected


@pytest.mark.parametrize("stop, expected", [
    # The first "hough" is the marker's "thought": skipped, the reasoning's one matches.
    ("hough", ("I t", "", "stop")),
    ("chan", ("I thought hard.", "Answer here.", "stop")),
    ("nnel|>Ans", ("I thought hard.", "Answer here.", "stop")),
    ("<|channel>thought", ("", "", "stop")),
    ("hard", ("I thought", "", "stop")),
])
def test_gemma_thought_channel_is_atomic_for_stop_strings(gemma, stop, expected):
    assert chat_reply(gemma, "reply", stop=[stop]) == expected


def test_a_stop_inside_the_tool_call_markers_leaves_the_call_whole(h3):
    for stream in (False, True):
        response = chat(h3, "call", stream=stream, tools=TOOLS, stop=["tool_", "l>"])
        if stream:
            chunks = sse_chunks(response.text)[0]
            calls = [c for ch in chunks if ch.get("choices")
                     for c in ch["choices"][0]["delta"].get("tool_calls") or []]
            assert calls[0]["function"]["name"] == "get_weather"
            assert json.loads("".join(c["function"].get("arguments") or "" for c in calls)) \
                == {"city": "Rome"}
            assert streamed_text(chunks) == ""
            assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        else:
            choice = response.json["choices"][0]
            (call,) = choice["message"]["tool_calls"]
            assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}
            assert not choice["message"]["content"]
            assert choice["finish_reason"] == "tool_calls"


def messages(h, key, stop_sequences, stream=False):
    body = {"model": "m", "max_tokens": 64, "stream": stream, "stop_sequences": stop_sequences,
            "messages": [{"role": "user", "content": f"SCRIPT:{key}"}]}
    return testing.TestClient(h.app).simulate_post("/v1/messages", json=body)


@pytest.mark.parametrize("stop, blocks, stop_reason", [
    ("hin", [("thinking", "I t")], ("stop_sequence", "hin")),
    ("/thi", [("thinking", "I think hard."), ("text", "Answer here.")], ("end_turn", None)),
    ("swer", [("thinking", "I think hard."), ("text", "An")], ("stop_sequence", "swer")),
])
def test_anthropic_stop_sequences_skip_the_think_markers(h3, stop, blocks, stop_reason):
    body = messages(h3, "reply", [stop]).json
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in body["content"]] == blocks
    assert (body["stop_reason"], body["stop_sequence"]) == stop_reason
    events = sse_chunks(messages(h3, "reply", [stop], stream=True).text)[0]
    streamed = {}
    for event in events:
        if event["type"] == "content_block_start":
            streamed[event["index"]] = [event["content_block"]["type"], ""]
        elif event["type"] == "content_block_delta" and event["delta"]["type"] != "signature_delta":
            streamed[event["index"]][1] += event["delta"].get("thinking", event["delta"].get("text"))
    assert [tuple(v) for _, v in sorted(streamed.items())] == blocks
    delta = next(e for e in events if e["type"] == "message_delta")["delta"]
    assert (delta["stop_reason"], delta["stop_sequence"]) == stop_reason


def test_a_match_decided_after_its_token_counts_through_that_token(h3):
    # " <" may begin "<think>" or "<tool_call>": the stop "<" waits for "b", which shows it
    # is text; usage still ends at the token that completed the match, as for any stop.
    ids = h3.book.add("lt", "Try a <b> now.")
    through = next(i + 1 for i in range(len(ids)) if "<" in h3.ctx.tokenizer.decode(ids[:i + 1]))
    assert through < len(ids) - 1  # the deciding token and more come after it
    for fields in ({}, {"tools": TOOLS}):
        body = chat(h3, "lt", stop=["<"], **fields).json
        choice = body["choices"][0]
        assert (choice["message"]["content"], choice["finish_reason"]) == ("Try a ", "stop")
        assert body["usage"]["completion_tokens"] == through
