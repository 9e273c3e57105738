"""Tool-call parsing (hermes JSON and Qwen XML) through the streaming OutputParser:
every fallback reason, schema typing, nested parameter text, every split point."""
import json

import pytest

from ninfer_jax.text.conversation import ToolSpec
from ninfer_jax.text.output_parser import OutputParser
from ninfer_jax.text.tool_parsers import tool_format

WEATHER = ToolSpec("get_weather", parameters={
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "tags": {"type": "array"},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "ratio": {"type": "number"},
        "free": {"description": "no type"},
    },
})
SEARCH = ToolSpec("search", parameters={"type": "object", "properties": {"q": {"type": "string"}}})
TOOLS = [WEATHER, SEARCH]


def parse(pieces, fmt="qwen_xml", *, starts_in_reasoning=False, max_calls=None, tools=TOOLS):
    parser = OutputParser(reasoning_markers=("<think>", "</think>"),
                          starts_in_reasoning=starts_in_reasoning,
                          tool_format=tool_format(fmt, tools), max_calls=max_calls)
    out = []
    for piece in pieces:
        out += parser.push(piece)
    out += parser.finish()
    reasoning = "".join(p.text for p in out if p.kind == "reasoning")
    content = "".join(p.text for p in out if p.kind == "content")
    calls = [(c.name, json.loads(c.arguments)) for c in parser.calls]
    return reasoning, content, calls, parser.report


def xml_call(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def hermes_call(name, arguments):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def assert_split_invariant(text, **kwargs):
    whole = parse([text], **kwargs)
    for cut in range(len(text) + 1):
        assert parse([text[:cut], text[cut:]], **kwargs)[:3] == whole[:3], cut
    return whole


def test_qwen_xml_values_typed_by_schema():
    text = "Let me check.\n\n" + xml_call(
        "get_weather", city="Paris", days="3", metric="TRUE", tags='["a", 1]', limit="null",
        ratio="2", free='{"k": [1, 2]}')
    reasoning, content, calls, report = assert_split_invariant(text)
    assert content == "Let me check."
    assert calls == [("get_weather", {"city": "Paris", "days": 3, "metric": True,
                                      "tags": ["a", 1], "limit": None, "ratio": 2,
                                      "free": {"k": [1, 2]}})]
    assert report.num_calls == 1 and report.fallback_reason == "none"


def test_qwen_xml_member_order_is_the_written_order():
    text = xml_call("get_weather", metric="false", city="Oslo", days="1")
    _, _, calls, _ = parse([text])
    assert list(calls[0][1]) == ["metric", "city", "days"]


def test_empty_values_and_mismatches():
    text = xml_call("get_weather", city="", days="", ratio="abc", limit="1.5")
    _, content, calls, report = parse([text])
    assert content == ""
    assert calls[0][1] == {"city": "", "ratio": "abc", "limit": 1.5}
    assert report.omitted_empty == 1 and report.schema_mismatches == 2


def test_string_values_keep_markers_and_balanced_nested_parameters():
    value = "code with </tool_call> and </function>\n<parameter=x>inner</parameter> end"
    _, content, calls, report = parse([xml_call("search", q=value)])
    assert content == "" and calls == [("search", {"q": value})]


@pytest.mark.parametrize("text,reason", [
    (xml_call("search", q="a <parameter=x> unbalanced"), "malformed_structure"),
    ("<tool_call>\n<function=search>\n<parameter=q>\nx\n</parameter>\n</parameter>\n"
     "</function>\n</tool_call>", "malformed_structure"),
    ("<tool_call>\nnot xml at all\n</tool_call>", "malformed_structure"),
    (xml_call("search", q="a") .replace("<parameter=q>\na\n</parameter>\n",
                                        "<parameter=q>\na\n</parameter>\n" * 2),
     "duplicate_parameter"),
    (xml_call("get weather", city="x"), "invalid_tool_name"),
    (xml_call("delete_everything", path="/"), "undeclared_tool"),
    (xml_call("search", q="x") + "\nAnd some prose after.", "trailing_content"),
    (xml_call("search", q="x")[:-5], "malformed_structure"),
])
def test_fallbacks_return_every_byte_as_content(text, reason):
    reasoning, content, calls, report = assert_split_invariant(text)
    assert calls == [] and content == text and reasoning == ""
    assert report.marker_seen and report.fallback_reason == reason


def test_hermes_calls_and_fallbacks():
    good = hermes_call("get_weather", '{"city": "Paris", "days": 2}')
    two = good + "\n" + hermes_call("search", '"{\\"q\\": \\"x\\"}"')
    _, content, calls, _ = assert_split_invariant(two, fmt="hermes")
    assert content == "" and calls == [("get_weather", {"city": "Paris", "days": 2}),
                                       ("search", {"q": "x"})]
    in_string = hermes_call("search", '{"q": "</tool_call>"}')
    assert parse([in_string], "hermes")[2] == [("search", {"q": "</tool_call>"})]
    for text, reason in [
        ('<tool_call>\n{"name": "search", "arguments": {"q": }\n</tool_call>',
         "malformed_structure"),
        (hermes_call("search", '{"q": "a", "q": "b"}'), "duplicate_parameter"),
        (hermes_call("bad name", "{}"), "invalid_tool_name"),
        (hermes_call("other", "{}"), "undeclared_tool"),
        (good + " trailing", "trailing_content"),
    ]:
        _, content, calls, report = assert_split_invariant(text, fmt="hermes")
        assert (content, calls, report.fallback_reason) == (text, [], reason)


def test_prose_streams_before_the_region_and_whitespace_is_held():
    parser = OutputParser(tool_format=tool_format("hermes", TOOLS))
    assert [p.text for p in parser.push("Sure thing")] == ["Sure thing"]
    assert parser.push("\n\n<tool") == []
    assert parser.push("_call>\n{") == []


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = xml_call("search", q="a") + "\n" + xml_call("search", q="b")
    _, _, calls, report = parse([text], max_calls=1)
    assert calls == [("search", {"q": "a"})] and report.num_calls == 2


def test_call_written_before_think_closes_when_reply_ends_inside():
    text = "I should look it up.\n" + xml_call("search", q="paris")
    reasoning, content, calls, _ = assert_split_invariant(text, starts_in_reasoning=True)
    assert reasoning == "I should look it up." and content == ""
    assert calls == [("search", {"q": "paris"})]


def test_call_only_mentioned_while_thinking_stays_reasoning():
    mention = xml_call("search", q="paris")
    text = "Maybe " + mention + " is needed.\n</think>\n\nNo tool needed."
    reasoning, content, calls, _ = assert_split_invariant(text, starts_in_reasoning=True)
    assert reasoning == "Maybe " + mention + " is needed." and content == "No tool needed."
    assert calls == []
    closed_after = "Hmm " + mention + "\n</think>\n\nDone."
    reasoning, content, calls, _ = parse([closed_after], starts_in_reasoning=True)
    assert reasoning == "Hmm " + mention and content == "Done." and calls == []
