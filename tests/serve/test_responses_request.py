"""Responses create/input_tokens field validation, tools and conversation building."""
import pytest

from ninfer_jax.errors import InvalidRequest, ModelNotFound
from ninfer_jax.serve.responses.store import build_record
from ninfer_jax.serve.responses.request import (
    build_conversation, parse_request, resolve_preserve_thinking)

MODEL = "tiny-model"
VOCAB = 49152


def _parse(**body):
    body.setdefault("model", MODEL)
    body.setdefault("input", "hi")
    return parse_request(body, MODEL, vocab_size=VOCAB)


def _error(**body):
    with pytest.raises(InvalidRequest) as info:
        _parse(**body)
    return info.value.param, info.value.code


FUNCTION = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}
NAMESPACE = {"type": "namespace", "name": "mcp__weather", "description": "Weather",
             "tools": [{"type": "function", "name": "get_current"},
                       {"type": "function", "name": "get_weather"}]}


def test_defaults():
    request = _parse()
    assert request.store is True and request.stream is False
    assert request.max_output_tokens is None and request.temperature is None
    assert request.tools.choice.mode == "auto" and request.tools.parallel_tool_calls
    assert request.echo["text"] == {"format": {"type": "text"}}
    assert request.implicit_cache


@pytest.mark.parametrize("body, expected", [
    ({"frobnicate": 1}, ("frobnicate", "unknown_parameter")),
    ({"top_k": 21}, ("top_k", "invalid_request")),
    ({"ignore_eos": "yes"}, ("ignore_eos", "invalid_request")),
    ({"seed": 1.5}, ("seed", "invalid_request")),
    ({"seed": -(2 ** 63) - 1}, ("seed", "invalid_request")),
    ({"stop_token_ids": [VOCAB]}, ("stop_token_ids", "invalid_request")),
    ({"stop_token_ids": list(range(65))}, ("stop_token_ids", "invalid_request")),
    ({"min_p": -0.1}, ("min_p", "invalid_request")),
    ({"presence_penalty": 2.5}, ("presence_penalty", "invalid_request")),
    ({"frequency_penalty": "1"}, ("frequency_penalty", "invalid_request")),
    ({"conversation": "c"}, ("conversation", "unsupported_parameter")),
    ({"prompt": {"id": "p"}}, ("prompt", "unsupported_parameter")),
    ({"context_management": []}, ("context_management", "unsupported_parameter")),
    ({"temperature": 2.5}, ("temperature", "invalid_request")),
    ({"temperature": True}, ("temperature", "invalid_request")),
    ({"top_p": -0.1}, ("top_p", "invalid_request")),
    ({"max_output_tokens": -1}, ("max_output_tokens", "invalid_request")),
    ({"max_output_tokens": 1.5}, ("max_output_tokens", "invalid_request")),
    ({"store": "yes"}, ("store", "invalid_request")),
    ({"metadata": {f"k{n}": "v" for n in range(17)}}, ("metadata", "invalid_request")),
    ({"metadata": {"k" * 65: "v"}}, ("metadata." + "k" * 65, "invalid_request")),
    ({"metadata": {"k": "v" * 513}}, ("metadata.k", "invalid_request")),
    ({"metadata": {"k": 1}}, ("metadata.k", "invalid_request")),
    ({"text": {"format": {"type": "json_object"}}}, ("text.format", "unsupported_parameter")),
    ({"text": {"verbosity": "high"}}, ("text.verbosity", "unsupported_parameter")),
    ({"text": {"verbosity": "loud"}}, ("text.verbosity", "invalid_request")),
    ({"text": {"format": {}}}, ("text.format.type", "invalid_request")),
    ({"text": {"format": {"type": "yaml"}}}, ("text.format.type", "invalid_request")),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}},
     ("text.format", "unsupported_parameter")),
    ({"truncation": "auto"}, ("truncation", "unsupported_parameter")),
    ({"top_logprobs": 2}, ("top_logprobs", "unsupported_parameter")),
    ({"service_tier": "priority"}, ("service_tier", "unsupported_parameter")),
    ({"background": True}, ("background", "unsupported_parameter")),
    ({"include": ["reasoning.encrypted_content"]}, ("include", "unsupported_parameter")),
    ({"reasoning": {"effort": "extreme"}}, ("reasoning.effort", "invalid_request")),
    ({"prompt_cache_options": {"mode": "sometimes"}},
     ("prompt_cache_options.mode", "invalid_request")),
    ({"client_metadata": "x"}, ("client_metadata", "invalid_request")),
    ({"max_tool_calls": -1}, ("max_tool_calls", "invalid_request")),
])
def test_field_error_contracts(body, expected):
    assert _error(**body) == expected


def test_model_must_match_public_id():
    with pytest.raises(ModelNotFound) as info:
        _parse(model="other")
    assert info.value.param == "model" and info.value.status == 404
    assert _error(model="") == ("model", "invalid_request")


