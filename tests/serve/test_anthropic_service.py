"""Anthropic Messages flows over the real engine with a scripted fake model."""
import json

import pytest
from anthropic._models import construct_type
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent

from ninfer_jax.errors import InvalidRequest, QueueTimeout, Unsupported
from ninfer_jax.serve.anthropic.output import thinking_signature
from ninfer_jax.serve.anthropic.service import MessagesService

from test_responses_fakes import make_context

TOOL = {"name": "get_weather", "description": "Weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture
def service_for():
    contexts = []

    def build(reply, **options):
        ctx = make_context(reply, **options)
        contexts.append(ctx)
        return MessagesService(ctx)

    yield build
    for ctx in contexts:
        ctx.engine.shutdown()


def _body(**body):
    body.setdefault("model", "claude-local")
    body.setdefault("max_tokens", 256)
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return body


def _create(service, **body):
    return service.run_aggregate(service.start(_body(**body), "req-1"))


def _stream(service, **body):
    raw = b"".join(service.run_stream(service.start(_body(**body), "req-1"))).decode()
    events = []
    for frame in raw.strip().split("\n\n"):
        name_line, data_line = frame.split("\n")
        event = json.loads(data_line[len("data: "):])
        assert name_line == f"event: {event['type']}"
        events.append(event)
    return events


def test_plain_message_and_count_tokens_agree(service_for):
    service = service_for("Hello there.")
    message = _create(service, system="Be kind.", metadata={"user_id": "u"})
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["model"] == "claude-local"
    assert message["content"] == [{"type": "text", "text": "Hello there."}]
    assert message["stop_reason"] == "end_turn" and message["stop_sequence"] is None
    usage = message["usage"]
    counted = service.count_tokens(_body(system="Be kind.", temperature=0.3, stream=True))
    assert counted == {"input_tokens": usage["input_tokens"] + usage["cache_read_input_tokens"]}
    assert usage["output_tokens"] == len(service.ctx.tokenizer.encode("Hello there.")) + 1


def test_thinking_with_signature(service_for):
    service = service_for("Let me think.</think>Answer.")
    message = _create(service, thinking={"type": "adaptive"})
    thinking, text = message["content"]
    assert thinking == {"type": "thinking", "thinking": "Let me think.",
                        "signature": thinking_signature("Let me think.")}
    assert text == {"type": "text", "text": "Answer."}
    # Replaying the history (signature included) lowers the visible thinking text.
    service.count_tokens(_body(messages=[{"role": "user", "content": "Hi"},
                                         {"role": "assistant", "content": message["content"]},
                                         {"role": "user", "content": "More"}]))
    replayed = service.ctx.renderer.conversations[-1].messages[1]
    assert replayed.reasoning == "Let me think." and replayed.content == "Answer."


def test_enabled_thinking_budget_reaches_the_engine_policy(service_for):
    # The fake tokenizer spells </think> with several tokens, so the budget policy (which
    # inserts a single close token) refuses it, naming the Anthropic field: proof that the
    # budget was handed to generation. Real budgets are exercised end to end on Qwen.
    service = service_for("x")
    with pytest.raises(InvalidRequest) as info:
        service.start(_body(max_tokens=1500, thinking={"type": "enabled", "budget_tokens": 1024}),
                      "r")
    assert info.value.param == "thinking.budget_tokens"
    assert service.start(_body(thinking={"type": "disabled"}), "r2").handle is not None


def test_stop_sequence_reported_with_exact_usage(service_for):
    service = service_for("Hello END world and more")
    message = _create(service, stop_sequences=["END"])
    assert message["stop_reason"] == "stop_sequence" and message["stop_sequence"] == "END"
    assert message["content"][0]["text"] == "Hello "
    tokens = service.ctx.tokenizer.encode("Hello END")
    assert message["usage"]["output_tokens"] == len(tokens)


def test_max_tokens_and_context_window(service_for):
    service = service_for("one two three four five six seven eight")
    assert _create(service, max_tokens=2)["stop_reason"] == "max_tokens"
    small = service_for("word " * 60, max_context=40)
    message = _create(small, max_tokens=None)
    assert message["stop_reason"] == "model_context_window_exceeded"
    # An explicit max_tokens that exactly fills the context was itself reached: the
    # client's own limit is the stop reason, as when it ends short of the context.
    prompt = small.count_tokens(_body())["input_tokens"]
    message = _create(small, max_tokens=40 - prompt)
    assert message["usage"]["output_tokens"] == 40 - prompt
    assert message["stop_reason"] == "max_tokens"


def test_context_clearing_is_refused_only_where_a_prompt_can_reach_it(service_for):
    """Clearing is not implemented: an edit whose trigger lies inside the context window is a
    400 on it, one beyond the window can never fire and the request runs unchanged."""
    service = service_for("Hello there.", max_context=512)
    reachable = {"edits": [{"type": "clear_tool_uses_20250919",
                            "trigger": {"type": "input_tokens", "value": 100}}]}
    with pytest.raises(Unsupported) as info:
        _create(service, context_management=reachable)
    assert info.value.param == "context_management.edits" and "100" in info.value.message
    beyond = {"edits": [{"type": "clear_tool_uses_20250919",
                         "trigger": {"type": "input_tokens", "value": 512}}]}
    message = _create(service, context_management=beyond)
    assert message["content"] == [{"type": "text", "text": "Hello there."}]


def test_tool_use_output(service_for):
    service = service_for('<tool_call>\n{"name": "get_weather", "arguments": '
                          '{"city": "Paris"}}\n</tool_call>')
    message = _create(service, tools=[TOOL])
    (tool_use,) = message["content"]
    assert tool_use["type"] == "tool_use" and tool_use["name"] == "get_weather"
    assert tool_use["input"] == {"city": "Paris"} and tool_use["id"].startswith("toolu_")
    assert message["stop_reason"] == "tool_use"
    # With tool_choice none the same markup is plain text.
    message = _create(service, tools=[TOOL], tool_choice={"type": "none"})
    assert message["content"][0]["type"] == "text" and message["stop_reason"] == "end_turn"


def test_assistant_prefill_continues(service_for):
    service = service_for(" 4.")
    message = _create(service, messages=[{"role": "user", "content": "2+2?"},
                                         {"role": "assistant", "content": "The answer is"}])
    assert message["content"] == [{"type": "text", "text": " 4."}]
    rendered = service.ctx.renderer.conversations[-1]
    assert rendered.options.continue_final_message


def test_stream_lifecycle_matches_aggregate(service_for):
    service = service_for("Thinking here.</think>Final text.")
    body = dict(thinking={"type": "adaptive"})
    events = _stream(service, **body)
    types = [e["type"] for e in events]
    assert types[:2] == ["message_start", "ping"]
    assert types[-2:] == ["message_delta", "message_stop"]
    signature_at = types.index("content_block_stop") - 1
    assert events[signature_at]["delta"]["type"] == "signature_delta"
    snapshot = None
    for event in events:
        if event["type"] != "ping":
            snapshot = accumulate_event(event=construct_type(type_=RawMessageStreamEvent,
                                                             value=event),
                                        current_snapshot=snapshot, json_bufs={})
    aggregate = _create(service, **body)
    assert [b.type for b in snapshot.content] == ["thinking", "text"]
    assert snapshot.content[0].thinking == aggregate["content"][0]["thinking"]
    assert snapshot.content[1].text == aggregate["content"][1]["text"] == "Final text."
    assert snapshot.usage.output_tokens == aggregate["usage"]["output_tokens"]
    start_usage = events[0]["message"]["usage"]
    assert start_usage["input_tokens"] + start_usage["cache_read_input_tokens"] == (
        aggregate["usage"]["input_tokens"] + aggregate["usage"]["cache_read_input_tokens"])


def test_error_after_stream_start_is_error_event(service_for):
    service = service_for("a b c d e f g h i j", fail_at_step=4)
    events = _stream(service)
    assert events[0]["type"] == "message_start"
    assert events[-1] == {"type": "error", "error": {"type": "api_error",
                                                     "message": events[-1]["error"]["message"]},
                          "request_id": "req_req-1"}  # as the non-streamed body spells it


def test_preparation_errors_are_raised(service_for):
    service = service_for("x " * 100, decode_sleep=0.01, pending_timeout_ms=300)
    with pytest.raises(InvalidRequest) as info:
        service.start(_body(max_tokens=0), "r")
    assert info.value.param == "max_tokens"
    busy = service.start(_body(), "req-a")
    try:
        with pytest.raises(QueueTimeout):
            service.start(_body(), "req-b")
    finally:
        busy.handle.cancel()


def test_enabled_thinking_on_a_model_without_thinking_is_refused(service_for):
    service = service_for("Plain answer.", chat_format={"tool_call_format": "hermes"})
    thinking = {"type": "enabled", "budget_tokens": 1024}
    for call in (lambda: service.start(_body(thinking=thinking, max_tokens=1100), "req-1"),
                 lambda: service.count_tokens(_body(thinking=thinking, max_tokens=1100))):
        with pytest.raises(Unsupported) as info:
            call()
        assert info.value.param == "thinking.type"
    # Adaptive leaves the choice to the model, and disabled asks for nothing: both run.
    for mode in ("adaptive", "disabled"):
        message = _create(service, thinking={"type": mode})
        assert message["content"] == [{"type": "text", "text": "Plain answer."}]
