"""Anthropic Messages parsing: history lowering, thinking, tools, cache markers, errors."""
import pytest

from ninfer_jax.errors import InvalidRequest, NinferError
from ninfer_jax.serve.anthropic.request import parse_request

DEFAULT_MAX = 8192
VOCAB = 49152
TOOL = {"name": "get_weather", "description": "Weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def _parse(count_only=False, **body):
    body.setdefault("model", "any-label")
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return parse_request(body, default_max_tokens=DEFAULT_MAX, vocab_size=VOCAB,
                         count_only=count_only)


def _error(**body):
    with pytest.raises(InvalidRequest) as info:
        _parse(**body)
    return info.value.param, info.value.code


def _roles(request):
    return [(m.role, m.content) for m in request.conversation.messages]


def test_plain_request_defaults():
    request = _parse()
    assert request.model == "any-label" and request.max_tokens is None
    assert _roles(request) == [("user", "Hi")]
    options = request.conversation.options
    assert options.add_generation_prompt and not options.continue_final_message
    assert options.enable_thinking is None and request.thinking_budget is None


def test_system_blocks_and_billing_header_rule():
    billing = {"type": "text", "text": "x-anthropic-billing-header: cc_version=1",
               "cache_control": {"type": "ephemeral"}}
    request = _parse(system=[billing, {"type": "text", "text": "Be "},
                             {"type": "text", "text": "kind."}])
    assert _roles(request)[0] == ("system", "Be kind.")
    assert not request.conversation.messages[0].cache_breakpoint  # consumed, not moved
    # Positional: a later block or a string system keeps the text.
    request = _parse(system=[{"type": "text", "text": "A"}, billing])
    assert _roles(request)[0][1] == "Ax-anthropic-billing-header: cc_version=1"
    request = _parse(system="x-anthropic-billing-header: y")
    assert _roles(request)[0] == ("system", "x-anthropic-billing-header: y")
    # An inline system message is ordinary content too.
    request = _parse(messages=[{"role": "user", "content": "q"},
                               {"role": "system", "content": "x-anthropic-billing-header: z"},
                               {"role": "user", "content": "r"}])
    assert _roles(request) == [("user", "q"), ("system", "x-anthropic-billing-header: z"),
                               ("user", "r")]


def test_consecutive_same_role_messages_join_without_separator():
    request = _parse(messages=[{"role": "user", "content": "a"},
                               {"role": "user", "content": [{"type": "text", "text": "b"}]},
                               {"role": "assistant", "content": "c"},
                               {"role": "assistant", "content": "d"},
                               {"role": "user", "content": "e"}])
    assert _roles(request) == [("user", "ab"), ("assistant", "cd"), ("user", "e")]


def test_assistant_prefill_and_its_limits():
    request = _parse(messages=[{"role": "user", "content": "q"},
                               {"role": "assistant", "content": "The answer is"}])
    options = request.conversation.options
    assert options.continue_final_message and not options.add_generation_prompt
    assert _error(messages=[{"role": "user", "content": "q"},
                            {"role": "assistant", "content": "x"}],
                  thinking={"type": "adaptive"}) == ("thinking", "invalid_request")
    assert _error(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "t", "signature": "s"}]}])[0] == "messages[1].content[0].type"


def test_thinking_history_and_tool_round_trip():
    request = _parse(tools=[TOOL], messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "need tool", "signature": "opaque"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris", "units": "c"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "hot"},
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": [{"type": "text", "text": "fail"}]},
            {"type": "text", "text": "Thanks"}]}])
    messages = request.conversation.messages
    turn = messages[1]
    assert turn.reasoning == "need tool" and turn.content == "Checking."
    assert [(c.id, c.arguments) for c in turn.tool_calls] == [
        ("toolu_1", '{"city": "Paris", "units": "c"}'), ("toolu_2", '{"city": "Rome"}')]
    assert [(m.role, m.tool_call_id, m.content, m.is_error) for m in messages[2:]] == [
        ("tool", "toolu_1", "fail", True), ("tool", "toolu_2", "hot", False),
        ("user", None, "Thanks", False)]


@pytest.mark.parametrize("messages, param", [
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
      {"role": "user", "content": "no results"}], "messages[2].content"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
      {"role": "user", "content": []}], "messages"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9"}]}],
     "messages[2].content[0].tool_use_id"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
      {"role": "user", "content": [{"type": "text", "text": "x"},
                                   {"type": "tool_result", "tool_use_id": "t1"}]}],
     "messages[2].content[1]"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}],
     "messages[2].content[0].tool_use_id"),
])
def test_tool_result_matching_rules(messages, param):
    assert _error(messages=messages) == (param, "invalid_tool_history")


