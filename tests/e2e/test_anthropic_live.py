"""End to end: Anthropic Messages against a live `ninfer serve` of the default model."""
import anthropic
import httpx
import pytest

CAPITAL = "What is the capital of France? Answer in one sentence."
PARIS = "The capital of France is Paris."
GREEDY = {"temperature": 0}  # this SDK version has no temperature argument


def _client(server, api_key=None):
    return anthropic.Anthropic(base_url=server.url, api_key=api_key or server.api_key,
                               max_retries=0, timeout=300)


def _ask(content="", **fields):
    return {"model": "local-label", "max_tokens": 40, "extra_body": GREEDY,
            "messages": [{"role": "user", "content": content or CAPITAL}], **fields}


def test_create_stream_and_count(live_server):
    client = _client(live_server)
    raw = client.messages.with_raw_response.create(**_ask())
    assert raw.headers["request-id"]
    message = raw.parse()
    assert message.content[0].text == PARIS and message.stop_reason == "end_turn"
    assert message.model == "local-label"
    with client.messages.stream(**_ask()) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert streamed.content[0].text == PARIS
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert streamed.usage.output_tokens == message.usage.output_tokens
    counted = client.messages.count_tokens(model="x", messages=[{"role": "user",
                                                                 "content": CAPITAL}])
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens


def test_stop_sequence_prefill_and_max_tokens(live_server):
    client = _client(live_server)
    stopped = client.messages.create(**_ask(stop_sequences=["Paris"]))
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "Paris"
    assert stopped.content[0].text == "The capital of France is "
    prefilled = client.messages.create(**_ask(messages=[
        {"role": "user", "content": CAPITAL},
        {"role": "assistant", "content": "The capital of France is"}]))
    assert prefilled.content[0].text.startswith(" Paris")
    short = client.messages.create(**_ask(max_tokens=2))
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2


def test_auth_and_error_bodies(live_server):
    with pytest.raises(anthropic.AuthenticationError) as info:
        _client(live_server, api_key="wrong").messages.create(**_ask())
    assert info.value.body["error"]["type"] == "authentication_error"
    assert info.value.response.headers["request-id"]
    response = httpx.post(live_server.url + "/v1/messages", headers=live_server.headers,
                          json={"model": "m", "max_tokens": 0,
                                "messages": [{"role": "user", "content": "hi"}]})
    body = response.json()
    assert response.status_code == 400 and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and body["request_id"]


POEM = "Write a short poem about the sea."


def test_engine_fields_through_extra_body(live_server):
    """ignore_eos runs past the end token to max_tokens; a seed fixes a sampled reply; a
    malformed engine field is a 400 naming it; an unknown field changes nothing (serving.md)."""
    client = _client(live_server)
    plain = client.messages.create(**_ask(max_tokens=16))
    assert plain.stop_reason == "end_turn" and plain.usage.output_tokens < 16
    endless = client.messages.create(**_ask(max_tokens=16,
                                            extra_body={**GREEDY, "ignore_eos": True}))
    assert endless.stop_reason == "max_tokens" and endless.usage.output_tokens == 16
    assert endless.content[0].text.startswith(PARIS)

    def sampled(seed):
        return client.messages.create(**_ask(POEM, max_tokens=12, extra_body={
            "temperature": 1.0, "seed": seed})).content[0].text

    assert sampled(11) == sampled(11) != sampled(12)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(**_ask(extra_body={"ignore_eos": "yes"}))
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "ignore_eos" in info.value.body["error"]["message"]
    odd = client.messages.create(**_ask(max_tokens=16,
                                       extra_body={**GREEDY, "some_future_hint": 1}))
    assert odd.content[0].text == plain.content[0].text
