"""Every error path of the OpenAI routes: status, body shape, named parameter, request id."""
import json

import pytest
from falcon import testing

from harness import build_harness

MODEL = "smollm2-135m-instruct"
KEY = "local-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON_AUTH = {**AUTH, "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def secured(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, api_key=KEY, max_request_mib=1)
    yield testing.TestClient(h.app)
    h.close()


def assert_openai_error(response, status, *, param=None, code=None, type_=None):
    assert response.status_code == status, response.text
    assert response.headers["x-request-id"]
    error = response.json["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    if type_ is not None:
        assert error["type"] == type_
    return error


def post(client, body, **kwargs):
    return client.simulate_post("/v1/chat/completions", json=body, headers=AUTH, **kwargs)


def chat_body(**fields):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def test_auth_required_except_health(secured):
    missing = secured.simulate_get("/v1/models")
    assert_openai_error(missing, 401, code="invalid_api_key", type_="authentication_error")
    wrong = secured.simulate_get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert_openai_error(wrong, 401)
    assert secured.simulate_get("/v1/models", headers=AUTH).status_code == 200
    assert secured.simulate_get("/v1/models", headers={"x-api-key": KEY}).status_code == 200
    assert secured.simulate_get("/health").json["status"] == "ok"
    assert secured.simulate_options("/v1/chat/completions").status_code != 401


def test_body_over_limit_is_413_before_parsing(secured):
    too_big = b"{" + b" " * (1024 * 1024 + 10) + b"}"
    response = secured.simulate_post("/v1/chat/completions", body=too_big, headers=JSON_AUTH)
    assert_openai_error(response, 413, code="request_too_large")


def test_malformed_json_and_non_object(secured):
    response = secured.simulate_post("/v1/chat/completions", body=b"{not json", headers=JSON_AUTH)
    assert_openai_error(response, 400, code="invalid_json", type_="invalid_request_error")
    response = secured.simulate_post("/v1/chat/completions", body=b"[1]", headers=JSON_AUTH)
    assert_openai_error(response, 400, code="invalid_json")


def test_unknown_model_is_404(secured):
    assert_openai_error(post(secured, chat_body(model="gpt-4")), 404, code="model_not_found",
                        param="model")
    assert_openai_error(secured.simulate_get("/v1/models/gpt-4", headers=AUTH), 404)
    card = secured.simulate_get(f"/v1/models/{MODEL}", headers=AUTH).json
    assert card["id"] == MODEL and card["max_model_len"] == 512


def test_unknown_route_and_wrong_method_use_the_openai_body(secured):
    assert_openai_error(secured.simulate_get("/v1/nothing", headers=AUTH), 404)
    assert_openai_error(secured.simulate_get("/v1/chat/completions", headers=AUTH), 405,
                        code="method_not_allowed")


@pytest.mark.parametrize("fields,param", [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     "messages[0].content[0].text"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": -0.1}, "top_p"),
    ({"top_k": 21}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"seed": 1.5}, "seed"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_completion_tokens": "many"}, "max_completion_tokens"),
    ({"max_tokens": 3, "max_completion_tokens": 4}, "max_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": [""]}, "stop[0]"),
    ({"stop": 7}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
])
def test_malformed_fields_name_their_parameter(secured, fields, param):
    assert_openai_error(post(secured, chat_body(**fields)), 400, param=param,
                        type_="invalid_request_error")


@pytest.mark.parametrize("fields,param", [
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logit_bias": {"42": 5}}, "logit_bias"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"store": True}, "store"),
    ({"verbosity": "high"}, "verbosity"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"grammar": "root ::= x"}, "grammar"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]},
     "tools[0].function.strict"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "name": "bob", "content": "x"}]}, "messages[0].name"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_unsupported_behaviour_is_rejected_by_field(secured, fields, param):
    error = assert_openai_error(post(secured, chat_body(**fields)), 400, param=param)
    assert error["code"] in ("unsupported_parameter", "vision_disabled", "invalid_request")


# vLLM's sampling extras change the reply (or the prompt) at any value but the neutral one, so
# a client that sends one must not get a reply that silently lacks it; Completions shares them.
VLLM_EXTRAS_REFUSED = [
    ({"min_tokens": 5}, "min_tokens"),
    ({"include_stop_str_in_output": True}, "include_stop_str_in_output"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"length_penalty": 0.5}, "length_penalty"),
    ({"truncate_prompt_tokens": 3}, "truncate_prompt_tokens"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"allowed_token_ids": [5, 6]}, "allowed_token_ids"),
    ({"bad_words": ["cat"]}, "bad_words"),
]
VLLM_EXTRAS_NEUTRAL = {"min_tokens": 0, "include_stop_str_in_output": False,
                       "use_beam_search": False, "length_penalty": 1.0,
                       "truncate_prompt_tokens": None, "prompt_logprobs": None,
                       "allowed_token_ids": None, "bad_words": []}


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("fields,param", VLLM_EXTRAS_REFUSED + [
    ({"min_tokens": -1}, "min_tokens"), ({"use_beam_search": "yes"}, "use_beam_search")])
