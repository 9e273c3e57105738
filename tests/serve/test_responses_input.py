"""Responses input Items: normalization, error contracts, and lowering to messages."""
import pytest

from ninfer_jax.errors import InvalidRequest, Unsupported
from ninfer_jax.serve.responses.history import lower_items
from ninfer_jax.serve.responses.input import normalize_input


def _lower(raw):
    items = normalize_input(raw)
    return lower_items((item, f"input[{n}]") for n, item in enumerate(items))


def _error(raw, kind=InvalidRequest):
    with pytest.raises(kind) as info:
        _lower(raw)
    return info.value


def _call(call_id, name="f", **extra):
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}",
            **extra}


def _result(call_id, output="ok", **extra):
    return {"type": "function_call_output", "call_id": call_id, "output": output, **extra}


def test_string_input_is_one_user_message_with_input_text():
    (item,) = normalize_input("Hello")
    assert item["type"] == "message" and item["role"] == "user"
    assert item["content"] == [{"type": "input_text", "text": "Hello"}]
    assert item["id"].startswith("msg_")


def test_ids_preserved_generated_and_unique():
    items = normalize_input([{"role": "user", "content": "a", "id": "msg_keep"},
                             {"type": "reasoning", "content": [
                                 {"type": "reasoning_text", "text": "r"}]},
                             _call("call_1")])
    assert items[0]["id"] == "msg_keep"
    assert items[1]["id"].startswith("rs_") and items[2]["id"].startswith("fc_")
    error = _error([{"role": "user", "content": "a", "id": "x"},
                    {"role": "user", "content": "b", "id": "x"}])
    assert error.param == "input[1].id"


def test_parts_concatenate_without_separators_and_roles_keep_positions():
    lowered = _lower([
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_text", "text": "b"}]},
        {"role": "developer", "content": "D"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "x"},
                                          {"type": "refusal", "refusal": "y"}]},
    ])
    assert [(m.role, m.content) for m in lowered.messages] == [
        ("system", "S"), ("user", "ab"), ("developer", "D"), ("assistant", "xy")]


def test_assistant_items_group_into_one_turn():
    lowered = _lower([
        {"role": "user", "content": "q"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"role": "assistant", "content": "A"},
        {"role": "assistant", "content": "B"},
        _call("call_1", "f"),
        _call("call_2", "g", namespace="ns"),
    ])
    (user, turn) = lowered.messages
    assert turn.role == "assistant" and turn.reasoning == "think" and turn.content == "AB"
    assert [(c.id, c.name, c.namespace) for c in turn.tool_calls] == [
        ("call_1", "f", None), ("call_2", "g", "ns")]


def test_reasoning_only_turn_is_kept():
    lowered = _lower([{"role": "user", "content": "q"},
                      {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}]}])
    assert lowered.messages[-1].reasoning == "r" and lowered.messages[-1].content == ""


@pytest.mark.parametrize("raw", [
    [{"role": "assistant", "content": "A"},
     {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}]}],
    [_call("call_1"), {"role": "assistant", "content": "late text"}],
])
def test_unrepresentable_assistant_order_fails(raw):
    assert _error(raw).code == "invalid_assistant_history"


def test_results_reordered_to_call_order_and_validated():
    lowered = _lower([{"role": "user", "content": "q"}, _call("c1", "f"), _call("c2", "g"),
                      _result("c2", "two"), _result("c1", "one", name="f")])
    tools = lowered.messages[2:]
    assert [(m.role, m.tool_call_id, m.content) for m in tools] == [
        ("tool", "c1", "one"), ("tool", "c2", "two")]


@pytest.mark.parametrize("raw, param", [
    ([_call("c1"), _result("zz")], "input[1].call_id"),  # unknown
    ([_call("c1"), _result("c1"), _result("c1")], "input[2].call_id"),  # duplicate
    ([_call("c1"), _call("c2"), _result("c1")], "input[2].call_id"),  # partial
    ([_call("c1", "f"), _result("c1", name="g")], "input[1].name"),  # name assertion
    ([{"role": "user", "content": "q"}, _result("c1")], "input[1].call_id"),  # no calls before
    ([_call("c1"), {"role": "user", "content": "next"}], "input[1]"),  # results skipped
    ([_call("c1"), _call("c2"), {"role": "developer", "content": "d"}], "input[2]"),
])
def test_invalid_tool_history(raw, param):
    error = _error(raw)
    assert error.code == "invalid_tool_history" and error.param == param


