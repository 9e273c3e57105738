"""/v1/messages* through the real anthropic SDK (WSGI transport) over the fake-model harness."""
import anthropic
import httpx2
import pytest

from harness import build_harness
from test_responses_api import CHAT_FORMAT, TEMPLATE

TOOL = {"name": "get_weather", "description": "Weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def _client(app, api_key="unused"):
    http = httpx2.Client(transport=httpx2.WSGITransport(app=app))
    return anthropic.Anthropic(base_url="http://ninfer.test", api_key=api_key, http_client=http,
                               max_retries=0)


@pytest.fixture(scope="module")
def harness(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, chat_format=CHAT_FORMAT,
                      template=TEMPLATE, max_context=1024, api_key="sekrit")
    h.book.add("hello", "Hello there!")
    h.book.add("think", "<think>Consider it.</think>The answer.")
    h.book.add("tool", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}'
                       '\n</tool_call>')
    h.book.add("stop", "alpha beta STOP gamma")
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(harness):
    return _client(harness.app, api_key="sekrit")


def test_create_and_request_id(client):
    raw = client.messages.with_raw_response.create(
        model="whatever-label", max_tokens=64, system="Be kind.",
        messages=[{"role": "user", "content": "SCRIPT:hello"}], metadata={"user_id": "u1"})
    assert raw.headers["request-id"].startswith("req_")
    message = raw.parse()
    assert message.model == "whatever-label"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Hello there!" and message.stop_reason == "end_turn"
    counted = client.messages.count_tokens(model="x", system="Be kind.",
                                           messages=[{"role": "user", "content": "SCRIPT:hello"}])
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens


def test_stream_thinking_text_with_signature(client):
    with client.messages.stream(model="m", max_tokens=64, thinking={"type": "adaptive"},
                                messages=[{"role": "user", "content": "SCRIPT:think"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    thinking, text = final.content
    assert thinking.thinking == "Consider it." and thinking.signature
    assert text.text == "The answer."
    # The history (with the opaque signature) is accepted back as-is.
    follow = client.messages.create(model="m", max_tokens=64, messages=[
        {"role": "user", "content": "SCRIPT:think"},
        {"role": "assistant", "content": [block.model_dump() for block in final.content]},
        {"role": "user", "content": "SCRIPT:hello"}])
    assert follow.content[0].text == "Hello there!"


def test_tool_use_round_trip(client):
    message = client.messages.create(model="m", max_tokens=64, tools=[TOOL],
                                     messages=[{"role": "user", "content": "SCRIPT:tool"}])
    (tool_use,) = message.content
    assert message.stop_reason == "tool_use" and tool_use.input == {"city": "Rome"}
    with client.messages.stream(model="m", max_tokens=64, tools=[TOOL],
                                messages=[{"role": "user", "content": "SCRIPT:tool"}]) as stream:
        final = stream.get_final_message()
    assert final.content[0].input == {"city": "Rome"}
    reply = client.messages.create(model="m", max_tokens=64, tools=[TOOL], messages=[
        {"role": "user", "content": "SCRIPT:tool"},
        {"role": "assistant", "content": [tool_use.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id,
                                      "content": "warm"}, {"type": "text", "text": "SCRIPT:hello"}]}])
    assert reply.content[0].text == "Hello there!"


def test_forced_tool_choice(client, harness, default_tokenizer):
    # The model "wants" to answer in prose: its first answer token is replaced by the call
    # opener (the format's text before a tool name). The fake model's token i is script[i]
    # whatever was forced, so the script continues after the forced prefix with the name and
    # the arguments.
    encode = default_tokenizer.encode
    prefix = encode('<tool_call>\n{"name": "')
    harness.book.scripts["forced"] = (encode("Sure")[:1] * len(prefix) + encode(
        'get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
        + [default_tokenizer.eos_ids[0]])
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        message = client.messages.create(model="m", max_tokens=64, tools=[TOOL],
                                         tool_choice=choice,
                                         messages=[{"role": "user", "content": "SCRIPT:forced"}])
        assert message.stop_reason == "tool_use"
        assert [(b.type, b.name, b.input) for b in message.content] == [
            ("tool_use", "get_weather", {"city": "Oslo"})]
    auto = client.messages.create(model="m", max_tokens=64, tools=[TOOL],
                                  messages=[{"role": "user", "content": "SCRIPT:forced"}])
    assert auto.stop_reason == "end_turn" and auto.content[0].type == "text"


def test_stop_sequence(client):
    message = client.messages.create(model="m", max_tokens=64, stop_sequences=["STOP"],
                                     messages=[{"role": "user", "content": "SCRIPT:stop"}])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "STOP"
    assert message.content[0].text == "alpha beta "


@pytest.mark.parametrize("fields, status, kind", [
    ({"max_tokens": 0}, 400, "invalid_request_error"),
    ({"thinking": {"type": "enabled", "budget_tokens": 100}}, 400, "invalid_request_error"),
    ({"tool_choice": {"type": "tool", "name": "missing"}, "tools": [TOOL]}, 400,
     "invalid_request_error"),
    ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}, "tools": [TOOL]},
     400, "invalid_request_error"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}, 400,
     "invalid_request_error"),
])
def test_error_bodies(client, fields, status, kind):
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
            **fields}
    with pytest.raises(anthropic.APIStatusError) as info:
        client.messages.create(**body)
    error = info.value
    assert error.status_code == status
    assert error.body["type"] == "error" and error.body["error"]["type"] == kind
    assert error.body["request_id"] == error.response.headers["request-id"]


def test_x_api_key_auth(harness):
    with pytest.raises(anthropic.AuthenticationError) as info:
        _client(harness.app, api_key="wrong").messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["error"]["type"] == "authentication_error"


def test_overload_is_529_and_queue_timeout_is_504(default_artifact, default_tokenizer):
    busy = build_harness(default_artifact, default_tokenizer, max_context=256, decode_sleep=0.02,
                         engine_options={"lanes": 1, "pending": 1}, pending_timeout_ms=300)
    try:
        busy.book.add("long", "la", end=False)
        client = _client(busy.app)
        with client.messages.stream(model="m", max_tokens=200,
                                    messages=[{"role": "user", "content": "SCRIPT:long"}]) as held:
            next(iter(held))  # admitted and generating: the only lane is taken
            with pytest.raises(anthropic.APIStatusError) as info:
                client.messages.create(model="m", max_tokens=8,
                                       messages=[{"role": "user", "content": "waits"}])
            assert info.value.status_code == 504
            assert info.value.body["error"]["type"] == "timeout_error"
    finally:
        busy.close()
    full = build_harness(default_artifact, default_tokenizer, max_context=256, decode_sleep=0.02,
                         engine_options={"lanes": 1, "pending": 0})
    try:
        full.book.add("long", "la", end=False)
        client = _client(full.app)
        with client.messages.stream(model="m", max_tokens=200,
                                    messages=[{"role": "user", "content": "SCRIPT:long"}]) as held:
            next(iter(held))
            with pytest.raises(anthropic.APIStatusError) as info:
                client.messages.create(model="m", max_tokens=8,
                                       messages=[{"role": "user", "content": "no room"}])
            assert info.value.status_code == 529
            assert info.value.body["error"]["type"] == "overloaded_error"
    finally:
        full.close()