def test_duplicate_tool_use_id_is_named_on_the_tool_use():
    turn = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}
    results = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}
    assert _error(messages=[{"role": "user", "content": "q"}, turn, results]) == (
        "messages[1].content[1].id", "invalid_tool_history")


def test_empty_content_list_is_an_empty_turn_like_an_empty_string():
    for empty in ([], ""):
        request = _parse(messages=[{"role": "user", "content": empty}])
        assert _roles(request) == [("user", "")]
        request = _parse(messages=[{"role": "user", "content": "q"},
                                   {"role": "assistant", "content": "a"},
                                   {"role": "user", "content": empty}])
        assert _roles(request) == [("user", "q"), ("assistant", "a"), ("user", "")]


@pytest.mark.parametrize("body, param", [
    ({"system": 5}, "system"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": {"text": "x"}}]}]},
     "messages[0].content[0].content"),
])
def test_content_type_errors_name_both_accepted_forms(body, param):
    with pytest.raises(InvalidRequest) as info:
        _parse(**body)
    assert info.value.param == param
    assert "a string or an array of content blocks" in info.value.message


@pytest.mark.parametrize("kind", [None, ["text"], {"type": "text"}, 3])
def test_a_block_type_that_is_no_string_is_a_400_on_it(kind):
    for body in ({"messages": [{"role": "user", "content": [{"type": kind, "text": "x"}]}]},
                 {"system": [{"type": kind, "text": "x"}]}):
        param = "system[0].type" if "system" in body else "messages[0].content[0].type"
        assert _error(**body) == (param, "invalid_request")


def test_bound_messages_name_only_real_bounds():
    with pytest.raises(InvalidRequest) as info:
        _parse(top_k=50)
    assert info.value.message == "'top_k' must be <= 20, got 50."


def test_history_may_begin_with_results():
    request = _parse(messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "old", "content": "r"},
        {"type": "text", "text": "go on"}]}])
    assert _roles(request) == [("tool", "r"), ("user", "go on")]


def test_assistant_block_order():
    assert _error(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "text", "text": "a"}, {"type": "thinking", "thinking": "t", "signature": ""}]},
        {"role": "user", "content": "r"}]) == ("messages[1].content[1]", "invalid_assistant_history")


@pytest.mark.parametrize("body, expected", [
    ({"max_tokens": 0}, ("max_tokens", "invalid_request")),
    ({"max_tokens": -3}, ("max_tokens", "invalid_request")),
    ({"model": ""}, ("model", "invalid_request")),
    ({"messages": []}, ("messages", "invalid_request")),
    ({"messages": [{"role": "robot", "content": "x"}]}, ("messages[0].role", "invalid_request")),
    ({"temperature": 1.5}, ("temperature", "invalid_request")),
    ({"top_k": 50}, ("top_k", "invalid_request")),
    ({"stop_sequences": ["ok", ""]}, ("stop_sequences[1]", "invalid_request")),
    ({"thinking": {"type": "enabled", "budget_tokens": 512}, "max_tokens": 4000},
     ("thinking.budget_tokens", "invalid_request")),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 2048},
     ("thinking.budget_tokens", "invalid_request")),
    ({"thinking": {"type": "enabled"}}, ("thinking.budget_tokens", "invalid_request")),
    ({"thinking": {"type": "adaptive", "display": "omitted"}},
     ("thinking.display", "unsupported_parameter")),
    ({"thinking": {"type": "sometimes"}}, ("thinking.type", "invalid_request")),
    ({"tool_choice": {"type": "any"}}, ("tool_choice", "invalid_request")),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [TOOL]},
     ("tool_choice.name", "invalid_request")),
    ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}, "tools": [TOOL]},
     ("tool_choice.disable_parallel_tool_use", "invalid_request")),
    ({"top_k": 21}, ("top_k", "invalid_request")),
    ({"tools": [{**TOOL, "strict": True}]}, ("tools[0].strict", "unsupported_parameter")),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     ("tools[0].type", "unsupported_parameter")),
    ({"tools": [{**TOOL, "defer_loading": True}]}, ("tools[0].defer_loading", "unsupported_parameter")),
    ({"tools": [{"name": "f"}]}, ("tools[0].input_schema", "invalid_request")),
    ({"tools": [TOOL, TOOL]}, ("tools[1].name", "invalid_request")),
    ({"container": "c"}, ("container", "unsupported_parameter")),
    ({"mcp_servers": [{}]}, ("mcp_servers", "unsupported_parameter")),
    ({"output_config": {"format": {"type": "json_schema"}}},
     ("output_config.format", "unsupported_parameter")),
    ({"output_config": {"effort": "huge"}}, ("output_config.effort", "invalid_request")),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     ("messages[0].content[0]", "vision_disabled")),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     ("messages[0].content[0].type", "unsupported_parameter")),
    ({"messages": [{"role": "user", "content": [{"type": "search_result"}]}]},
     ("messages[0].content[0].type", "unsupported_parameter")),
    ({"thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": True}},
     ("chat_template_kwargs.enable_thinking", "conflicting_template_option")),
])
def test_error_contracts(body, expected):
    assert _error(**body) == expected