def test_accepted_no_op_hints():
    request = _parse(max_tool_calls=3, top_logprobs=0, service_tier="auto", background=False,
                     include=[], truncation="disabled", prompt_cache_key="k",
                     prompt_cache_retention="24h", safety_identifier="s", user="u",
                     client_metadata={"trace": "1"}, stream_options={"include_obfuscation": True},
                     text={"format": {"type": "text"}, "verbosity": "medium"},
                     metadata={"a": "b"}, reasoning={"effort": "low", "summary": "auto"})
    assert request.echo["metadata"] == {"a": "b"}
    assert request.template.reasoning_effort == "low"


def test_reasoning_effort_none_disables_thinking_and_conflicts():
    request = _parse(reasoning={"effort": "none"})
    assert request.template.enable_thinking is False
    assert request.template.template_effort is None
    assert _error(reasoning={"effort": "none"},
                  chat_template_kwargs={"enable_thinking": True}) == (
        "chat_template_kwargs.enable_thinking", "conflicting_template_option")
    assert _error(reasoning={"effort": "high"},
                  chat_template_kwargs={"reasoning_effort": "low"}) == (
        "chat_template_kwargs.reasoning_effort", "conflicting_template_option")


def test_preserve_thinking_alias_and_kwargs():
    request = _parse(preserve_thinking=True, chat_template_kwargs={"preserve_thinking": True,
                                                                    "custom": None})
    assert request.template.preserve_thinking is True
    assert request.template.extra_kwargs == {"custom": None}
    assert _error(preserve_thinking=True, chat_template_kwargs={"preserve_thinking": False})[1] \
        == "conflicting_template_option"
    assert _error(chat_template_kwargs={"messages": []}) == (
        "chat_template_kwargs.messages", "invalid_request")
    assert _error(chat_template_kwargs=[1]) == ("chat_template_kwargs", "invalid_request")


def test_tools_direct_and_namespaced_keep_identity():
    request = _parse(tools=[FUNCTION, NAMESPACE])
    names = [(t.namespace, t.name, t.qualified_name) for t in request.tools.effective]
    assert names == [(None, "get_weather", "get_weather"),
                     ("mcp__weather", "get_current", "mcp__weather.get_current"),
                     ("mcp__weather", "get_weather", "mcp__weather.get_weather")]
    found = request.tools.lookup("mcp__weather.get_weather")
    assert (found.namespace, found.name) == ("mcp__weather", "get_weather")
    assert request.tools.lookup("nope") is None
    assert list(request.tools.effective[0].parameters) == ["type", "properties"]


@pytest.mark.parametrize("body, expected", [
    ({"tools": [{**FUNCTION, "strict": True}]}, ("tools[0].strict", "unsupported_parameter")),
    ({"tools": [{"type": "web_search"}]}, ("tools[0].type", "unsupported_parameter")),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, ("tools[0].type", "unsupported_parameter")),
    ({"tools": [{"type": "custom", "name": "x"}]}, ("tools[0].type", "unsupported_parameter")),
    ({"tools": [{**FUNCTION, "defer_loading": True}]},
     ("tools[0].defer_loading", "unsupported_parameter")),
    ({"tools": [{**FUNCTION, "output_schema": {}}]},
     ("tools[0].output_schema", "unsupported_parameter")),
    ({"tools": [{**FUNCTION, "allowed_callers": ["programmatic"]}]},
     ("tools[0].allowed_callers", "unsupported_parameter")),
    ({"tools": [FUNCTION, FUNCTION]}, ("tools[1].name", "invalid_request")),
    ({"tools": [{"type": "function", "name": "a.b"}]}, ("tools[0].name", "invalid_request")),
    ({"tools": [{**NAMESPACE, "tools": [{"type": "web_search"}]}]},
     ("tools[0].tools[0].type", "unsupported_parameter")),
    ({"tools": [FUNCTION], "tool_choice": {"type": "function", "name": "nope"}},
     ("tool_choice.name", "invalid_request")),
    ({"tool_choice": "required"}, ("tool_choice", "invalid_request")),
    ({"tools": [FUNCTION], "tool_choice": {"type": "allowed_tools", "mode": "auto",
                                           "tools": [{"type": "function", "name": "x"}]}},
     ("tool_choice.tools[0]", "invalid_request")),
    ({"tools": [FUNCTION], "parallel_tool_calls": "no"},
     ("parallel_tool_calls", "invalid_request")),
])
def test_tool_error_contracts(body, expected):
    assert _error(**body) == expected


def test_tool_choice_none_and_allowed_tools():
    request = _parse(tools=[FUNCTION], tool_choice="none", parallel_tool_calls=False)
    assert request.tools.effective == [] and not request.tools.parallel_tool_calls
    request = _parse(tools=[FUNCTION, NAMESPACE], tool_choice={
        "type": "allowed_tools", "mode": "auto",
        "tools": [{"type": "function", "name": "get_current", "namespace": "mcp__weather"},
                  {"type": "function", "name": "get_weather"}]})
    assert [t.qualified_name for t in request.tools.effective] == [
        "get_weather", "mcp__weather.get_current"]
    assert _parse(parallel_tool_calls=False).tools.parallel_tool_calls is False