def test_history_may_begin_with_results():
    lowered = _lower([_result("c9", [{"type": "input_text", "text": "r"}]),
                      {"role": "user", "content": "next"}])
    assert lowered.messages[0].role == "tool" and lowered.messages[0].content == "r"


@pytest.mark.parametrize("raw, param, code", [
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}],
     "input[0].content[0]", "vision_disabled"),
    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
     "input[0].content[0].type", "unsupported_parameter"),
    ([{"type": "item_reference", "id": "x"}], "input[0].type", "unsupported_parameter"),
    ([{"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}],
     "input[0].content", "unsupported_parameter"),
    ([_call("c1", status="in_progress")], "input[0].status", "unsupported_parameter"),
    ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}],
     "input[0].arguments", "invalid_request"),
    ([{"role": "robot", "content": "x"}], "input[0].role", "invalid_request"),
    ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}],
     "input[0].content[0].type", "invalid_request"),
    ([_result("c1", [])], "input[0].output", "invalid_request"),
])
def test_item_error_contracts(raw, param, code):
    with pytest.raises(InvalidRequest) as info:
        normalize_input(raw)
    assert (info.value.param, info.value.code) == (param, code)


def test_cache_candidates_explicit_latest_four_then_implicit():
    marked = {"type": "input_text", "text": "m",
              "prompt_cache_breakpoint": {"mode": "explicit"}}
    raw = [{"role": "user", "content": [marked]} for _ in range(5)]
    raw.append({"role": "user", "content": "tail"})
    lowered = _lower(raw)
    lowered.apply_cache_breakpoints(implicit=True)
    assert [m.cache_breakpoint for m in lowered.messages] == [False, True, True, True, True, False]

    lowered = _lower([{"role": "user", "content": [marked]}, {"role": "user", "content": "x"}])
    lowered.apply_cache_breakpoints(implicit=True)
    assert [m.cache_breakpoint for m in lowered.messages] == [True, True]
    lowered = _lower([{"role": "user", "content": [marked]}, {"role": "user", "content": "x"}])
    lowered.apply_cache_breakpoints(implicit=False)
    assert [m.cache_breakpoint for m in lowered.messages] == [True, False]


def test_marker_not_on_last_part_is_ignored():
    raw = [{"role": "user", "content": [
        {"type": "input_text", "text": "a", "prompt_cache_breakpoint": {"mode": "explicit"}},
        {"type": "input_text", "text": "b"}]}]
    lowered = _lower(raw)
    assert lowered.explicit_marks == []


def test_bad_breakpoint_mode_names_field():
    with pytest.raises(InvalidRequest) as info:
        normalize_input([{"role": "user", "content": [
            {"type": "input_text", "text": "a", "prompt_cache_breakpoint": {"mode": "auto"}}]}])
    assert info.value.param == "input[0].content[0].prompt_cache_breakpoint.mode"


@pytest.mark.parametrize("kind", [["message"], {"a": 1}, 3])
def test_an_item_type_that_is_not_a_string_is_refused(kind):
    # Found by tests/reliability/test_fuzz.py: a list `type` was a 500 (unhashable).
    with pytest.raises(Unsupported) as info:
        normalize_input([{"type": kind, "role": "user", "content": "hi"}])
    assert info.value.param == "input[0].type"


@pytest.mark.parametrize("kind", [["input_text"], {"a": 1}, 3, None])
def test_a_content_part_type_that_is_not_a_string_is_refused(kind):
    # A list `type` was a 500 (unhashable in the media-part lookup).
    with pytest.raises(InvalidRequest) as info:
        normalize_input([{"role": "user", "content": [{"type": kind, "text": "hi"}]}])
    assert (info.value.param, info.value.code) == ("input[0].content[0].type", "invalid_request")


@pytest.mark.parametrize("raw, shown", [
    ([{"type": None}], "Input item type null is"),
    ([{"role": "user", "content": [{"type": "hologram"}]}], 'type "hologram" is'),
    ([_call("c1", status="in_progress")], 'status "in_progress"'),
])
def test_quoted_values_are_json(raw, shown):
    with pytest.raises((InvalidRequest, Unsupported)) as info:
        _lower(raw)
    assert shown in info.value.message, info.value.message
