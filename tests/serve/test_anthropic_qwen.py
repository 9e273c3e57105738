"""Anthropic Messages on the real Qwen3.5 tokenizer and template (scripted fake model):
thinking budgets, thinking on/off, typed XML tool_use, tool results in the prompt."""
import anthropic
import httpx2
import pytest

from harness import build_harness
from ninfer_jax.engine.policies import EARLY_CLOSE_GUIDANCE

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}}}
XML_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")
BUDGET = 1024  # the smallest budget Anthropic's enabled thinking accepts


@pytest.fixture(scope="module")
def h35(qwen35):
    h = build_harness(qwen35, max_context=2048)
    tokenizer = h.ctx.tokenizer
    # Thinks without ever closing: at the budget the policy inserts the guidance and the
    # close marker in place of the model's token; the fake model then answers.
    suffix = len(tokenizer.encode(EARLY_CLOSE_GUIDANCE + "</think>\n\n", special=True))
    word = tokenizer.encode(" hmm", special=True)
    h.book.scripts["long"] = (word * (BUDGET + 1) + word * (suffix - 1)
                              + tokenizer.encode("Done.", special=True) + [tokenizer.eos_ids[0]])
    h.book.add("call", "Let me call.\n</think>\n\n" + XML_CALL)
    h.book.add("after", "Thanks.\n</think>\n\nIt is sunny.")
    h.book.add("plain", "No thinking here.")
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(h35):
    http = httpx2.Client(transport=httpx2.WSGITransport(app=h35.app))
    return anthropic.Anthropic(base_url="http://ninfer.test", api_key="unused",
                               http_client=http, max_retries=0)


def _ask(content, **fields):
    return {"model": "local", "max_tokens": 64, **fields,
            "messages": [{"role": "user", "content": content}]}


def test_enabled_thinking_budget_closes_thinking(client):
    message = client.messages.create(**_ask("SCRIPT:long", max_tokens=1500, thinking={
        "type": "enabled", "budget_tokens": BUDGET}))
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.thinking.endswith(
        EARLY_CLOSE_GUIDANCE.rstrip("\n"))
    assert thinking.thinking.count("hmm") == BUDGET
    assert text.text == "Done." and message.stop_reason == "end_turn"


def test_budget_without_room_for_the_close_suffix_is_rejected(client):
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(**_ask("SCRIPT:long", max_tokens=BUDGET + 3, thinking={
            "type": "enabled", "budget_tokens": BUDGET}))
    assert "thinking budget" in info.value.body["error"]["message"]


def test_typed_xml_tool_use_and_result_turn(client, h35):
    message = client.messages.create(**_ask("SCRIPT:call", tools=[TOOL]))
    thinking, tool_use = message.content
    assert thinking.thinking == "Let me call."
    assert tool_use.input == {"city": "Paris", "days": 2} and message.stop_reason == "tool_use"
    follow = client.messages.create(model="local", max_tokens=64, tools=[TOOL], messages=[
        {"role": "user", "content": "SCRIPT:call"},
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny",
             "is_error": False}, {"type": "text", "text": "SCRIPT:after"}]}])
    assert follow.content[-1].text == "It is sunny."
    counted = client.messages.count_tokens(model="local", tools=[TOOL], messages=[
        {"role": "user", "content": "SCRIPT:call"},
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny"},
            {"type": "text", "text": "SCRIPT:after"}]}])
    usage = follow.usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens


def test_thinking_disabled_and_count_tokens_follow_the_mode(client):
    message = client.messages.create(**_ask("SCRIPT:plain", thinking={"type": "disabled"}))
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "No thinking here."
    on = client.messages.count_tokens(model="local", thinking={"type": "adaptive"},
                                      messages=[{"role": "user", "content": "x"}])
    off = client.messages.count_tokens(model="local", thinking={"type": "disabled"},
                                       messages=[{"role": "user", "content": "x"}])
    assert off.input_tokens > on.input_tokens  # the closed empty think block
