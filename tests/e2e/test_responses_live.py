"""End to end: OpenAI Responses Core against a live `ninfer serve` of the default model."""
import json

import httpx
import openai
import pytest

MODEL = "smollm2-135m-instruct"
CAPITAL = "What is the capital of France? Answer in one sentence."
PARIS = "The capital of France is Paris."


def test_create_stream_and_retrieve(live_server):
    client = live_server.openai()
    raw = client.responses.with_raw_response.create(model=MODEL, input=CAPITAL, temperature=0)
    assert raw.headers["x-request-id"]
    response = raw.parse()
    assert response.status == "completed" and response.output_text == PARIS
    assert response.usage.output_tokens == 8  # seven text tokens and <|im_end|>
    with client.responses.stream(model=MODEL, input=CAPITAL, temperature=0) as stream:
        events = list(stream)
        streamed = stream.get_final_response()
    assert streamed.output_text == PARIS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert client.responses.retrieve(response.id).output_text == PARIS
    items = client.responses.input_items.list(response.id)
    assert [item.content[0].text for item in items.data] == [CAPITAL]


def test_raw_sse_has_named_events_and_no_done(live_server):
    body = {"model": MODEL, "input": CAPITAL, "temperature": 0, "stream": True, "store": False}
    with live_server.http() as http:
        response = http.post("/v1/responses", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-request-id"] and "[DONE]" not in response.text
    frames = [f for f in response.text.split("\n\n") if f.strip() and not f.startswith(":")]
    for frame in frames:
        name, data = frame.split("\n")
        assert name[len("event: "):] == json.loads(data[len("data: "):])["type"]


def test_previous_response_id_equals_explicit_history(live_server):
    client = live_server.openai()
    first = client.responses.create(model=MODEL, input=CAPITAL, temperature=0,
                                    instructions="You are terse.")
    follow = "And the capital of Italy?"
    chained = client.responses.create(model=MODEL, previous_response_id=first.id, input=follow,
                                      temperature=0, max_output_tokens=24)
    history = [{"role": "user", "content": CAPITAL},
               *[item.model_dump(exclude_none=True) for item in first.output],
               {"role": "user", "content": follow}]
    explicit = client.responses.create(model=MODEL, input=history, temperature=0,
                                       max_output_tokens=24, store=False)
    counted = client.responses.input_tokens.count(model=MODEL, input=history)
    assert chained.usage.input_tokens == explicit.usage.input_tokens == counted.input_tokens
    assert chained.output_text == explicit.output_text
    # Instructions applied to the first request only: the explicit history above has no
    # developer turn and still matches the chained prompt.
    assert first.usage.input_tokens == client.responses.input_tokens.count(
        model=MODEL, input=CAPITAL, instructions="You are terse.").input_tokens


def test_limits_store_and_delete(live_server):
    client = live_server.openai()
    cut = client.responses.create(model=MODEL, input=CAPITAL, max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3
    client.responses.delete(cut.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(cut.id)
    unstored = client.responses.create(model=MODEL, input=CAPITAL, max_output_tokens=2,
                                       store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_error_contracts(live_server):
    client = live_server.openai()
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="x", extra_body={"frobnicate": True})
    assert info.value.body["code"] == "unknown_parameter"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="x", tools=[{"type": "web_search"}])
    assert info.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="not-this-one", input="x")
    with live_server.http() as http:
        assert http.post("/v1/responses/compact", json={}).json()["error"]["code"] == \
            "compaction_not_supported"
    assert httpx.post(live_server.url + "/v1/responses",
                      json={"model": MODEL, "input": "x"}).status_code == 401


def test_engine_fields_through_extra_body(live_server):
    """ignore_eos runs to max_output_tokens (incomplete); a seed fixes a sampled reply."""
    client = live_server.openai()
    endless = client.responses.create(model=MODEL, input=CAPITAL, temperature=0, store=False,
                                      max_output_tokens=16, extra_body={"ignore_eos": True})
    assert endless.status == "incomplete" and endless.usage.output_tokens == 16
    assert endless.incomplete_details.reason == "max_output_tokens"
    assert endless.output_text.startswith(PARIS)

    def sampled(seed):
        return client.responses.create(
            model=MODEL, input="Write a short poem about the sea.", temperature=1.0,
            max_output_tokens=12, store=False, extra_body={"seed": seed}).output_text

    assert sampled(11) == sampled(11) != sampled(12)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input=CAPITAL, extra_body={"seed": "x"})
    assert info.value.body["param"] == "seed"
