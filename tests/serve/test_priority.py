"""`priority` in every dialect (Chat, Completions, Responses, Anthropic Messages): the accepted
values reach GenerationRequest.background (seen in the request log's request_start, which
reads the submitted request), malformed values are a 400 naming `priority` in the dialect's
own error shape, and the real SDKs carry it through `extra_body`."""
import anthropic
import httpx2
import openai
import pytest
from falcon import testing

from harness import build_harness, read_log

# (value sent, background expected)
ACCEPTED = [("background", True), ("foreground", False), (1, True), (7, True), (0, False),
            (-5, False), (2.0, True), (None, False)]
REJECTED = ["urgent", "BACKGROUND", "", True, False, 1.5, [], {"class": "background"}]


@pytest.fixture(scope="module")
def logged(default_artifact, default_tokenizer, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("priority-log") / "requests.jsonl"
    h = build_harness(default_artifact, default_tokenizer, request_log_jsonl=str(log_path))
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(logged):
    return testing.TestClient(logged.app)


def chat_body(model, **fields):
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            **fields}


BODIES = {
    "/v1/chat/completions": chat_body,
    "/v1/completions": lambda model, **f: {"model": model, "prompt": "Once", "max_tokens": 2,
                                           **f},
    "/v1/responses": lambda model, **f: {"model": model, "input": "Hi", "store": False,
                                         "max_output_tokens": 2, **f},
    "/v1/messages": lambda model, **f: {"model": model, "max_tokens": 2,
                                        "messages": [{"role": "user", "content": "Hi"}], **f},
}


def last_start(h) -> dict:
    return [r for r in read_log(h) if r["event"] == "request_start"][-1]


def with_priority(value) -> dict:
    return {} if value is None else {"priority": value}


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("value, background", ACCEPTED)
def test_accepted_values_reach_the_engine_request(logged, client, path, value, background):
    response = client.simulate_post(path, json=BODIES[path](logged.ctx.model_id,
                                                            **with_priority(value)))
    assert response.status_code == 200, response.json
    start = last_start(logged)
    assert start["endpoint"] == path
    assert start["priority"] == ("background" if background else "foreground")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
@pytest.mark.parametrize("value", REJECTED)
def test_malformed_priority_is_an_openai_400_naming_it(logged, client, path, value):
    starts = len([r for r in read_log(logged) if r["event"] == "request_start"])
    response = client.simulate_post(path, json=BODIES[path](logged.ctx.model_id,
                                                            priority=value))
    assert response.status_code == 400
    error = response.json["error"]
    assert error["param"] == "priority" and error["type"] == "invalid_request_error"
    assert "'priority' must be 'background', 'foreground' or an integer" in error["message"]
    assert len([r for r in read_log(logged) if r["event"] == "request_start"]) == starts


@pytest.mark.parametrize("value", REJECTED)
def test_malformed_priority_is_an_anthropic_400_naming_it(logged, client, value):
    response = client.simulate_post("/v1/messages", json=BODIES["/v1/messages"](
        logged.ctx.model_id, priority=value))
    assert response.status_code == 400
    assert response.json["type"] == "error"
    assert response.json["error"]["type"] == "invalid_request_error"
    assert response.json["error"]["message"].startswith("'priority' must be")


def test_priority_is_not_a_responses_token_count_field(logged, client):
    response = client.simulate_post("/v1/responses/input_tokens",
                                    json={"input": "Hi", "priority": "background"})
    assert response.status_code == 400
    assert response.json["error"]["param"] == "priority"


def test_anthropic_count_tokens_ignores_priority_like_other_generation_fields(logged, client):
    body = BODIES["/v1/messages"](logged.ctx.model_id, priority="urgent")
    response = client.simulate_post("/v1/messages/count_tokens", json=body)
    assert response.status_code == 200 and response.json["input_tokens"] > 0


# ----------------------------------------------------------------------------- real SDKs


def _http(app):
    return httpx2.Client(transport=httpx2.WSGITransport(app=app))


def test_openai_sdk_extra_body_priority(logged):
    sdk = openai.OpenAI(base_url="http://ninfer.test/v1", api_key="unused", max_retries=0,
                        http_client=_http(logged.app))
    model = logged.ctx.model_id
    reply = sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                        max_tokens=2, extra_body={"priority": "background"})
    assert reply.choices[0].finish_reason == "length"
    assert last_start(logged)["priority"] == "background"
    sdk.responses.create(model=model, input="Hi", max_output_tokens=2, store=False,
                         extra_body={"priority": -1})
    assert last_start(logged)["priority"] == "foreground"
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                    extra_body={"priority": "high"})
    assert raised.value.body["param"] == "priority"


def test_anthropic_sdk_extra_body_priority(logged):
    sdk = anthropic.Anthropic(base_url="http://ninfer.test", api_key="unused", max_retries=0,
                              http_client=_http(logged.app))
    message = sdk.messages.create(model="any", max_tokens=2, extra_body={"priority": 3},
                                  messages=[{"role": "user", "content": "Hi"}])
    assert message.stop_reason == "max_tokens"
    assert last_start(logged)["priority"] == "background"
    with pytest.raises(anthropic.BadRequestError, match="priority"):
        sdk.messages.create(model="any", max_tokens=2, extra_body={"priority": "soon"},
                            messages=[{"role": "user", "content": "Hi"}])


def test_prepared_requests_carry_the_flag(logged):
    from ninfer_jax.serve.core.generation import GenerationOptions, prepare_chat, prepare_raw
    from ninfer_jax.text.conversation import Conversation, Message

    conversation = Conversation([Message("user", "Hi")], [])
    for background in (True, False):
        options = GenerationOptions(max_tokens=2, background=background)
        assert prepare_chat(logged.ctx, conversation, options, "c").request.background is background
        assert prepare_raw(logged.ctx, [1, 2], options, "r").request.background is background
