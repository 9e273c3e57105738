"""Nemotron tool calls (`<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>`) through
the streaming OutputParser with <think> markers: one opener holding several calls, strings
holding the closer, arguments as an object or a JSON string, every fallback reason, every
split point, and a call after the thoughts."""
import json

import pytest

from test_tool_parsers import TOOLS
from ninfer_jax.text.output_parser import OutputParser
from ninfer_jax.text.tool_parsers import tool_format


def parse(pieces):
    parser = OutputParser(reasoning_markers=("<think>", "</think>"),
                          tool_format=tool_format("nemotron", TOOLS))
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


def test_one_opener_holds_several_calls_at_every_split_point():
    text = ('<think>Two tools.</think>Checking. <TOOLCALL>[{"name": "get_weather", '
            '"arguments": {"city": "Paris", "days": 3}}, {"name": "search", "arguments": '
            '"{\\"q\\": \\"a </TOOLCALL> b\\"}"}]</TOOLCALL>')
    reasoning, content, calls, report = assert_split_invariant(text)
    assert reasoning == "Two tools." and content == "Checking."
    assert calls == [("get_weather", {"city": "Paris", "days": 3}),
                     ("search", {"q": "a </TOOLCALL> b"})]
    assert report.num_calls == 2 and report.fallback_reason == "none"


def test_a_call_without_arguments_and_a_second_opener():
    _, content, calls, _ = parse(['<TOOLCALL>[{"name": "get_weather"}]</TOOLCALL>\n'
                                  '<TOOLCALL>[{"name": "search", "arguments": {"q": "x"}}]'
                                  '</TOOLCALL>'])
    assert calls == [("get_weather", {}), ("search", {"q": "x"})] and content == ""


@pytest.mark.parametrize("text, reason", [
    ('<TOOLCALL>[{"name": "lookup", "arguments": {}}]</TOOLCALL>', "undeclared_tool"),
    ('<TOOLCALL>[{"name": "bad name", "arguments": {}}]</TOOLCALL>', "invalid_tool_name"),
    ('<TOOLCALL>[{"name": "search", "arguments": {"q": 1, "q": 2}}]</TOOLCALL>',
     "duplicate_parameter"),
    ('<TOOLCALL>{"name": "search", "arguments": {}}</TOOLCALL>', "malformed_structure"),
    ("<TOOLCALL>[]</TOOLCALL>", "malformed_structure"),
    ('<TOOLCALL>[{"name": "search", "arguments": {"q": "a', "malformed_structure"),
    ('<TOOLCALL>[{"name": "search", "arguments": {}}]</TOOLCALL> and more',
     "trailing_content"),
])
def test_fallbacks_return_every_byte_as_content(text, reason):
    _, content, calls, report = parse([text])
    assert calls == [] and content == text and report.fallback_reason == reason