def test_vllm_sampling_extras_are_refused_not_ignored(secured, endpoint, fields, param):
    body = chat_body(**fields) if endpoint.startswith("/v1/chat") else {
        "model": MODEL, "prompt": "hi", **fields}
    response = secured.simulate_post(endpoint, json=body, headers=AUTH)
    assert_openai_error(response, 400, param=param, type_="invalid_request_error")


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
def test_vllm_sampling_extras_at_neutral_values_are_accepted(secured, endpoint):
    body = chat_body(max_tokens=2, **VLLM_EXTRAS_NEUTRAL) if endpoint.startswith(
        "/v1/chat") else {"model": MODEL, "prompt": "hi", "max_tokens": 2, **VLLM_EXTRAS_NEUTRAL}
    response = secured.simulate_post(endpoint, json=body, headers=AUTH)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("fields", [
    {"logit_bias": {"42": 0}}, {"logprobs": False, "top_logprobs": 0},
    {"verbosity": "medium"}, {"response_format": {"type": "text"}}, {"n": 1},
    {"functions": [], "function_call": "none"}, {"prediction": {"type": "content"}},
    {"metadata": {"a": "b"}, "user": "u", "service_tier": "auto", "prompt_cache_key": "k",
     "safety_identifier": "s", "some_unknown_field": {"x": 1}},
    {"repetition_penalty": 1}, {"mm_processor_kwargs": {"x": None}},
    {"guided_decoding_backend": "xgrammar"},
    {"modalities": ["text"]}, {"draft": False}, {"store": False},
    {"messages": [{"role": "user", "content": "x"},
                  {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "r"}]},
])
def test_neutral_and_advisory_fields_are_accepted(secured, fields):
    response = post(secured, chat_body(max_tokens=2, **fields))
    assert response.status_code == 200, response.text


def test_context_overflow_is_rejected_before_any_stream(secured):
    error = assert_openai_error(post(secured, chat_body(max_tokens=10_000, stream=True)), 400,
                                code="context_length_exceeded", param="max_tokens")
    assert "512" in error["message"]
    long_prompt = chat_body(messages=[{"role": "user", "content": "word " * 600}])
    assert_openai_error(post(secured, long_prompt), 400, code="context_length_exceeded",
                        param="messages")


def test_conflicting_thinking_options(secured):
    body = chat_body(enable_thinking=True, chat_template_kwargs={"enable_thinking": False})
    assert_openai_error(post(secured, body), 400, code="conflicting_template_option")
    body = chat_body(enable_thinking=True, reasoning_effort="none")
    assert_openai_error(post(secured, body), 400, code="conflicting_template_option")


def test_error_bodies_are_valid_json_with_request_ids_unique(secured):
    ids = {post(secured, chat_body(n=3)).headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3
    json.dumps(post(secured, chat_body(n=3)).json)


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {}}, "response_format.type"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"user": 5}, "user"),
    ({"safety_identifier": ["s"]}, "safety_identifier"),
    ({"service_tier": 1}, "service_tier"),
    ({"guided_decoding_backend": 1}, "guided_decoding_backend"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
      "continue_final_message": True, "add_generation_prompt": True}, "add_generation_prompt"),
])
def test_malformed_advisory_values_are_client_errors(secured, fields, param):
    """A malformed value is the client's bug even where the field is advisory or names a
    behaviour we reject: it is invalid_request on the field, not 200 or 'unsupported'."""
    assert_openai_error(post(secured, chat_body(**fields)), 400, param=param,
                        code="invalid_request")


def test_messages_say_what_the_field_accepts(secured):
    error = assert_openai_error(post(secured, chat_body(top_k=21)), 400, param="top_k")
    assert "<= 20" in error["message"] and "None" not in error["message"]
    content = chat_body(messages=[{"role": "user", "content": 5}])
    error = assert_openai_error(post(secured, content), 400, param="messages[0].content")
    assert "a string or an array" in error["message"]
    no_role = chat_body(messages=[{"content": "x"}])
    error = assert_openai_error(post(secured, no_role), 400, param="messages[0].role")
    assert error["message"].endswith("got null.")


@pytest.mark.parametrize("fields, param, shown", [
    ({"response_format": {}}, "response_format.type", "got null."),
    ({"response_format": {"type": True}}, "response_format.type", "got true."),
    ({"reasoning_effort": "extreme"}, "reasoning_effort", 'got "extreme".'),
    ({"reasoning_effort": ["low"]}, "reasoning_effort", 'got ["low"].'),
    ({"reasoning_effort": "x" * 200}, "reasoning_effort", "...."),  # cut, not echoed whole
    ({"enable_thinking": True, "chat_template_kwargs": {"enable_thinking": False}},
     "chat_template_kwargs.enable_thinking", "(false) disagrees with 'enable_thinking' (true)."),
    ({"messages": [{"role": "user", "content": [{"type": None, "text": "x"}]}]},
     "messages[0].content[0].type", "got null."),
])
def test_enum_errors_quote_the_value_as_json(secured, fields, param, shown):
    """The client sent JSON: a quoted value reads null/true/"text", never None/True/'text'."""
    error = assert_openai_error(post(secured, chat_body(**fields)), 400, param=param)
    assert error["message"].endswith(shown), error["message"]
    assert len(error["message"]) < 200
    for python in ("None", "True", "False", "'extreme'", "['low']"):
        assert python not in error["message"]
