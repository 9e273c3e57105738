"""Every integer-valued request field of every dialect reads a JSON value the same way (one
helper, serve/core/fields.integral): an integral float (5.0, what JavaScript clients and
pydantic's lax mode send) is accepted and means exactly the integer, as vLLM and OpenAI
accept it; a fraction (5.5), a boolean or a string ("5") is a 400 naming the field, in the
dialect's own error shape.

The scripted fake model of harness.py behind Qwen3's tokenizer and template (a thinking
model, so the thinking budgets reach the engine); "means the integer" is checked by sending the integer
and the float and comparing the whole replies (seeded sampling, the same limits and stops)."""
import json

import pytest
from falcon import testing

from harness import STORY, build_harness

MODEL = "qwen3-tiny"
SAMPLED = {"temperature": 0.9, "seed": 11}


@pytest.fixture(scope="module")
def h(qwen3):
    h = build_harness(qwen3, max_context=4096)
    h.book.add("story", STORY)
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(h):
    return testing.TestClient(h.app)


def chat(fields, content):
    limit = {} if "max_completion_tokens" in fields else {"max_tokens": 8}
    return "/v1/chat/completions", {"model": MODEL, **limit, **SAMPLED,
                                    "messages": [{"role": "user", "content": content}],
                                    **fields}


def completions(fields, content):
    return "/v1/completions", {"model": MODEL, "prompt": content, "max_tokens": 8,
                               **SAMPLED, **fields}


def responses(fields, content):
    return "/v1/responses", {"model": MODEL, "input": content, "store": False,
                             "max_output_tokens": 8, **SAMPLED, **fields}


def messages(fields, content):
    return "/v1/messages", {"model": MODEL, "max_tokens": 8, **SAMPLED,
                            "messages": [{"role": "user", "content": content}], **fields}


def stop_id(h):
    return h.book.scripts["story"][h.book.first_new("story", 3)]


# (dialect, the field a 400 names, the integer, the body fields that carry a value v).
# A value of None is resolved from the harness (a token id).
CASES = [
    (chat, "max_tokens", 5, lambda v: {"max_tokens": v}),
    (chat, "max_completion_tokens", 5, lambda v: {"max_completion_tokens": v}),
    (chat, "n", 1, lambda v: {"n": v}),
    (chat, "seed", 5, lambda v: {"seed": v}),
    (chat, "top_k", 5, lambda v: {"top_k": v}),
    (chat, "stop_token_ids", None, lambda v: {"stop_token_ids": [v]}),
    (chat, "top_logprobs", 0, lambda v: {"top_logprobs": v}),
    (chat, "thinking_budget", 5, lambda v: {"thinking_budget": v, "enable_thinking": True,
                                                "max_tokens": 64}),
    (chat, "min_tokens", 0, lambda v: {"min_tokens": v}),
    (chat, "priority", 5, lambda v: {"priority": v}),
    (completions, "max_tokens", 5, lambda v: {"max_tokens": v}),
    (completions, "n", 1, lambda v: {"n": v}),
    (completions, "seed", 5, lambda v: {"seed": v}),
    (completions, "top_k", 5, lambda v: {"top_k": v}),
    (completions, "stop_token_ids", None, lambda v: {"stop_token_ids": [v]}),
    (completions, "logprobs", 0, lambda v: {"logprobs": v}),
    (completions, "best_of", 1, lambda v: {"best_of": v}),
    (completions, "prompt", None, lambda v: {"prompt": [v, v]}),
    (responses, "max_output_tokens", 5, lambda v: {"max_output_tokens": v}),
    (responses, "seed", 5, lambda v: {"seed": v}),
    (responses, "top_k", 5, lambda v: {"top_k": v}),
    (responses, "stop_token_ids", None, lambda v: {"stop_token_ids": [v]}),
    (responses, "top_logprobs", 0, lambda v: {"top_logprobs": v}),
    (responses, "max_tool_calls", 5, lambda v: {"max_tool_calls": v}),
    (responses, "priority", 5, lambda v: {"priority": v}),
    (messages, "max_tokens", 5, lambda v: {"max_tokens": v}),
    (messages, "seed", 5, lambda v: {"seed": v}),
    (messages, "top_k", 5, lambda v: {"top_k": v}),
    (messages, "stop_token_ids", None, lambda v: {"stop_token_ids": [v]}),
    (messages, "thinking.budget_tokens", 1024,
     lambda v: {"max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": v}}),
    (messages, "context_management.edits[0].trigger.value", 5000, lambda v: {
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919",
                                          "trigger": {"type": "input_tokens", "value": v}}]}}),
    (messages, "priority", 5, lambda v: {"priority": v}),
]
IDS = [f"{send.__name__}-{field}" for send, field, _, _ in CASES]
# Fields whose integer here changes the reply from the request without them (the others are
# accepted only at their neutral value, steer scheduling, or, top_k, act in a sampler the
# fake model does not run).
CHANGES_THE_REPLY = {"max_tokens", "max_completion_tokens", "max_output_tokens", "seed",
                     "stop_token_ids", "thinking_budget", "prompt"}
VOLATILE = {"id", "created", "created_at", "completed_at", "timings", "system_fingerprint"}


def post(client, send, fields, field):
    """The story script where a stop token must occur, else a sampled (seeded) reply."""
    content = "SCRIPT:story" if field == "stop_token_ids" else "Say something"
    path, body = send(fields, content)
    return client.simulate_post(path, json=body)


def stable(value):
    """The reply without what differs between any two requests (ids, clocks)."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def named_field(send, result) -> str:
    assert result.status_code == 400, result.json
    if send is messages:
        assert result.json["error"]["type"] == "invalid_request_error"
        return result.json["error"]["message"]
    return result.json["error"]["param"]


@pytest.mark.parametrize("send, field, integer, carry", CASES, ids=IDS)
def test_an_integral_float_means_the_integer(client, h, send, field, integer, carry):
    integer = stop_id(h) if integer is None else integer
    exact = post(client, send, carry(integer), field)
    assert exact.status_code == 200, exact.json
    as_float = post(client, send, carry(float(integer)), field)
    assert as_float.status_code == 200, as_float.json
    # Compared as JSON text: an echoed 5.0 would differ from 5 there.
    assert json.dumps(stable(as_float.json)) == json.dumps(stable(exact.json))
    if field in CHANGES_THE_REPLY:  # so the comparison above could fail
        assert stable(post(client, send, {}, field).json) != stable(exact.json)


@pytest.mark.parametrize("bad", [0.5, True, "str"])
@pytest.mark.parametrize("send, field, integer, carry", CASES, ids=IDS)
def test_a_fraction_boolean_or_string_is_a_field_400(client, h, send, field, integer, carry,
                                                      bad):
    integer = stop_id(h) if integer is None else integer
    value = {0.5: integer + 0.5, True: True, "str": str(integer)}[bad]
    where = named_field(send, post(client, send, carry(value), field))
    if send is messages:
        assert where.startswith(f"'{field}"), where
    else:
        assert where == field.split(".")[0] if field == "prompt" else where == field


@pytest.mark.parametrize("key", ["5.0", "abc", "true", " 5", ""])
def test_logit_bias_keys_are_token_ids(client, key):
    result = post(client, chat, {"logit_bias": {key: 0}}, "logit_bias")
    assert named_field(chat, result) == "logit_bias"
    assert post(client, chat, {"logit_bias": {"5": 0}}, "logit_bias").status_code == 200
