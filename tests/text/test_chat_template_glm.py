"""Our GLM-4.5-style template (artifact/templates/glm4_5.jinja) rendered through ChatRenderer
with the GLM-layout vocabulary: the prompt prefix and role tokens, thinking on/off, tools,
a tool-call history re-rendered in the glm_xml format the parser reads back, and reasoning
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
    tokenizer = Tokenizer(qwen_tokenizer_json("glm4"), eos_ids=[0])
    chat_format = {"tool_call_format": "glm_xml",
                   "reasoning": {"open": "<think>", "close": "</think>"}}
    return ChatRenderer(builtin_template("glm4_5"), tokenizer, chat_format)


def render(renderer, messages, tools=(), **options):
    return renderer.render(Conversation(list(messages), list(tools), PromptOptions(**options)))


def test_turns_open_with_role_tokens_and_the_model_opens_its_own_think_block(renderer):
    prompt = render(renderer, [Message("system", "Be kind."), Message("user", "Hi")])
    assert prompt.text == "[gMASK]<sop><|system|>\nBe kind.<|user|>\nHi<|assistant|>"
    assert not prompt.starts_in_reasoning
    control = [renderer.tokenizer.token_to_id(t) for t in
               ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>")]
    assert all(i in prompt.ids for i in control)
    off = render(renderer, [Message("user", "Hi")], enable_thinking=False)
    assert off.text.endswith("<|assistant|>\n<think></think>") and not off.starts_in_reasoning


def test_a_tool_call_history_renders_in_the_format_the_parser_reads(renderer):
    call = ToolCall("c1", "get_weather", json.dumps({"city": "Paris", "days": 2}))
    prompt = render(renderer, [
        Message("user", "Weather?"),
        Message("assistant", "", reasoning="Need the tool.", tool_calls=[call]),
        Message("tool", "sunny", tool_call_id="c1"),
        Message("tool", "warm", tool_call_id="c1")], tools=[WEATHER])
    assert '"name": "get_weather"' in prompt.text.split("\n</tools>")[0]
    written = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
               "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>")
    assert ("<|assistant|>\n<think>Need the tool.</think>\n" + written
            + "<|observation|>\n<tool_response>\nsunny\n</tool_response>"
            "\n<tool_response>\nwarm\n</tool_response><|assistant|>") in prompt.text
    scan = tool_format("glm_xml", [WEATHER]).scan_call(written, 0, final=True)
    assert scan.status == COMPLETE and json.loads(scan.call.arguments) == {"city": "Paris",
                                                                           "days": 2}


def test_reasoning_of_earlier_turns_is_dropped_unless_preserved(renderer):
    history = [Message("user", "A"), Message("assistant", "B", reasoning="think B"),
               Message("user", "C")]
    assert "<|assistant|>\n<think></think>\nB<|user|>" in render(renderer, history).text
    kept = render(renderer, history, preserve_thinking=True).text
    assert "<|assistant|>\n<think>think B</think>\nB<|user|>" in kept