def test_thinking_modes_and_effort():
    request = _parse(thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=2000)
    assert request.thinking_budget == 1024 and request.conversation.options.enable_thinking
    assert _parse(thinking={"type": "disabled"}).conversation.options.enable_thinking is False
    request = _parse(thinking={"type": "adaptive"}, output_config={"effort": "high"})
    assert request.conversation.options.enable_thinking is True
    assert request.conversation.options.reasoning_effort == "high"
    # Budget checked against the server default when max_tokens is omitted.
    assert _parse(thinking={"type": "enabled", "budget_tokens": 4096}).thinking_budget == 4096


def test_advisory_fields_accepted_and_sampling_kept():
    request = _parse(metadata={"user_id": "u"}, service_tier="auto", inference_geo="us",
                     speed="fast", context_management={"edits": []}, temperature=0.5,
                     top_p=0.9, top_k=10, stop_sequences=["END"], stream=True, max_tokens=64)
    assert (request.temperature, request.top_p, request.engine.sampling["top_k"]) == (
        0.5, 0.9, 10)
    assert request.stop_sequences == ("END",) and request.stream and request.max_tokens == 64


@pytest.mark.parametrize("body, param", [
    ({"metadata": "u"}, "metadata"), ({"metadata": {"user_id": 7}}, "metadata.user_id"),
    ({"service_tier": "priority"}, "service_tier"), ({"speed": "turbo"}, "speed"),
    ({"inference_geo": 1}, "inference_geo"),
])
def test_advisory_fields_are_validated(body, param):
    assert _error(**body)[0] == param


@pytest.mark.parametrize("count_only", [False, True])
def test_unknown_top_level_field_is_ignored(count_only):
    """serving.md: unknown advisory fields do not block an executable request (the service
    names them in a log warning; tests/serve/test_engine_fields.py)."""
    plain = _parse(count_only=count_only)
    odd = _parse(count_only=count_only, some_future_hint=True)
    assert odd.conversation.messages == plain.conversation.messages


@pytest.mark.parametrize("body, expected", [
    ({"output_format": {"type": "json_schema"}}, ("output_format", "unsupported_parameter")),
    ({"diagnostics": {"previous_message_id": "msg_1"}}, ("diagnostics",
                                                         "unsupported_parameter")),
    ({"context_management": {"edits": [{"type": "clear_thinking_20251015"}]}},
     ("context_management.edits[0].keep", "unsupported_parameter")),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919",
                                        "trigger": {"type": "tool_uses", "value": 3}}]}},
     ("context_management.edits[0].trigger.type", "unsupported_parameter")),
    ({"context_management": {"edits": [{"type": "compact"}]}},
     ("context_management.edits[0].type", "invalid_request")),
    ({"context_management": {"edits": "all"}}, ("context_management.edits", "invalid_request")),
])
def test_unprovidable_fields_are_refused(body, expected):
    assert _error(**body) == expected


def test_context_edits_that_cannot_change_the_prompt_are_read():
    """The lowest clear_tool_uses trigger goes to the service (which compares it with the
    context window); keeping every thinking turn changes nothing."""
    edits = [{"type": "clear_thinking_20251015", "keep": "all"},
             {"type": "clear_tool_uses_20250919",
              "trigger": {"type": "input_tokens", "value": 180_000}},
             {"type": "clear_tool_uses_20250919"}]
    assert _parse(context_management={"edits": edits}).clear_trigger == 100_000
    assert _parse(context_management={"edits": edits[:2]}).clear_trigger == 180_000
    assert _parse(context_management={"edits": edits[:1]}).clear_trigger is None


def test_engine_fields_shared_with_chat():
    request = _parse(seed=-5, ignore_eos=True, stop_token_ids=[2, 7, 2], min_p=0.1,
                     presence_penalty=1.5, frequency_penalty=-0.5, top_k=-1)
    engine = request.engine
    assert (engine.seed, engine.ignore_eos, engine.stop_token_ids) == (-5, True, (2, 7))
    assert engine.sampling == {"min_p": 0.1, "presence_penalty": 1.5,
                               "frequency_penalty": -0.5, "top_k": 0}
    assert _parse().engine.ignore_eos is False and _parse().engine.seed is None


