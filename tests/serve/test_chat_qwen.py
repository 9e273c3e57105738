"""Reasoning, thinking budgets, typed XML tool calls and forced calls on the real Qwen
tokenizers and our Qwen-style templates (scripted fake model, single-token markers)."""
import json

import pytest
from falcon import testing

from harness import build_harness
from ninfer_jax.engine.policies import EARLY_CLOSE_GUIDANCE
from sse_util import sse_chunks, streamed_text

TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "detailed": {"type": "boolean"}}}}}]
XML_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=detailed>\nTrue\n</parameter>\n"
            "</function>\n</tool_call>")
SUFFIX_TEXT = EARLY_CLOSE_GUIDANCE + "</think>\n\n"


@pytest.fixture(scope="module")
def h35(qwen35):
    h = build_harness(qwen35, max_context=1024)
    yield h
    h.close()


@pytest.fixture(scope="module")
def h3(qwen3):
    h = build_harness(qwen3, max_context=1024, default_thinking_budget=4)
    yield h
    h.close()


def chat(h, content, **fields):
    client = testing.TestClient(h.app)
    body = {"model": h.ctx.model_id, "messages": [{"role": "user", "content": content}],
            **fields}
    return client.simulate_post("/v1/chat/completions", json=body)


def add_budget_script(h, key, thinking: str, keep: int, answer: str) -> None:
    """The first `keep` thinking tokens (the rest of the thinking would follow), then what
    the model writes once the suffix replaced its token at index `keep`: the answer."""
    tokenizer = h.ctx.tokenizer
    suffix = len(tokenizer.encode(SUFFIX_TEXT, special=True))
    ids = tokenizer.encode(thinking, special=True)
    assert len(ids) > keep
    h.book.scripts[key] = (ids[:keep] + ids[keep:keep + 1] * suffix
                           + tokenizer.encode(answer, special=True) + [tokenizer.eos_ids[0]])


def test_prefilled_thinking_then_typed_xml_call(h35):
    h35.book.add("xml", "The user wants weather.\n</think>\n\n" + XML_CALL)
    body = chat(h35, "SCRIPT:xml", tools=TOOLS).json
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "The user wants weather."
    (call,) = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3,
                                                         "detailed": True}
    assert call["function"]["arguments"].index("city") < call["function"]["arguments"].index(
        "days")
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    chunks, _, _ = sse_chunks(chat(h35, "SCRIPT:xml", tools=TOOLS, stream=True).text)
    assert streamed_text(chunks, "reasoning_content") == "The user wants weather."
    assert streamed_text(chunks) == ""


def test_thinking_budget_inserts_guidance_and_close(h35):
    add_budget_script(h35, "long-think", "alpha beta gamma delta", 3, "Done.")
    body = chat(h35, "SCRIPT:long-think", thinking_budget=3).json
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "alpha beta gamma" + EARLY_CLOSE_GUIDANCE.rstrip()
    assert message["content"] == "Done."
    tokenizer = h35.ctx.tokenizer
    expected = 3 + len(tokenizer.encode(SUFFIX_TEXT, special=True)) + 2 + 1
    assert body["usage"]["completion_tokens"] == expected
    streamed = sse_chunks(chat(h35, "SCRIPT:long-think", thinking_budget=3, stream=True).text)[0]
    assert EARLY_CLOSE_GUIDANCE.strip() in streamed_text(streamed, "reasoning_content")
    assert streamed_text(streamed) == "Done."


def test_budget_capacity_that_cannot_hold_the_suffix_is_rejected(h35):
    response = chat(h35, "SCRIPT:long-think", thinking_budget=3, max_tokens=6)
    assert response.status_code == 400
    assert response.json["error"]["code"] == "thinking_budget_capacity_insufficient"
    assert response.json["error"]["param"] == "max_tokens"
    # Within the budget, or thinking disabled: no cap, no rejection.
    assert chat(h35, "SCRIPT:long-think", thinking_budget=3, max_tokens=3).status_code == 200
    assert chat(h35, "SCRIPT:long-think", thinking_budget=3, max_tokens=6,
                enable_thinking=False).status_code == 200


def test_server_default_budget_with_model_written_open_marker(h3):
    # The model writes the open marker; the default budget counts the 4 tokens after it
    # ("\n", "step", " one", " two"), so the suffix replaces the token at index 5.
    add_budget_script(h3, "q3-think", "<think>\nstep one two three four five", 5, "Answer.")
    body = chat(h3, "SCRIPT:q3-think").json
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "step one two" + EARLY_CLOSE_GUIDANCE.rstrip()
    assert message["content"] == "Answer."
    unlimited = chat(h3, "SCRIPT:q3-think", enable_thinking=False).json
    assert EARLY_CLOSE_GUIDANCE.strip() not in json.dumps(unlimited)


def test_hermes_call_after_model_written_reasoning(h3):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    h3.book.add("q3-call", "<think>\nNeed weather.\n</think>\n\n" + call)
    message = chat(h3, "SCRIPT:q3-call", tools=TOOLS).json["choices"][0]["message"]
    assert message["reasoning_content"] == "Need weather."
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}


def test_required_call_is_forced_after_the_think_block(h35):
    h35.book.add("chatty", "Thinking it over.\n</think>\n\nSure, let me explain the weather.")
    body = chat(h35, "SCRIPT:chatty", tools=TOOLS, tool_choice="required").json
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "Thinking it over."
    # Forced: the opener and the offered name; the scripted model then runs out of script, so
    # the unfinished call comes back as text.
    assert message["content"] == "<tool_call>\n<function=get_weather>"


def test_sampling_defaults_follow_the_thinking_mode(h3):
    from ninfer_jax.serve.core.generation import GenerationOptions, prepare_chat
    from ninfer_jax.serve.openai.chat import parse_chat

    def sampling(**fields):
        body = {"model": h3.ctx.model_id, "messages": [{"role": "user", "content": "x"}],
                **fields}
        conversation, options, _ = parse_chat(body, h3.ctx)
        return prepare_chat(h3.ctx, conversation, options, "req").request.sampling

    thinking, plain = sampling(), sampling(enable_thinking=False)
    assert (thinking.temperature, thinking.top_p, thinking.top_k) == (0.6, 0.95, 20)
    assert (plain.temperature, plain.top_p) == (0.7, 0.8)
    assert sampling(temperature=0.1, seed=5).temperature == 0.1
    assert sampling(seed=-1).seed == 2 ** 63 - 1
    assert isinstance(GenerationOptions().sampling, dict)
