"""Tools and reasoning through Chat Completions, on the SmolLM2 tokenizer with a hermes-style
test template and a scripted fake model (markers are plain text for this tokenizer)."""
import json
import pathlib

import pytest
from falcon import testing

from harness import build_harness
from sse_util import sse_chunks, streamed_text

MODEL = "smollm2-135m-instruct"
TEMPLATE = (pathlib.Path(__file__).parent / "templates" / "hermes_think.jinja").read_text()
CHAT_FORMAT = {"tool_call_format": "hermes", "thinking_default": True,
               "reasoning": {"open": "<think>", "close": "</think>"}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SEARCH_CALL = '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tools_harness(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, chat_format=CHAT_FORMAT,
                      template=TEMPLATE)
    book = h.book
    book.add("think", "<think>\nTwo plus two.\n</think>\n\nIt is 4.")
    book.add("call", CALL)
    book.add("two-calls", CALL + "\n" + SEARCH_CALL)
    book.add("unknown-tool", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>')
    book.add("prose", "The weather is nice today.")
    book.add("think-call", "<think>\nI need the weather.\n" + CALL)
    book.add("search-call", SEARCH_CALL)
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(tools_harness):
    return testing.TestClient(tools_harness.app)


def chat(client, content, messages=None, **fields):
    messages = messages or [{"role": "user", "content": content}]
    return client.simulate_post("/v1/chat/completions",
                                json={"model": MODEL, "messages": messages, **fields})


def test_reasoning_is_split_in_aggregate_and_stream(client):
    body = chat(client, "SCRIPT:think").json
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "Two plus two."
    assert message["content"] == "It is 4."
    details = body["usage"]["completion_tokens_details"]
    assert 0 < details["reasoning_tokens"] < body["usage"]["completion_tokens"]
    chunks, done, _ = sse_chunks(chat(client, "SCRIPT:think", stream=True).text)
    assert done
    assert streamed_text(chunks, "reasoning_content") == "Two plus two."
    assert streamed_text(chunks) == "It is 4."
    kinds = [k for c in chunks if c.get("choices") for k in c["choices"][0]["delta"]
             if k in ("reasoning_content", "content") and c["choices"][0]["delta"][k]]
    assert kinds == sorted(kinds, key=lambda k: k != "reasoning_content")


def test_stop_strings_apply_to_reasoning(client):
    body = chat(client, "SCRIPT:think", stop=["plus"]).json
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "Two" and message["content"] in ("", None)


def test_tool_call_aggregate_and_stream(client):
    body = chat(client, "SCRIPT:call", tools=[WEATHER]).json
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    chunks, done, _ = sse_chunks(chat(client, "SCRIPT:call", tools=[WEATHER], stream=True).text)
    assert done and streamed_text(chunks) == ""
    (delta,) = [c["choices"][0]["delta"]["tool_calls"] for c in chunks
                if c.get("choices") and "tool_calls" in c["choices"][0]["delta"]]
    assert delta[0]["index"] == 0 and delta[0]["function"]["name"] == "get_weather"
    assert json.loads(delta[0]["function"]["arguments"]) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_parallel_calls_and_parallel_tool_calls_false(client):
    calls = chat(client, "SCRIPT:two-calls", tools=[WEATHER, SEARCH]).json
    assert [c["function"]["name"] for c in calls["choices"][0]["message"]["tool_calls"]] == \
        ["get_weather", "search"]
    one = chat(client, "SCRIPT:two-calls", tools=[WEATHER, SEARCH],
               parallel_tool_calls=False).json
    assert [c["function"]["name"] for c in one["choices"][0]["message"]["tool_calls"]] == \
        ["get_weather"]
    assert one["usage"]["completion_tokens"] == calls["usage"]["completion_tokens"]


def test_undeclared_tool_falls_back_to_content_byte_for_byte(client, tools_harness):
    body = chat(client, "SCRIPT:unknown-tool", tools=[WEATHER]).json
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == \
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'


def test_tool_choice_none_hides_tools_and_parses_nothing(client):
    auto = chat(client, "SCRIPT:call", tools=[WEATHER]).json
    none = chat(client, "SCRIPT:call", tools=[WEATHER], tool_choice="none").json
    assert none["choices"][0]["message"]["content"] == CALL
    assert none["usage"]["prompt_tokens"] < auto["usage"]["prompt_tokens"]


def test_allowed_tools_filters_the_offered_set(client):
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "search"}}]}}
    body = chat(client, "SCRIPT:call", tools=[WEATHER, SEARCH], tool_choice=choice).json
    # get_weather is no longer offered: its call is text, not a structured call.
    assert body["choices"][0]["message"]["content"] == CALL
    choice["allowed_tools"]["tools"].append({"type": "function", "function": {"name": "nope"}})
    error = chat(client, "x", tools=[WEATHER, SEARCH], tool_choice=choice)
    assert error.json["error"]["param"] == "tool_choice.allowed_tools.tools[1]"


