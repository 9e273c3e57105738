"""Our Gemma-4-style template (artifact/templates/gemma4.jinja) rendered through ChatRenderer
with the Gemma-layout stand-in vocabulary: <bos> and the turn markers as control tokens,
thinking on (<|think|> in the system turn) and off, tool declarations, a tool-call history
re-rendered in the gemma4 format the parser reads back with its results inside the same model
turn, and earlier thoughts dropped."""
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
Q = '<|"|>'


@pytest.fixture(scope="module")
def renderer():
    json_text = qwen_tokenizer_json("gemma4")
    probe = Tokenizer(json_text, eos_ids=[0])
    tokenizer = Tokenizer(json_text, eos_ids=[probe.token_to_id("<turn|>")],
                          bos_id=probe.token_to_id("<bos>"))
    chat_format = {"tool_call_format": "gemma4",
                   "reasoning": {"open": "<|channel>thought", "close": "<channel|>"}}
    return ChatRenderer(builtin_template("gemma4"), tokenizer, chat_format)


def render(renderer, messages, tools=(), **options):
    return renderer.render(Conversation(list(messages), list(tools), PromptOptions(**options)))


def test_turns_and_thinking(renderer):
    prompt = render(renderer, [Message("system", "Be kind."), Message("user", "Hi")])
    assert prompt.text == ("<bos><|turn>system\n<|think|>Be kind.<turn|>\n"
                           "<|turn>user\nHi<turn|>\n<|turn>model\n")
    control = [renderer.tokenizer.token_to_id(t)
               for t in ("<bos>", "<|turn>", "<turn|>", "<|think|>")]
    assert None not in control and all(i in prompt.ids for i in control)
    off = render(renderer, [Message("user", "Hi")], enable_thinking=False)
    assert off.text == "<bos><|turn>user\nHi<turn|>\n<|turn>model\n"


def test_a_tool_call_history_renders_in_the_format_the_parser_reads(renderer):
    call = ToolCall("c1", "get_weather", json.dumps({"city": "Paris", "days": 2}))
    prompt = render(renderer, [
        Message("user", "Weather?"),
        Message("assistant", "", reasoning="Need the tool.", tool_calls=[call]),
        Message("tool", "sunny", tool_call_id="c1")], tools=[WEATHER],
        enable_thinking=False)
    assert prompt.text.startswith('<bos><|turn>system\n<|tool>declaration:get_weather{"name": '
                                  '"get_weather"')
    written = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2}}<tool_call|>"
    assert prompt.text.endswith(
        "<|turn>user\nWeather?<turn|>\n<|turn>model\n" + written
        + f"<|tool_response>response:get_weather{{value:{Q}sunny{Q}}}<tool_response|>")
    assert "Need the tool." not in prompt.text
    scan = tool_format("gemma4", [WEATHER]).scan_call(written, 0, final=True)
    assert scan.status == COMPLETE and json.loads(scan.call.arguments) == {"city": "Paris",
                                                                           "days": 2}


def test_a_finished_answer_closes_the_model_turn(renderer):
    history = [Message("user", "A"), Message("assistant", "B", reasoning="think B"),
               Message("user", "C")]
    text = render(renderer, history, enable_thinking=False).text
    assert "<|turn>model\nB<turn|>\n<|turn>user\nC<turn|>\n<|turn>model\n" in text
    assert "think B" not in text