def test_count_only_accepts_prompt_fields_and_rejects_others():
    request = parse_request({"input": "x", "preserve_thinking": True}, MODEL, vocab_size=VOCAB,
                            count_only=True)
    assert request.model == MODEL
    for field in ("temperature", "seed", "ignore_eos"):
        with pytest.raises(InvalidRequest) as info:
            parse_request({"input": "x", field: 1}, MODEL, vocab_size=VOCAB, count_only=True)
        assert (info.value.param, info.value.code) == (field, "unknown_parameter")


def test_engine_fields_shared_with_chat():
    engine = _parse(seed=2 ** 64 - 1, ignore_eos=True, stop_token_ids=[5, 5, 9], top_k=0,
                    min_p=0.05, presence_penalty=0.0, frequency_penalty=1.0).engine
    assert (engine.seed, engine.ignore_eos, engine.stop_token_ids) == (2 ** 64 - 1, True, (5, 9))
    assert engine.sampling == {"min_p": 0.05, "presence_penalty": 0.0,
                               "frequency_penalty": 1.0, "top_k": 0}
    default = _parse().engine
    assert (default.seed, default.ignore_eos, default.stop_token_ids) == (None, False, ())
    assert set(default.sampling.values()) == {None}


def _stored(request, output, parent=None, preserve=None):
    response = {"id": f"resp_{len(output)}_{id(request)}", "output": output}
    return build_record(response, request.input_items, parent, preserve, True)


def test_previous_response_context_equals_explicit_history():
    first = _parse(input="What is 2+2?")
    output = [{"type": "reasoning", "id": "rs_1", "summary": [],
               "content": [{"type": "reasoning_text", "text": "add"}]},
              {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "4", "annotations": []}]}]
    parent = _stored(first, output)
    follow = _parse(input="And 3+3?", previous_response_id=parent.response_id,
                    instructions="Be brief.")
    chained = build_conversation(follow, parent, preserve_thinking=None)
    explicit = _parse(instructions="Be brief.", input=[
        {"role": "user", "content": "What is 2+2?"}, *output,
        {"role": "user", "content": "And 3+3?"}])
    direct = build_conversation(explicit, None, preserve_thinking=None)
    assert chained.messages == direct.messages
    assert [m.role for m in chained.messages] == ["developer", "user", "assistant", "user"]
    assert chained.messages[2].reasoning == "add"
    # The implicit cache candidate sits on the latest client content.
    assert [m.cache_breakpoint for m in chained.messages] == [False, False, False, True]


def test_empty_input_needs_a_parent_with_a_user_message():
    with pytest.raises(InvalidRequest) as info:
        build_conversation(_parse(input=[]), None, preserve_thinking=None)
    assert info.value.param == "input"
    parent = _stored(_parse(input="q"), [])
    conversation = build_conversation(_parse(input=[]), parent, preserve_thinking=None)
    assert [m.role for m in conversation.messages] == ["user"]


def test_preserve_thinking_inheritance():
    parent = _stored(_parse(), [], preserve=True)
    assert resolve_preserve_thinking(_parse(), parent, False) is True
    assert resolve_preserve_thinking(_parse(preserve_thinking=False), parent, False) is False
    assert resolve_preserve_thinking(_parse(), None, True) is True
    assert resolve_preserve_thinking(_parse(), None, False) is None


def test_forced_choices_become_the_shared_tool_choice():
    request = _parse(tools=[FUNCTION, NAMESPACE], tool_choice="required")
    assert request.tools.choice.mode == "required" and len(request.tools.effective) == 3
    request = _parse(tools=[FUNCTION, NAMESPACE], tool_choice={
        "type": "function", "name": "get_weather", "namespace": "mcp__weather"})
    assert request.tools.choice.name == "mcp__weather.get_weather"
    assert [t.qualified_name for t in request.tools.effective] == ["mcp__weather.get_weather"]
    request = _parse(tools=[FUNCTION, NAMESPACE], tool_choice={
        "type": "allowed_tools", "mode": "required",
        "tools": [{"type": "function", "name": "get_weather"}]})
    assert request.tools.choice.mode == "required"
    assert [t.qualified_name for t in request.tools.effective] == ["get_weather"]


@pytest.mark.parametrize("body, param", [
    ({"input": 5}, "input"),
    ({"input": [{"type": "message", "role": "user", "content": None}]}, "input[0].content"),
])
def test_input_shape_errors_say_a_string_is_accepted(body, param):
    with pytest.raises(InvalidRequest) as info:
        _parse(**body)
    assert info.value.param == param and "a string or an array" in info.value.message
