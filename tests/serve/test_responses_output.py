"""Response Items, usage and the SSE event lifecycle built from neutral output pieces."""
import json

from ninfer_jax.serve.responses.output import ResponseBuilder, usage_object
from ninfer_jax.serve.wire.sse import sse_frame


def _builder():
    builder = ResponseBuilder({"id": "resp_1", "object": "response", "model": "m"})
    builder.start()
    return builder


def _replay(events):
    """Rebuild the output Items from the events alone, the way a streaming client does."""
    items = {}
    for event in events:
        kind = event["type"]
        if kind == "response.output_item.added":
            items[event["output_index"]] = json.loads(json.dumps(event["item"]))
        elif kind == "response.content_part.added":
            items[event["output_index"]]["content"].append(dict(event["part"]))
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            items[event["output_index"]]["content"][event["content_index"]]["text"] += event["delta"]
        elif kind == "response.function_call_arguments.delta":
            items[event["output_index"]]["arguments"] += event["delta"]
        elif kind == "response.output_item.done":
            items[event["output_index"]]["status"] = event["item"]["status"]
    return [items[n] for n in sorted(items)]


def test_full_lifecycle_reasoning_text_and_tool_call():
    builder = _builder()
    builder.reasoning("Let me ")
    builder.reasoning("think.")
    builder.content("Hello")
    builder.content(" world")
    builder.tool_call("get_current", '{"city": "Paris"}', namespace="mcp__weather")
    usage = usage_object(10, 4, 7, 3)
    final = builder.finish("completed", usage)
    events = builder.take_events()
    types = [e["type"] for e in events]
    assert types == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    reasoning, message, call = final["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert reasoning["summary"] == [] and reasoning["id"].startswith("rs_")
    assert message["content"][0]["text"] == "Hello world" and message["role"] == "assistant"
    assert call["id"].startswith("fc_") and call["call_id"].startswith("call_")
    assert (call["namespace"], call["name"], call["arguments"]) == (
        "mcp__weather", "get_current", '{"city": "Paris"}')
    assert _replay(events) == final["output"]
    assert final["status"] == "completed" and final["completed_at"] is not None
    assert final["usage"]["total_tokens"] == 17
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 4}
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}
    assert events[-1]["response"] == final
    # The created snapshot does not see later mutation.
    assert events[0]["response"]["output"] == [] and events[0]["response"]["status"] == "in_progress"


def test_incomplete_reasoning_only_has_no_invented_message():
    builder = _builder()
    builder.reasoning("partial")
    builder.content("")
    final = builder.finish("incomplete", usage_object(1, 0, 5, 5),
                           incomplete_reason="max_output_tokens")
    assert [item["type"] for item in final["output"]] == ["reasoning"]
    assert final["output"][0]["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["completed_at"] is None
    assert builder.take_events()[-1]["type"] == "response.incomplete"


def test_failed_after_start_closes_items():
    builder = _builder()
    builder.content("x")
    error = {"code": "engine_unavailable", "message": "boom"}
    final = builder.fail(error)
    events = builder.take_events()
    assert events[-1]["type"] == "response.failed"
    assert final["status"] == "failed" and final["error"] == error
    assert sum(e["type"] == "response.output_item.done" for e in events) == 1


def test_sse_frame_names_event_after_type():
    frame = sse_frame({"type": "response.output_text.delta", "sequence_number": 3, "delta": "é"})
    name, data, blank = frame.decode().split("\n", 2)
    assert name == "event: response.output_text.delta"
    assert json.loads(data[len("data: "):])["delta"] == "é"
    assert blank == "\n"


def test_openai_sdk_stream_state_accepts_the_events():
    from openai import omit
    from openai._models import construct_type
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    builder = _builder()
    builder.reasoning("r")
    builder.content("Hello")
    builder.tool_call("f", '{"a": 1}')
    final = builder.finish("completed", usage_object(3, 0, 4, 1))
    state = ResponseStreamState(text_format=omit, input_tools=omit)
    for event in builder.take_events():
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=event))
    completed = state._completed_response
    assert completed.output_text == "Hello"
    assert [item.type for item in completed.output] == ["reasoning", "message", "function_call"]
    assert completed.output[2].call_id == final["output"][2]["call_id"]
