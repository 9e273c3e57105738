"""GLM XML tool calls (`<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>...`)
through the streaming OutputParser: schema typing, values holding the closer, several calls,
every fallback reason, every split point, and a call written while thinking."""
import pytest

from test_tool_parsers import TOOLS, assert_split_invariant, parse


def glm_call(name, **params):
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                   for k, v in params.items())
    return f"<tool_call>{name}\n{body}</tool_call>"


def test_glm_values_typed_by_schema_at_every_split_point():
    text = "Checking.\n" + glm_call("get_weather", city="Paris", days="3", metric="true",
                                    tags='["a", 1]', free="plain words")
    reasoning, content, calls, report = assert_split_invariant(text, fmt="glm_xml")
    assert content == "Checking." and reasoning == ""
    assert calls == [("get_weather", {"city": "Paris", "days": 3, "metric": True,
                                      "tags": ["a", 1], "free": "plain words"})]
    assert report.num_calls == 1 and report.fallback_reason == "none"


def test_glm_string_value_keeps_markup_and_a_closer_not_followed_by_a_key():
    value = "a </arg_value> b\n<tool_call>x</tool_call> c"
    _, content, calls, _ = assert_split_invariant(glm_call("search", q=value), fmt="glm_xml")
    assert calls == [("search", {"q": value})] and content == ""


def test_glm_several_calls_and_a_call_without_arguments():
    text = glm_call("search", q="one") + "\n" + glm_call("get_weather")
    _, content, calls, _ = parse([text], "glm_xml")
    assert calls == [("search", {"q": "one"}), ("get_weather", {})] and content == ""


@pytest.mark.parametrize("text, reason", [
    (glm_call("lookup", q="x"), "undeclared_tool"),
    (glm_call("bad name", q="x"), "invalid_tool_name"),
    ("<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>a</arg_value>\n"
     "<arg_key>q</arg_key>\n<arg_value>b</arg_value>\n</tool_call>", "duplicate_parameter"),
    ("<tool_call>search\n<arg_value>a</arg_value>\n</tool_call>", "malformed_structure"),
    ("<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>a", "malformed_structure"),
    (glm_call("search", q="a") + " and more", "trailing_content"),
])
def test_glm_fallbacks_return_every_byte_as_content(text, reason):
    _, content, calls, report = parse([text], "glm_xml")
    assert calls == [] and content == text and report.fallback_reason == reason


def test_glm_call_written_while_thinking_is_the_call_when_the_reply_ends_inside():
    text = "<think>I should search. " + glm_call("search", q="cats")
    reasoning, content, calls, _ = parse([text], "glm_xml")
    assert reasoning == "I should search." and content == ""
    assert calls == [("search", {"q": "cats"})]


def test_glm_prose_streams_before_the_call():
    from ninfer_jax.text.output_parser import OutputParser
    from ninfer_jax.text.tool_parsers import tool_format

    parser = OutputParser(tool_format=tool_format("glm_xml", TOOLS))
    assert [p.text for p in parser.push("Sure thing. ")] == ["Sure thing."]
    assert parser.push("<tool_call>sea") == []
    assert parser.push("rch\n<arg_key>q</arg_key>\n<arg_value>x</arg_value>\n</tool_call>") == []
    assert parser.finish() == [] and [c.name for c in parser.calls] == ["search"]
