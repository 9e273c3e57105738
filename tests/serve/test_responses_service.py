"""Responses flows over the real engine with a scripted fake model: aggregate, SSE, store."""
import json

import pytest

from ninfer_jax.errors import InvalidRequest, NotFound, QueueTimeout
from ninfer_jax.serve.responses.store import ResponseStore
from ninfer_jax.serve.responses.service import ResponsesService

from test_responses_fakes import MODEL_ID, make_context

TOOLS = [{"type": "namespace", "name": "mcp__weather", "description": "Weather",
          "tools": [{"type": "function", "name": "get_current",
                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}]
TOOL_REPLY = ('Need the weather.</think><tool_call>\n{"name": "mcp__weather.get_current", '
              '"arguments": {"city": "Paris"}}\n</tool_call>')


@pytest.fixture
def service_for():
    contexts = []

    def build(reply, store=None, **options):
        ctx = make_context(reply, **options)
        contexts.append(ctx)
        return ResponsesService(ctx, store or ResponseStore(16, 4))

    yield build
    for ctx in contexts:
        ctx.engine.shutdown()


def _create(service, **body):
    body.setdefault("model", MODEL_ID)
    body.setdefault("input", "Hi")
    return service.run_aggregate(service.start(body, "req-1"))


def _stream_events(service, **body):
    body.setdefault("model", MODEL_ID)
    body.setdefault("input", "Hi")
    raw = b"".join(service.run_stream(service.start(body, "req-1"))).decode()
    assert "[DONE]" not in raw
    events = []
    for frame in raw.strip().split("\n\n"):
        if frame.startswith(":"):
            continue
        name_line, data_line = frame.split("\n")
        event = json.loads(data_line[len("data: "):])
        assert name_line == f"event: {event['type']}"
        events.append(event)
    return events


def test_aggregate_plain_reply(service_for):
    service = service_for("Hello there.")
    response = _create(service, instructions="Be brief.", metadata={"k": "v"})
    assert response["status"] == "completed" and response["object"] == "response"
    (message,) = response["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == "Hello there."
    usage = response["usage"]
    rendered = service.ctx.renderer.conversations[-1]
    assert [m.role for m in rendered.messages] == ["developer", "user"]
    num_reply = len(service.ctx.tokenizer.encode("Hello there."))
    assert usage["output_tokens"] == num_reply + 1  # the withheld EOS counts
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert response["metadata"] == {"k": "v"} and response["max_output_tokens"] is None
    assert service.retrieve(response["id"], {}) == response


def test_reasoning_and_namespaced_tool_call(service_for):
    service = service_for(TOOL_REPLY)
    response = _create(service, tools=TOOLS, reasoning={"effort": "high"},
                       chat_template_kwargs={"enable_thinking": True})
    reasoning, call = response["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Need the weather."}]
    assert (call["namespace"], call["name"]) == ("mcp__weather", "get_current")
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert call["id"].startswith("fc_") and call["call_id"].startswith("call_")
    assert 0 < response["usage"]["output_tokens_details"]["reasoning_tokens"] \
        < response["usage"]["output_tokens"]
    # The next turn answers the call; the restored namespace renders the same identity.
    follow = _create(service, previous_response_id=response["id"], tools=TOOLS,
                     input=[{"type": "function_call_output", "call_id": call["call_id"],
                             "output": "sunny", "namespace": "mcp__weather"}])
    history = service.ctx.renderer.conversations[-1].messages
    assert [m.role for m in history] == ["user", "assistant", "tool"]
    assert history[1].tool_calls[0].namespace == "mcp__weather"
    assert follow["previous_response_id"] == response["id"]


def test_previous_response_id_renders_the_same_prompt_as_full_history(service_for):
    service = service_for("Four.")
    first = _create(service, input="What is 2+2?")
    chained = service.count_input_tokens({"model": MODEL_ID, "input": "And 3+3?",
                                          "previous_response_id": first["id"]})
    chained_text = service.ctx.renderer.conversations[-1]
    explicit_input = [{"role": "user", "content": "What is 2+2?"}, *first["output"],
                      {"role": "user", "content": "And 3+3?"}]
    explicit = service.count_input_tokens({"model": MODEL_ID, "input": explicit_input})
    assert chained == explicit and chained["object"] == "response.input_tokens"
    assert service.ctx.renderer.conversations[-1].messages == chained_text.messages
    second = _create(service, input="And 3+3?", previous_response_id=first["id"])
    assert second["usage"]["input_tokens"] == chained["input_tokens"]


def test_stream_lifecycle_and_sequence_numbers(service_for):
    service = service_for("Streamed reply.")
    events = _stream_events(service, store=True)
    types = [e["type"] for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert text == "Streamed reply." == final["output"][0]["content"][0]["text"]
    assert service.retrieve(final["id"], {})["status"] == "completed"


def test_stream_tool_call_arguments_events(service_for):
    service = service_for(TOOL_REPLY)
    events = _stream_events(service, tools=TOOLS, chat_template_kwargs={"enable_thinking": True})
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    final_call = events[-1]["response"]["output"][-1]
    assert "".join(d["delta"] for d in deltas) == done[0]["arguments"] == final_call["arguments"]
    assert deltas[0]["item_id"] == final_call["id"]


def test_max_output_tokens_gives_incomplete(service_for):
    service = service_for("A long reply that will be cut short.")
    response = _create(service, max_output_tokens=3)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"
    assert response["usage"]["output_tokens"] == 3 and response["completed_at"] is None


def test_store_false_and_store_endpoints(service_for):
    service = service_for("ok")
    unstored = _create(service, store=False)
    with pytest.raises(NotFound):
        service.retrieve(unstored["id"], {})
    with pytest.raises(NotFound) as info:
        _create(service, previous_response_id=unstored["id"])
    assert info.value.param == "previous_response_id"
    stored = _create(service, input=[{"role": "user", "content": f"m{n}", "id": f"msg_{n}"}
                                     for n in range(5)])
    page = service.list_input_items(stored["id"], {"limit": "2", "order": "asc"})
    assert [i["id"] for i in page["data"]] == ["msg_0", "msg_1"] and page["has_more"]
    page = service.list_input_items(stored["id"], {"after": "msg_1", "order": "asc"})
    assert [i["id"] for i in page["data"]] == ["msg_2", "msg_3", "msg_4"]
    assert service.list_input_items(stored["id"], {})["data"][0]["id"] == "msg_4"  # desc default
    for query, param in (({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"),
                         ({"order": "up"}, "order"), ({"limit": "x"}, "limit")):
        with pytest.raises(InvalidRequest) as info:
            service.list_input_items(stored["id"], query)
        assert info.value.param == param
    with pytest.raises(InvalidRequest) as info:
        service.retrieve(stored["id"], {"stream": "true"})
    assert info.value.param == "stream"
    assert service.delete(stored["id"]) == {"id": stored["id"], "object": "response.deleted",
                                            "deleted": True}
    with pytest.raises(NotFound):
        service.retrieve(stored["id"], {})


def test_store_capacity_exceeded(service_for):
    store = ResponseStore(16, 1)
    service = service_for("ok", store=store)
    store.max_bytes = 300  # smaller than any response envelope
    with pytest.raises(InvalidRequest) as info:
        _create(service)
    assert info.value.code == "response_store_capacity_exceeded"
    events = _stream_events(service)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "response_store_capacity_exceeded"
    assert _create(service, store=False)["status"] == "completed"
    empty = service_for("ok", store=ResponseStore(0, 1))
    with pytest.raises(InvalidRequest) as info:
        _create(empty)
    assert info.value.code == "response_store_capacity_exceeded"


def test_engine_failure_after_stream_start_is_response_failed(service_for):
    service = service_for("one two three four five six seven", fail_at_step=4)
    events = _stream_events(service)
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "engine_unavailable"
    assert sum(e["type"].startswith("response.completed") for e in events) == 0


def test_queue_timeout_before_admission_is_an_http_error(service_for):
    service = service_for("x " * 200, decode_sleep=0.01, pending_timeout_ms=300)
    busy = service.start({"model": MODEL_ID, "input": "first"}, "req-a")
    try:
        with pytest.raises(QueueTimeout):
            service.start({"model": MODEL_ID, "input": "second"}, "req-b")
    finally:
        busy.handle.cancel()


def test_client_disconnect_cancels_and_stores_cancelled(service_for):
    service = service_for("word " * 300, decode_sleep=0.01)
    run = service.start({"model": MODEL_ID, "input": "go"}, "req-1")
    frames = service.run_stream(run)
    next(frames)  # created + in_progress
    frames.close()  # the client went away
    stored = service.retrieve(run.builder.response["id"], {})
    assert stored["status"] == "cancelled"
    assert stored["usage"]["output_tokens"] < 301
