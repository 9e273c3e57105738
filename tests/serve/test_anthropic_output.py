"""Anthropic aggregate Message and SSE block lifecycle, checked with the SDK's accumulator."""
import json

from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from anthropic._models import construct_type

from ninfer_jax.serve.anthropic.output import (
    MessageBuilder, thinking_signature, usage_object)
from ninfer_jax.serve.wire.sse import sse_frame


def _sdk_snapshot(events):
    snapshot, buffers = None, {}
    for event in events:
        if event["type"] in ("ping", "error"):
            continue
        parsed = construct_type(type_=RawMessageStreamEvent, value=event)
        snapshot = accumulate_event(event=parsed, current_snapshot=snapshot, json_bufs=buffers)
    return snapshot


def test_lifecycle_thinking_text_tool_use():
    builder = MessageBuilder("label")
    builder.start(prompt_tokens=30, cached_tokens=12)
    builder.thinking("Let me ")
    builder.thinking("see.")
    builder.text("Checking")
    builder.tool_use("get_weather", '{"city": "Paris", "units": "c"}')
    usage = usage_object(30, 12, 9)
    message = builder.finish("tool_use", usage)
    events = builder.take_events()
    assert [e["type"] for e in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    assert events[6 - 1]["delta"]["type"] == "signature_delta"
    thinking, text, tool = message["content"]
    assert thinking == {"type": "thinking", "thinking": "Let me see.",
                        "signature": thinking_signature("Let me see.")}
    assert text == {"type": "text", "text": "Checking"}
    assert tool["id"].startswith("toolu_") and list(tool["input"]) == ["city", "units"]
    assert message["usage"] == {"input_tokens": 18, "cache_creation_input_tokens": None,
                                "cache_read_input_tokens": 12, "output_tokens": 9}
    assert events[0]["message"]["usage"]["output_tokens"] == 0
    assert events[0]["message"]["content"] == []

    snapshot = _sdk_snapshot(events)
    assert snapshot.stop_reason == "tool_use"
    assert snapshot.content[0].thinking == "Let me see."
    assert snapshot.content[0].signature == thinking["signature"]
    assert snapshot.content[1].text == "Checking"
    assert snapshot.content[2].input == {"city": "Paris", "units": "c"}
    assert snapshot.usage.output_tokens == 9 and snapshot.usage.cache_read_input_tokens == 12


def test_stop_sequence_reported():
    builder = MessageBuilder("m")
    builder.start(5, 0)
    builder.text("abc")
    message = builder.finish("stop_sequence", usage_object(5, 0, 3), stop_sequence="END")
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    delta = builder.take_events()[-2]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_error_event_and_frame():
    builder = MessageBuilder("m")
    builder.start(1, 0)
    builder.fail({"type": "error", "error": {"type": "overloaded_error", "message": "x"},
                  "request_id": "r"})
    event = builder.take_events()[-1]
    assert event == {"type": "error", "error": {"type": "overloaded_error", "message": "x"},
                     "request_id": "r"}
    frame = sse_frame(event).decode()
    assert frame.startswith("event: error\ndata: ") and frame.endswith("\n\n")
    assert json.loads(frame.split("data: ", 1)[1])["error"]["type"] == "overloaded_error"


def test_non_finite_tool_arguments_become_null_in_valid_json():
    builder = MessageBuilder("label")
    builder.start(prompt_tokens=3, cached_tokens=0)
    builder.tool_use("f", '{"x": NaN, "y": [Infinity, 1e999, 2.5]}')
    message = builder.finish("tool_use", usage_object(3, 0, 1))
    events = builder.take_events()
    block = message["content"][0]
    assert block["input"] == {"x": None, "y": [None, None, 2.5]}
    json.dumps(message, allow_nan=False)  # would raise on a NaN left behind
    for event in events:
        json.dumps(event, allow_nan=False)
    deltas = [e["delta"]["partial_json"] for e in events
              if e["type"] == "content_block_delta"]
    assert json.loads("".join(deltas), parse_constant=lambda c: 1 / 0) == block["input"]
