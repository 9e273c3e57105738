"""Gemma 4 tool calls (`<|tool_call>call:NAME{key:<|"|>text<|"|>,...}<tool_call|>`) through the
streaming OutputParser with Gemma's thought-channel markers: typed values, nested objects and
arrays, strings holding the closer, several calls, every fallback reason, every split point,
and a call after the thoughts."""
import json

import pytest

from test_tool_parsers import TOOLS
from ninfer_jax.text.output_parser import OutputParser
from ninfer_jax.text.tool_parsers import tool_format

Q = '<|"|>'
MARKERS = ("<|channel>thought", "<channel|>")


def parse(pieces, *, tools=TOOLS):
    parser = OutputParser(reasoning_markers=MARKERS, tool_format=tool_format("gemma4", tools))
    out = [piece for text in pieces for piece in parser.push(text)] + parser.finish()
    reasoning = "".join(p.text for p in out if p.kind == "reasoning")
    content = "".join(p.text for p in out if p.kind == "content")
    return reasoning, content, [(c.name, json.loads(c.arguments)) for c in parser.calls], \
        parser.report


def assert_split_invariant(text):
    whole = parse([text])
    for cut in range(len(text) + 1):
        assert parse([text[:cut], text[cut:]])[:3] == whole[:3], cut
    return whole


def test_gemma_values_keep_their_types_at_every_split_point():
    text = (f"Checking.<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3,delta:-2.5e-1,"
            f'metric:true,tags:[{Q}a{Q},1.5,null],free:"json text",'
            f"opts:{{unit:{Q}C{Q}}}}}<tool_call|>")
    reasoning, content, calls, report = assert_split_invariant(text)
    assert content == "Checking." and reasoning == ""
    assert calls == [("get_weather", {"city": "Paris", "days": 3, "delta": -0.25, "metric": True,
                                      "tags": ["a", 1.5, None], "free": "json text",
                                      "opts": {"unit": "C"}})]
    assert report.num_calls == 1 and report.fallback_reason == "none"


def test_gemma_string_holds_the_closer_and_braces():
    value = "a <tool_call|> {b}, c:d"
    _, content, calls, _ = assert_split_invariant(
        f"<|tool_call>call:search{{q:{Q}{value}{Q}}}<tool_call|>")
    assert calls == [("search", {"q": value})] and content == ""


def test_gemma_several_calls_and_one_without_arguments():
    text = (f"<|tool_call>call:search{{q:{Q}one{Q}}}<tool_call|>"
            "<|tool_call>call:get_weather{}<tool_call|>")
    _, content, calls, _ = parse([text])
    assert calls == [("search", {"q": "one"}), ("get_weather", {})] and content == ""


def test_gemma_call_after_the_thought_channel():
    text = (f"<|channel>thought\nI should search.<channel|>"
            f"<|tool_call>call:search{{q:{Q}cats{Q}}}<tool_call|>")
    reasoning, content, calls, _ = assert_split_invariant(text)
    assert reasoning == "I should search." and content == ""
    assert calls == [("search", {"q": "cats"})]


@pytest.mark.parametrize("text, reason", [
    (f"<|tool_call>call:lookup{{q:{Q}x{Q}}}<tool_call|>", "undeclared_tool"),
    (f"<|tool_call>call:bad name{{q:{Q}x{Q}}}<tool_call|>", "invalid_tool_name"),
    (f"<|tool_call>call:search{{q:{Q}a{Q},q:{Q}b{Q}}}<tool_call|>", "duplicate_parameter"),
    (f"<|tool_call>call:search{{q {Q}a{Q}}}<tool_call|>", "malformed_structure"),
    (f"<|tool_call>search{{q:{Q}a{Q}}}<tool_call|>", "malformed_structure"),
    (f"<|tool_call>call:search{{q:{Q}a", "malformed_structure"),
    (f"<|tool_call>call:search{{q:{Q}a{Q}}}<tool_call|> and more", "trailing_content"),
])
def test_gemma_fallbacks_return_every_byte_as_content(text, reason):
    _, content, calls, report = parse([text])
    assert calls == [] and content == text and report.fallback_reason == reason


def test_gemma_prose_streams_before_the_call():
    parser = OutputParser(tool_format=tool_format("gemma4", TOOLS))
    assert [p.text for p in parser.push("Sure thing. ")] == ["Sure thing."]
    assert parser.push("<|tool_ca") == []
    assert parser.push(f"ll>call:search{{q:{Q}x{Q}}}<tool_call|>") == []
    assert parser.finish() == [] and [c.name for c in parser.calls] == ["search"]