def test_required_tool_choice_forces_opener_and_offered_name(client):
    body = chat(client, "SCRIPT:prose", tools=[WEATHER], tool_choice="required").json
    message = body["choices"][0]["message"]
    # The first answer token became the call prefix, the name was completed to the offered
    # one; the scripted model then ran out of script (its end token), so the unfinished call
    # is returned as text.
    assert message["content"] == '<tool_call>\n{"name": "get_weather"'
    assert "tool_calls" not in message


def test_forcing_keeps_a_call_the_model_writes_anyway(client):
    body = chat(client, "SCRIPT:call", tools=[WEATHER], tool_choice="required").json
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"


def test_named_tool_choice_offers_and_forces_only_that_tool(client):
    named = {"type": "function", "function": {"name": "search"}}
    body = chat(client, "SCRIPT:search-call", tools=[WEATHER, SEARCH], tool_choice=named).json
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "search"
    missing = {"type": "function", "function": {"name": "nope"}}
    error = chat(client, "x", tools=[WEATHER], tool_choice=missing)
    assert error.status_code == 400 and error.json["error"]["param"] == "tool_choice"


def test_call_written_inside_an_unclosed_think_block(client):
    body = chat(client, "SCRIPT:think-call", tools=[WEATHER]).json
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "I need the weather."
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    chunks, _, _ = sse_chunks(chat(client, "SCRIPT:think-call", tools=[WEATHER],
                                   stream=True).text)
    assert "<tool_call>" not in streamed_text(chunks, "reasoning_content")


def test_tool_history_round_trip_renders_and_counts(client, default_tokenizer):
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]
    body = chat(client, None, messages=history + [{"role": "user", "content": "SCRIPT:prose"}],
                tools=[WEATHER]).json
    tool_json = json.dumps({"type": "function", "function": WEATHER["function"]})
    expected = (
        # (Hugging Face environments trim the newline after a block tag.)
        "<|im_start|>system\nTools:\n<tools>" + tool_json + "</tools><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nUse the tool.\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nSCRIPT:prose<|im_end|>\n<|im_start|>assistant\n")
    assert body["usage"]["prompt_tokens"] == len(default_tokenizer.encode(expected))
    legacy = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "function_call": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"role": "function", "name": "get_weather", "content": "18C"},
        {"role": "user", "content": "SCRIPT:prose"},
    ]
    assert chat(client, None, messages=legacy, tools=[WEATHER]).status_code == 200


def test_thinking_disabled_renders_the_empty_block(client, default_tokenizer):
    on = chat(client, "SCRIPT:prose").json["usage"]["prompt_tokens"]
    off = chat(client, "SCRIPT:prose", enable_thinking=False).json["usage"]["prompt_tokens"]
    effort_none = chat(client, "SCRIPT:prose", reasoning_effort="none").json
    kwargs_off = chat(client, "SCRIPT:prose", chat_template_kwargs={"enable_thinking": False}).json
    empty_block = len(default_tokenizer.encode("<think>\n\n</think>\n\n"))
    assert off - on == empty_block
    assert effort_none["usage"]["prompt_tokens"] == off
    assert kwargs_off["usage"]["prompt_tokens"] == off



def test_required_choice_turns_a_prose_reply_into_a_call(client, tools_harness):
    """A model that would answer in prose: the first answer token becomes the call prefix,
    its next token (not a tool name) becomes the offered name, and the model, continuing
    from there, writes the arguments: the reply is a structured call."""
    tokenizer = tools_harness.ctx.tokenizer
    prefix = len(tokenizer.encode('<tool_call>\n{"name": "', special=True))
    name = len(tokenizer.encode('get_weather"', special=False))
    sure = tokenizer.encode("Sure")[0]
    tail = tokenizer.encode(', "arguments": {"city": "Rome"}}\n</tool_call>')
    tools_harness.book.scripts["forced"] = ([sure] * (prefix + name) + tail
                                            + [tokenizer.eos_ids[0]])
    body = chat(client, "SCRIPT:forced", tools=[WEATHER], tool_choice="required").json
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    # Without forcing, the same model answers in prose.
    plain = chat(client, "SCRIPT:forced", tools=[WEATHER]).json
    assert plain["choices"][0]["message"]["content"].startswith("SureSure")
