"""Responses on the real Qwen3.5 tokenizer and template (scripted fake model): reasoning
items, namespaced typed XML calls, continuation, preserve_thinking inheritance, effort none."""
import json

import httpx
import openai
import pytest

from harness import build_harness

TOOLS = [{"type": "namespace", "name": "mcp__weather", "description": "Weather service",
          "tools": [{"type": "function", "name": "get_current", "parameters": {
              "type": "object", "properties": {"city": {"type": "string"},
                                               "days": {"type": "integer"}}}}]},
         {"type": "function", "name": "get_current", "description": "Same name, no namespace",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]
CALL = ("The user wants the weather.\n</think>\n\n<tool_call>\n<function=mcp__weather.get_current>"
        "\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "</function>\n</tool_call>")


@pytest.fixture(scope="module")
def h35(qwen35):
    h = build_harness(qwen35, max_context=1024)
    h.book.add("call", CALL)
    h.book.add("answer", "Checked.\n</think>\n\nIt is sunny.")
    h.book.add("plain", "Plain answer.")
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(h35):
    http = httpx.Client(transport=httpx.WSGITransport(app=h35.app))
    yield openai.OpenAI(base_url="http://ninfer.test/v1", api_key="unused", http_client=http,
                        max_retries=0)
    http.close()


@pytest.fixture(scope="module")
def model(h35):
    return h35.ctx.model_id


def test_reasoning_item_and_namespaced_typed_call(client, model):
    response = client.responses.create(model=model, input="SCRIPT:call", tools=TOOLS)
    reasoning, call = response.output
    assert reasoning.content[0].text == "The user wants the weather."
    assert (call.namespace, call.name) == ("mcp__weather", "get_current")
    assert json.loads(call.arguments) == {"city": "Paris", "days": 3}
    assert list(json.loads(call.arguments)) == ["city", "days"]
    usage = response.usage
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens


def test_stream_reasoning_and_arguments(client, model):
    with client.responses.stream(model=model, input="SCRIPT:call", tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    arguments = "".join(e.delta for e in events
                        if e.type == "response.function_call_arguments.delta")
    assert reasoning == final.output[0].content[0].text == "The user wants the weather."
    assert arguments == final.output[1].arguments
    assert final.output[1].namespace == "mcp__weather"


def test_tool_turn_continuation_matches_explicit_history(client, model):
    first = client.responses.create(model=model, input="SCRIPT:call", tools=TOOLS)
    call = first.output[1]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C",
              "name": "get_current", "namespace": "mcp__weather"}
    chained_input = [result, {"role": "user", "content": "SCRIPT:answer"}]
    second = client.responses.create(model=model, previous_response_id=first.id, tools=TOOLS,
                                     input=chained_input)
    assert second.output_text == "It is sunny."
    explicit = [{"role": "user", "content": "SCRIPT:call"},
                *[item.model_dump(exclude_none=True) for item in first.output], *chained_input]
    counted = client.responses.input_tokens.count(model=model, tools=TOOLS, input=explicit)
    assert second.usage.input_tokens == counted.input_tokens
    # A result asserting another namespace does not answer that call.
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=model, previous_response_id=first.id, tools=TOOLS,
                                input=[{**result, "namespace": "other"}])
    assert info.value.body["code"] == "invalid_tool_history"


def test_preserve_thinking_is_inherited(client, model):
    parent = client.responses.create(model=model, input="SCRIPT:answer",
                                     extra_body={"preserve_thinking": True})
    assert parent.output[0].type == "reasoning"

    def count(**extra):
        return client.responses.input_tokens.count(
            model=model, previous_response_id=parent.id, input="next",
            extra_body=extra).input_tokens

    inherited, kept, dropped = count(), count(preserve_thinking=True), count(
        preserve_thinking=False)
    assert inherited == kept > dropped


def test_effort_none_disables_thinking(client, model):
    response = client.responses.create(model=model, input="SCRIPT:plain",
                                       reasoning={"effort": "none"})
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == "Plain answer."
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    thinking = client.responses.input_tokens.count(model=model, input="SCRIPT:plain")
    off = client.responses.input_tokens.count(model=model, input="SCRIPT:plain",
                                              reasoning={"effort": "none"})
    assert off.input_tokens > thinking.input_tokens  # the closed empty think block
