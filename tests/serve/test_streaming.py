"""SSE framing, keep-alive heartbeats, errors after the stream opened, and cancellation of
the engine request when the client goes away."""
import json
import threading
import time

import pytest
from falcon import testing

from harness import build_harness, wait_for
from ninfer_jax.engine.request import GenerationRequest, RequestHandle, SamplingParams
from ninfer_jax.errors import QueueTimeout
from ninfer_jax.serve.core.output import HEARTBEAT
from ninfer_jax.serve.wire.sse import (KEEPALIVE, KEEPALIVE_SECONDS, builder_frames,
                                       openai_event_stream)


def test_framing_heartbeat_and_done():
    closed = []
    body = b"".join(openai_event_stream([{"a": 1}, HEARTBEAT, {"b": "é"}],
                                        lambda: closed.append(True)))
    assert body == (b'data: {"a": 1}\n\n: keep-alive\n\n'
                    + 'data: {"b": "é"}\n\n'.encode() + b"data: [DONE]\n\n")
    assert closed == [True]


def test_error_after_open_is_an_error_event_then_done():
    def chunks():
        yield {"first": True}
        raise QueueTimeout("not admitted in time")

    failures = []
    events = b"".join(openai_event_stream(chunks(), lambda: None, "r1",
                                          failures.append)).split(b"\n\n")
    error = json.loads(events[1][len(b"data: "):])
    assert error["error"]["code"] == "request_queue_timeout"
    assert events[2] == b"data: [DONE]"
    assert [type(f) for f in failures] == [QueueTimeout]  # the assembler decides what counts


def test_an_unexpected_error_after_open_is_a_generic_500_event_handed_to_on_failure():
    def chunks():
        yield {"first": True}
        raise KeyError("secret detail")

    failures = []
    events = b"".join(openai_event_stream(chunks(), lambda: None, "r1",
                                          failures.append)).split(b"\n\n")
    error = json.loads(events[1][len(b"data: "):])
    assert error["error"]["code"] == "internal_error" and "secret" not in error["error"]["message"]
    assert [type(f) for f in failures] == [KeyError]


def test_closing_the_stream_early_runs_on_close():
    closed = []
    stream = openai_event_stream(iter([{"x": i} for i in range(5)]), lambda: closed.append(1))
    next(stream)
    stream.close()
    assert closed == [1]


def test_assembler_yields_heartbeats_while_waiting(harness):
    from ninfer_jax.serve.core.generation import OutputPlan, PreparedGeneration
    from ninfer_jax.serve.core.output import OutputAssembler

    request = GenerationRequest("r", [1, 2], SamplingParams(), 4)
    prepared = PreparedGeneration(request, OutputPlan(), None, False, None)
    assembler = OutputAssembler(RequestHandle(request), prepared, harness.ctx.new_detokenizer())
    assert next(assembler.stream(heartbeat_s=0.01)) is HEARTBEAT


@pytest.fixture(scope="module")
def slow(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, decode_sleep=0.02)
    h.book.add("ramble", "la", end=False)
    yield h
    h.close()


def test_client_disconnect_cancels_the_request(slow):
    body = json.dumps({"model": "smollm2-135m-instruct", "stream": True, "max_tokens": 400,
                       "messages": [{"role": "user", "content": "SCRIPT:ramble"}]})
    environ = testing.create_environ(method="POST", path="/v1/chat/completions", body=body,
                                     headers={"Content-Type": "application/json"})
    started = []
    result = slow.app(environ, lambda status, headers, exc_info=None: started.append(status))
    stream = iter(result)
    assert next(stream).startswith(b"data: ")  # the role chunk
    assert b"la" in next(stream)  # generation is running
    before = slow.engine.stats().requests["cancelled"]
    result.close()  # what the WSGI server does when the client has gone
    assert wait_for(lambda: slow.engine.stats().requests["cancelled"] == before + 1)
    assert wait_for(lambda: slow.engine.stats().running == 0)
    assert slow.engine.stats().generation_tokens < 400
    assert started == ["200 OK"]


def test_heartbeat_while_tokens_arrive_but_stay_held(harness):
    from ninfer_jax.engine.request import Finished, Tokens, Usage
    from ninfer_jax.serve.core.generation import OutputPlan, PreparedGeneration
    from ninfer_jax.serve.core.output import OutputAssembler
    from ninfer_jax.text.conversation import ToolSpec
    from ninfer_jax.text.tool_parsers import tool_format

    tokenizer = harness.ctx.tokenizer
    ids = tokenizer.encode('<tool_call>\n{"name": "f", "arguments": {"a": "' + "x" * 40)
    request = GenerationRequest("r", [1, 2], SamplingParams(), 100)
    plan = OutputPlan(tool_format=tool_format("hermes", [ToolSpec("f")]))
    handle = RequestHandle(request)
    assembler = OutputAssembler(handle, PreparedGeneration(request, plan, None, False, None),
                                harness.ctx.new_detokenizer())

    def produce():
        for index, token in enumerate(ids):
            handle.publish(Tokens((token,), index + 1, time.monotonic()))
            time.sleep(0.01)
        handle.publish(Finished("length", Usage(2, 0, len(ids)), tuple(ids), {}, {},
                                time.monotonic()))

    producer = threading.Thread(target=produce)
    producer.start()
    items = list(assembler.stream(heartbeat_s=0.05))
    producer.join()
    assert any(item is HEARTBEAT for item in items)
    assert all(item is HEARTBEAT for item in items[:-1])  # nothing visible until the end


def test_builder_frames_feed_deltas_frame_new_events_and_keep_alive():
    class QuietAssembler:
        def stream(self, heartbeat_s=None):
            assert heartbeat_s == KEEPALIVE_SECONDS
            yield from ("a", HEARTBEAT, "b")

    fed, pending = [], []

    def feed(delta):
        fed.append(delta)
        if delta == "b":  # "a" makes no event: nothing is written for it
            pending.append({"type": "text_delta", "text": delta})

    def take_events():
        events = list(pending)
        pending.clear()
        return events

    frames = list(builder_frames(QuietAssembler(), feed, take_events))
    assert fed == ["a", "b"]
    assert frames == [KEEPALIVE,
                      b'event: text_delta\ndata: {"type":"text_delta","text":"b"}\n\n']
