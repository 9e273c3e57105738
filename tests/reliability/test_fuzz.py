"""Property-based fuzz of every endpoint (hypothesis) over the fake-model app: whatever the
body (valid ones with one field replaced by any JSON value, arbitrary JSON, arbitrary bytes),
the server answers below 500 and no stream carries an internal error.

The CI run is short (NINFER_FUZZ_EXAMPLES, default 50 per test, five tests); `make fuzz`
runs 1,500 per test (7,500 requests)."""
import json
import os

import pytest
from falcon import testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import build_harness

MODEL = "smollm2-135m-instruct"
EXAMPLES = int(os.environ.get("NINFER_FUZZ_EXAMPLES", "50"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                derandomize=not os.environ.get("NINFER_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
JSON = {"Content-Type": "application/json", "Host": "127.0.0.1"}

BASES = {
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 4,
                             "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": MODEL, "max_tokens": 4, "prompt": "hi"},
    "/v1/responses": {"model": MODEL, "max_output_tokens": 4, "input": "hi"},
    "/v1/messages": {"model": MODEL, "max_tokens": 4,
                     "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages/count_tokens": {"model": MODEL,
                                  "messages": [{"role": "user", "content": "hi"}]},
}
FIELDS = ["model", "messages", "input", "prompt", "max_tokens", "max_output_tokens",
          "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
          "stop_sequences", "stream", "stream_options", "tools", "tool_choice", "metadata",
          "system", "instructions", "thinking", "reasoning", "reasoning_effort",
          "response_format", "text", "n", "logprobs", "top_logprobs", "user", "store",
          "previous_response_id", "include", "chat_template_kwargs", "priority", "draft",
          "parallel_tool_calls", "presence_penalty", "frequency_penalty", "echo", "suffix",
          "best_of", "ignore_eos", "stop_token_ids", "continue_final_message",
          "add_generation_prompt", "truncation", "background", "service_tier", "logit_bias"]
MESSAGE_FIELDS = ["role", "content", "name", "tool_calls", "tool_call_id",
                  "reasoning_content", "type"]

# Any JSON value: lone surrogates and non-finite floats included (json.dumps writes both).
scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(st.characters(codec=None), max_size=12)
           | st.sampled_from(["", "user", "assistant", "system", "tool", "developer", MODEL,
                              "function", "auto", "none", "required", "text", "image_url",
                              "background", "input_text", "tool_use", "tool_result"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(FIELDS + MESSAGE_FIELDS) | st.text(
                          max_size=6), inner, max_size=4), max_leaves=12)


@pytest.fixture(scope="module")
def client(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, max_context=256)
    yield testing.TestClient(h.app)
    h.close()


def check(reply) -> None:
    assert reply.status_code < 500, (reply.status_code, reply.text[:500])
    assert "internal_error" not in reply.text, reply.text[:500]


def post(client, path, body: bytes):
    return client.simulate_post(path, body=body, headers=JSON)


@FUZZ
@given(path=st.sampled_from(sorted(BASES)), field=st.sampled_from(FIELDS), value=values)
def test_one_field_replaced(client, path, field, value):
    body = {**BASES[path], field: value}
    if field not in ("max_tokens", "max_output_tokens", "max_completion_tokens"):
        body.setdefault("max_tokens", 4)
    check(post(client, path, json.dumps(body).encode()))


@FUZZ
@given(path=st.sampled_from(sorted(BASES)), field=st.sampled_from(MESSAGE_FIELDS),
       value=values, index=st.integers(0, 1))
def test_one_message_field_replaced(client, path, field, value, index):
    body = json.loads(json.dumps(BASES[path]))
    messages = body.get("messages") or [{"role": "user", "content": "hi"}]
    message = {"role": "user", "content": "hi", field: value}
    body["messages" if "messages" in body else "input"] = (
        [message] if index == 0 else [*messages, {"role": "assistant", "content": "x"},
                                      message])
    check(post(client, path, json.dumps(body).encode()))


@FUZZ
@given(path=st.sampled_from(sorted(BASES)), value=values)
def test_any_json_body(client, path, value):
    check(post(client, path, json.dumps(value).encode()))


@FUZZ
@given(path=st.sampled_from(sorted(BASES)), data=st.binary(max_size=200))
def test_any_bytes(client, path, data):
    check(post(client, path, data))


@FUZZ
@given(method=st.sampled_from(["GET", "HEAD", "DELETE", "OPTIONS", "PUT", "PATCH"]),
       path=st.sampled_from(["/health", "/v1/models", "/v1/models/x", "/metrics",
                             "/v1/responses/resp_x", "/v1/responses/resp_x/input_items",
                             "/v1/chat/completions", "/nope", "/v1/messages", "/",
                             "/ui/app.js", "/ui/"]),
       suffix=st.text(st.characters(codec="ascii", categories=["L", "N"]), max_size=8))
def test_other_methods_and_paths(client, method, path, suffix):
    reply = client.simulate_request(method, path + suffix, headers={"Host": "127.0.0.1"})
    assert reply.status_code < 500 or (path == "/health" and reply.status_code == 503)
