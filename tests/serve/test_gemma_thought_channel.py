"""Gemma 4's thought channel under the token policies, on the real Gemma-4-style tokenizer and
template (scripted fake model). Its open marker `<|channel>thought` is two tokens (a control
token and plain text), unlike Qwen's one-token <think>: a forced tool call must still let
the model think first, and a thinking budget must still count and close the channel."""
import openai
import httpx2
import pytest
from falcon import testing

from harness import RandomQwen, build_harness
from ninfer_jax.text.conversation import Conversation, Message, PromptOptions
from sse_util import sse_chunks, streamed_text
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
    h.book.add("unasked", "<|channel>thought\nI think hard.<channel|>Answer.")
    h.book.add("empty", "<|channel>thought\n<channel|>Answer.")
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


def test_a_thought_written_with_thinking_off_is_still_reasoning(harness):
    """Pins the current behaviour (no code change): with thinking off, a thought channel the
    model opens anyway is returned as reasoning, apart from the answer, in every dialect.

    Why: Gemma 4's template (ours follows it) only leaves out <|think|> when thinking is off;
    unlike Qwen, GLM or Nemotron it pre-fills no empty thought block, so the generation prompt
    is the same `<|turn>model\n` either way and nothing stops the model from opening the
    channel. serving.md returns "reasoning separately as reasoning_content; answer text
    remains in content", and vLLM picks its reasoning parser per server
    (--reasoning-parser), not per request, so it splits what the model writes whatever the
    request asked. The other choices break the API's promises: as content the client would
    get raw control markup (`<|channel>thought`, `<channel|>`) in the answer, and dropping
    it would silently lose text the model wrote and the usage counts. An empty channel
    leaves no reasoning at all, just the clean answer."""
    prompt = harness.ctx.renderer.render(Conversation(
        [Message("user", "SCRIPT:unasked")], options=PromptOptions(enable_thinking=False)))
    assert "<|think|>" not in prompt.text and not prompt.starts_in_reasoning
    client = testing.TestClient(harness.app)
    for off in ({"chat_template_kwargs": {"enable_thinking": False}},
                {"reasoning_effort": "none"}):
        for key, reasoning in (("unasked", "I think hard."), ("empty", None)):
            body = {"model": "gemma4-tiny", "max_tokens": 64, **off,
                    "messages": [{"role": "user", "content": f"SCRIPT:{key}"}]}
            message = client.simulate_post("/v1/chat/completions",
                                           json=body).json["choices"][0]["message"]
            assert (message["reasoning_content"], message["content"]) == (reasoning, "Answer.")
            chunks = sse_chunks(client.simulate_post(
                "/v1/chat/completions", json={**body, "stream": True}).text)[0]
            assert (streamed_text(chunks, "reasoning_content"), streamed_text(chunks)) \
                == (reasoning or "", "Answer.")
    output = client.simulate_post("/v1/responses", json={
        "model": "gemma4-tiny", "input": "SCRIPT:unasked", "max_output_tokens": 64,
        "reasoning": {"effort": "none"}, "store": False}).json["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert output[0]["content"][0]["text"] == "I think hard."
    assert output[1]["content"][0]["text"] == "Answer."
    message = client.simulate_post("/v1/messages", json={
        "model": "m", "max_tokens": 64, "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": "SCRIPT:unasked"}]}).json
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in message["content"]] == [
        ("thinking", "I think hard."), ("text", "Answer.")]
