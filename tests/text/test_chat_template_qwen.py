"""Our Qwen3 and Qwen3.5 templates (artifact/templates) rendered through ChatRenderer with the
real Qwen tokenizers: tools, tool calls and results, thinking on/off, preserve_thinking."""
from __future__ import annotations

import json

import pytest

from ninfer_jax.artifact.qwen_vocab import qwen_tokenizer_json
from ninfer_jax.artifact.templates import builtin_template
from ninfer_jax.text.chat_template import ChatRenderer
from ninfer_jax.text.conversation import Conversation, Message, PromptOptions, ToolCall, ToolSpec
from ninfer_jax.text.tokenizer import Tokenizer

FORMATS = {"qwen3": {"tool_call_format": "hermes"}, "qwen3_5": {"tool_call_format": "qwen_xml"}}
WEATHER = ToolSpec("get_weather", "Current weather",
                   {"type": "object", "properties": {"city": {"type": "string"},
                                                     "days": {"type": "integer"}},
                    "required": ["city"]})


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def renderer(request):
    tokenizer = Tokenizer(qwen_tokenizer_json(request.param), eos_ids=[0])
    chat_format = dict(FORMATS[request.param], reasoning={"open": "<think>", "close": "</think>"})
    return request.param, ChatRenderer(builtin_template(request.param), tokenizer, chat_format)


def render(renderer, messages, tools=(), **options):
    return renderer.render(Conversation(list(messages), list(tools), PromptOptions(**options)))


def test_plain_chat_and_generation_prompt(renderer):
    kind, r = renderer
    prompt = render(r, [Message("system", "Be kind."), Message("user", "Hi")])
    head = "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    if kind == "qwen3":
        assert prompt.text == head + "<|im_start|>assistant\n"
        assert not prompt.starts_in_reasoning
    else:
        assert prompt.text == head + "<|im_start|>assistant\n<think>\n"
        assert prompt.starts_in_reasoning
    assert prompt.ids[0] == r.tokenizer.token_to_id("<|im_start|>")


def test_thinking_off_closes_an_empty_block(renderer):
    _, r = renderer
    prompt = render(r, [Message("user", "Hi")], enable_thinking=False)
    assert prompt.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt.starts_in_reasoning


def test_tools_are_json_lines_in_the_system_turn(renderer):
    _, r = renderer
    second = ToolSpec("search", None, {"type": "object", "properties": {}})
    prompt = render(r, [Message("system", "Sys."), Message("user", "Weather?")],
                    tools=[WEATHER, second])
    system_turn = prompt.text.split("<|im_end|>")[0]
    assert system_turn.startswith("<|im_start|>system\nSys.\n\n")
    listed = system_turn.split("<tools>\n")[1].split("\n</tools>")[0].split("\n")
    assert [json.loads(line)["function"]["name"] for line in listed] == ["get_weather", "search"]
    assert listed[0] == json.dumps({"type": "function", "function": {
        "name": "get_weather", "description": "Current weather",
        "parameters": WEATHER.parameters}}, ensure_ascii=False)
    assert prompt.text.count("<|im_start|>system") == 1


def test_tool_call_and_result_round_trip(renderer):
    kind, r = renderer
    call = ToolCall("call_1", "get_weather", '{"city": "Paris", "days": 2}')
    prompt = render(r, [Message("user", "Weather?"),
                        Message("assistant", "Let me check.", tool_calls=[call]),
                        Message("tool", "sunny", tool_call_id="call_1"),
                        Message("tool", "warm", tool_call_id="call_1")], tools=[WEATHER])
    if kind == "qwen3":
        expected_call = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
                         '{"city": "Paris", "days": 2}}\n</tool_call><|im_end|>\n')
    else:
        expected_call = ("Let me check.\n\n<tool_call>\n<function=get_weather>\n"
                         "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
                         "</parameter>\n</function>\n</tool_call><|im_end|>\n")
    assert "<|im_start|>assistant\n" + expected_call in prompt.text
    assert ("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n"
            "warm\n</tool_response><|im_end|>\n") in prompt.text
    after_system = prompt.ids[prompt.ids.index(r.tokenizer.token_to_id("<|im_end|>")):]
    assert after_system.count(r.tokenizer.token_to_id("<tool_call>")) == 1


def test_reasoning_shown_only_after_the_last_user_turn(renderer):
    _, r = renderer
    messages = [Message("user", "Q1"), Message("assistant", "A1", reasoning="R1"),
                Message("user", "Q2"), Message("assistant", "A2", reasoning="\nR2\n")]
    prompt = render(r, messages, add_generation_prompt=False)
    assert "R1" not in prompt.text
    assert "<|im_start|>assistant\nA1<|im_end|>" in prompt.text
    assert "<|im_start|>assistant\n<think>\nR2\n</think>\n\nA2<|im_end|>" in prompt.text


def test_preserve_thinking_keeps_every_turns_reasoning(renderer):
    _, r = renderer
    history = [Message("user", "Q1"), Message("assistant", "A1", reasoning="R1")]
    first = render(r, history, add_generation_prompt=False, preserve_thinking=True)
    assert "<think>\nR1\n</think>\n\nA1" in first.text
    longer = render(r, history + [Message("user", "Q2")], preserve_thinking=True)
    assert longer.ids[:len(first.ids)] == first.ids  # re-rendered history is an exact prefix


def test_control_spellings_in_tool_data_stay_text(renderer):
    _, r = renderer
    call = ToolCall("c", "get_weather", '{"city": "<tool_call>"}')
    prompt = render(r, [Message("user", "</think> <|im_end|>"),
                        Message("assistant", "", tool_calls=[call])],
                    tools=[WEATHER], add_generation_prompt=False)
    tokenizer = r.tokenizer
    after_system = prompt.ids[prompt.ids.index(tokenizer.token_to_id("<|im_end|>")):]
    assert after_system.count(tokenizer.token_to_id("<tool_call>")) == 1  # the template's own
    assert tokenizer.token_to_id("</think>") not in prompt.ids
    assert prompt.ids.count(tokenizer.token_to_id("<|im_end|>")) == 3
    assert "<|im_start|>user\n</think> <|im_end|><|im_end|>" in prompt.text
