"""Gemma 4's thought channel under the token policies, on the real Gemma-4-style tokenizer and
template (scripted fake model). Its open marker `<|channel>thought` is two tokens (a control
token and plain text), unlike Qwen's one-token <think>: a forced tool call must still let
the model think first, and a thinking budget must still count and close the channel."""
import openai
import httpx2
import pytest

from harness import RandomQwen, build_harness
from ninfer_jax.engine.policies import EARLY_CLOSE_GUIDANCE
from ninfer_jax.text.tool_parsers import GemmaFormat

TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
THOUGHT = "<|channel>thought\nLet me call.<channel|>"


@pytest.fixture(scope="module")
def harness():
    h = build_harness(RandomQwen.build("gemma4-tiny"), max_context=512)
    tokenizer = h.ctx.tokenizer
    encode = lambda text: tokenizer.encode(text, special=True)  # noqa: E731
    # The policy replaces the first answer token with the call prefix and a token that leaves
    # the offered names with the name and its "{"; the fake model's script index runs on
    # through the forced tokens, so fillers stand where they land, then the model closes.
    forced = len(encode(GemmaFormat.call_prefix)) + len(encode("get_weather{"))
    h.book.scripts["call"] = (encode(THOUGHT) + encode("Z") * forced
                              + encode("}<tool_call|>") + [tokenizer.eos_ids[0]])
    # Thinks on without closing: the budget must close the channel.
    h.book.scripts["long"] = (encode("<|channel>thought\n") + encode(" hmm") * 60
                              + [tokenizer.eos_ids[0]])
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(harness):
    return openai.OpenAI(base_url="http://ninfer.test/v1", api_key="unused", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.WSGITransport(
                             app=harness.app)))


def test_a_forced_call_comes_after_the_models_thought_channel(client):
    for tool_choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = client.chat.completions.create(
            model="gemma4-tiny", messages=[{"role": "user", "content": "SCRIPT:call"}],
            tools=[TOOL], tool_choice=tool_choice, max_tokens=64,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        message = reply.choices[0].message
        assert message.reasoning_content == "Let me call."
        (call,) = message.tool_calls
        assert (call.function.name, call.function.arguments) == ("get_weather", "{}")
        assert reply.choices[0].finish_reason == "tool_calls"


def test_a_thinking_budget_closes_the_thought_channel(client):
    reply = client.chat.completions.create(
        model="gemma4-tiny", messages=[{"role": "user", "content": "SCRIPT:long"}],
        max_tokens=120, extra_body={"thinking_budget": 5})
    reasoning = reply.choices[0].message.reasoning_content
    # "thought" belongs to the marker: the newline and four " hmm" are the five counted.
    assert reasoning.count("hmm") == 4
    assert reasoning.endswith(EARLY_CLOSE_GUIDANCE.rstrip("\n"))
    assert reply.usage.completion_tokens_details.reasoning_tokens >= 5
