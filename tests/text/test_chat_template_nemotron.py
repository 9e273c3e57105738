"""Our Nemotron-style template (artifact/templates/nemotron_h.jinja) rendered through
ChatRenderer with the Nemotron-layout vocabulary: the turn openers, thinking on/off, tools, a
tool-call history re-rendered in the <TOOLCALL> format the parser reads back, and reasoning
kept only after the last user turn."""
from __future__ import annotations

import json

import pytest

from ninfer_jax.artifact.qwen_vocab import qwen_tokenizer_json
from ninfer_jax.artifact.templates import builtin_template
from ninfer_jax.text.chat_template import ChatRenderer
from ninfer_jax.text.conversation import Conversation, Message, PromptOptions, ToolCall, ToolSpec
from ninfer_jax.text.tokenizer import Tokenizer
from ninfer_jax.text.tool_parsers import COMPLETE, tool_format

WEATHER = ToolSpec("get_weather", "Current weather",
                   {"type": "object", "properties": {"city": {"type": "string"},
                                                     "days": {"type": "integer"}}})


@pytest.fixture(scope="module")
def renderer():
    tokenizer = Tokenizer(qwen_tokenizer_json("nemotron"), eos_ids=[0])
    chat_format = {"tool_call_format": "nemotron",
                   "reasoning": {"open": "<think>", "close": "</think>"}}
    return ChatRenderer(builtin_template("nemotron_h"), tokenizer, chat_format)


def render(renderer, messages, tools=(), **options):
    return renderer.render(Conversation(list(messages), list(tools), PromptOptions(**options)))


def test_turns_open_with_special_tokens_and_the_model_opens_its_own_think_block(renderer):
    prompt = render(renderer, [Message("system", "Be kind."), Message("user", "Hi")])
    assert prompt.text == ("<SPECIAL_10>System\nBe kind.\n<SPECIAL_11>User\nHi\n"
                           "<SPECIAL_11>Assistant\n")
    assert not prompt.starts_in_reasoning
    control = [renderer.tokenizer.token_to_id(t) for t in ("<SPECIAL_10>", "<SPECIAL_11>")]
    assert all(i in prompt.ids for i in control)
    off = render(renderer, [Message("user", "Hi")], enable_thinking=False)
    assert off.text.endswith("<SPECIAL_11>Assistant\n<think></think>")


def test_a_tool_call_history_renders_in_the_format_the_parser_reads(renderer):
    calls = [ToolCall("c1", "get_weather", json.dumps({"city": "Paris", "days": 2})),
             ToolCall("c2", "get_weather", json.dumps({"city": "Oslo"}))]
    prompt = render(renderer, [
        Message("user", "Weather?"),
        Message("assistant", "", reasoning="Need the tool.", tool_calls=calls),
        Message("tool", "sunny", tool_call_id="c1"),
        Message("tool", "cold", tool_call_id="c2")], tools=[WEATHER])
    tools = prompt.text.split("<AVAILABLE_TOOLS>")[1].split("</AVAILABLE_TOOLS>")[0]
    assert json.loads(tools)[0]["function"]["name"] == "get_weather"
    written = ('<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
               '{"name": "get_weather", "arguments": {"city": "Oslo"}}]</TOOLCALL>')
    assert ("<SPECIAL_11>Assistant\n<think>Need the tool.</think>" + written
            + "<SPECIAL_12>\n<SPECIAL_11>User\n<TOOL_RESPONSE>sunny</TOOL_RESPONSE>\n"
            "<TOOL_RESPONSE>cold</TOOL_RESPONSE>\n<SPECIAL_11>Assistant\n") in prompt.text
    scan = tool_format("nemotron", [WEATHER]).scan_call(written, 0, final=True)
    assert scan.status == COMPLETE
    assert [json.loads(c.arguments) for c in scan.calls] == [{"city": "Paris", "days": 2},
                                                              {"city": "Oslo"}]


def test_reasoning_of_earlier_turns_is_dropped_unless_preserved(renderer):
    history = [Message("user", "A"), Message("assistant", "B", reasoning="think B"),
               Message("user", "C")]
    assert "Assistant\n<think></think>B<SPECIAL_12>" in render(renderer, history).text
    kept = render(renderer, history, preserve_thinking=True).text
    assert "Assistant\n<think>think B</think>B<SPECIAL_12>" in kept