@pytest.mark.parametrize("body, param", [
    ({"ignore_eos": "yes"}, "ignore_eos"), ({"ignore_eos": 1}, "ignore_eos"),
    ({"seed": 1.5}, "seed"), ({"seed": "7"}, "seed"), ({"seed": 2 ** 64}, "seed"),
    ({"stop_token_ids": [VOCAB]}, "stop_token_ids"), ({"stop_token_ids": 2}, "stop_token_ids"),
    ({"min_p": 2}, "min_p"), ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": True}, "frequency_penalty"),
])
def test_bad_engine_field_is_a_400_naming_it(body, param):
    assert _error(**body) == (param, "invalid_request")


def test_input_examples_reach_the_description():
    tool = {**TOOL, "input_examples": [{"city": "Paris"}, {"city": "Köln"}]}
    (spec,) = _parse(tools=[tool]).conversation.tools
    assert spec.description == 'Weather\n\nInput examples:\n{"city": "Paris"}\n{"city": "Köln"}'
    (spec,) = _parse(tools=[{**tool, "description": None}]).conversation.tools
    assert spec.description.startswith("Input examples:")
    assert _error(tools=[{**TOOL, "input_examples": ["x"]}]) == (
        "tools[0].input_examples[0]", "invalid_request")


def test_tool_choice_none_hides_tools_and_any_tool_force_a_call():
    assert _parse(tools=[TOOL], tool_choice={"type": "none"}).tools == []
    other = {**TOOL, "name": "other"}
    request = _parse(tools=[TOOL, other], tool_choice={"type": "any"})
    assert request.tool_choice.mode == "required" and request.tool_choice.name is None
    assert [t.name for t in request.conversation.tools] == ["get_weather", "other"]
    request = _parse(tools=[TOOL, other], tool_choice={"type": "tool", "name": "other"})
    assert (request.tool_choice.mode, request.tool_choice.name) == ("required", "other")
    assert [t.name for t in request.conversation.tools] == ["other"]
    assert [t.name for t in _parse(tools=[TOOL]).conversation.tools] == ["get_weather"]


def _marked(text, ttl="5m"):
    return {"type": "text", "text": text, "cache_control": {"type": "ephemeral", "ttl": ttl}}


def test_cache_control_counting_rules():
    request = _parse(messages=[{"role": "user", "content": [_marked("a")]},
                               {"role": "assistant", "content": "b"},
                               {"role": "user", "content": [_marked("c"), {"type": "text", "text": "d"}]}])
    assert [m.cache_breakpoint for m in request.conversation.messages] == [True, False, False]
    five = [{"role": "user", "content": [_marked(str(n)) for n in range(5)]}]
    assert _error(messages=five) == ("cache_control", "invalid_request")
    four = [{"role": "user", "content": [_marked(str(n)) for n in range(4)]}]
    _parse(messages=four)
    # Request-level merges with a same-TTL marker on the last block, else needs a slot.
    _parse(messages=four, cache_control={"type": "ephemeral"})
    assert _error(messages=four, cache_control={"type": "ephemeral", "ttl": "1h"}) == (
        "cache_control", "invalid_request")
    four_then_plain = [{"role": "user", "content": [_marked(str(n)) for n in range(4)]
                        + [{"type": "text", "text": "tail"}]}]
    assert _error(messages=four_then_plain, cache_control={"type": "ephemeral"}) == (
        "cache_control", "invalid_request")
    request = _parse(cache_control={"type": "ephemeral"})
    assert request.conversation.messages[-1].cache_breakpoint
    assert _error(messages=[{"role": "user", "content": [_marked("a", ttl="2h")]}]) == (
        "messages[0].content[0].cache_control.ttl", "invalid_request")


def test_count_only_ignores_output_fields():
    request = _parse(count_only=True, max_tokens=0, stream="not-a-bool", temperature=9,
                     ignore_eos="yes", seed="x", stop_token_ids=[-1], min_p=5)
    assert request.max_tokens is None and request.stream is False
    assert request.engine.ignore_eos is False and request.engine.seed is None


@pytest.mark.parametrize("messages, tools, shown", [
    ([{"role": "user", "content": [{"type": "video"}]}], None,
     'Content block type "video" is not supported'),
    ([{"role": "user", "content": "Hi"}], [{**TOOL, "type": False}], "Tool type false is"),
    ([{"role": "user", "content": "Hi"}], [{**TOOL, "name": "a b"}], 'Tool name "a b" is'),
])
def test_quoted_values_are_json(messages, tools, shown):
    body = {"messages": messages} if tools is None else {"messages": messages, "tools": tools}
    with pytest.raises(NinferError) as info:
        _parse(**body)
    assert shown in info.value.message, info.value.message
