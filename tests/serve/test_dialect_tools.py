"""The three chat dialects behave the same with tools (issue 15): tools for a model without a
tool-call format are a field 400; forced tool choice (Chat required / named function,
Responses required / named function / allowed_tools required, Anthropic any / tool) is one
implementation; parallel_tool_calls:false and disable_parallel_tool_use return at most one
call; top_k -1 and 0 disable top-k; a call returned as text is warned about once.

The SmolLM2 tokenizer with a hermes test template and a scripted fake model, as in
test_chat_tools.py; the default harness (no tool-call format) for the rejection."""
import logging
import pathlib

import pytest
from falcon import testing

from harness import build_harness
from sse_util import sse_chunks
from ninfer_jax.serve.config import SamplingOverrides
from ninfer_jax.serve.core.sampling import resolve_sampling
from ninfer_jax.serve.openai.chat_request import sampling_fields

MODEL = "smollm2-135m-instruct"
TEMPLATE = (pathlib.Path(__file__).parent / "templates" / "hermes_think.jinja").read_text()
CHAT_FORMAT = {"tool_call_format": "hermes", "thinking_default": False,
               "reasoning": {"open": "<think>", "close": "</think>"}}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SEARCH_CALL = '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
UNKNOWN_CALL = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
NAMES = ("get_weather", "search")


@pytest.fixture(scope="module")
def tools_client(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, chat_format=CHAT_FORMAT,
                      template=TEMPLATE)
    h.book.add("call", CALL)
    h.book.add("two-calls", CALL + "\n" + SEARCH_CALL)
    h.book.add("unknown-tool", UNKNOWN_CALL)
    h.book.add("prose", "The weather is nice today.")
    yield testing.TestClient(h.app)
    h.close()


@pytest.fixture(scope="module")
def plain_client(default_artifact, default_tokenizer):
    """The default model's chat format: no tool-call format at all."""
    h = build_harness(default_artifact, default_tokenizer)
    yield testing.TestClient(h.app)
    h.close()


# ------------------------------------------------------------------ one request per dialect
# Each helper sends the same request in its dialect and returns (status, body). `choice` is
# the dialect-neutral intent: None (auto), "none", "required" or a tool name.

def _chat(client, text, *, choice=None, parallel=True, **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}],
            "tools": [{"type": "function", "function": {"name": n, "parameters": SCHEMA}}
                      for n in NAMES], **extra}
    if choice in ("none", "required"):
        body["tool_choice"] = choice
    elif choice is not None:
        body["tool_choice"] = {"type": "function", "function": {"name": choice}}
    if not parallel:
        body["parallel_tool_calls"] = False
    return _reply(client.simulate_post("/v1/chat/completions", json=body), body)


def _responses(client, text, *, choice=None, parallel=True, **extra):
    body = {"model": MODEL, "input": text, "store": False,
            "tools": [{"type": "function", "name": n, "parameters": SCHEMA} for n in NAMES],
            **extra}
    if choice in ("none", "required"):
        body["tool_choice"] = choice
    elif choice is not None:
        body["tool_choice"] = {"type": "function", "name": choice}
    if not parallel:
        body["parallel_tool_calls"] = False
    return _reply(client.simulate_post("/v1/responses", json=body), body)


def _anthropic(client, text, *, choice=None, parallel=True, **extra):
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": text}],
            "tools": [{"name": n, "input_schema": SCHEMA} for n in NAMES], **extra}
    tool_choice = None
    if choice in ("none", "required"):
        tool_choice = {"type": "none" if choice == "none" else "any"}
    elif choice is not None:
        tool_choice = {"type": "tool", "name": choice}
    if not parallel:
        tool_choice = {**(tool_choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    return _reply(client.simulate_post("/v1/messages", json=body), body)


def _reply(result, body):
    """(status, the JSON body; for a stream, its JSON payloads in order)."""
    if not body.get("stream"):
        return result.status_code, result.json
    return result.status_code, sse_chunks(result.text)[0]


def streamed_calls(dialect, chunks) -> list[str]:
    """The names of the structured calls a stream announced."""
    if dialect == "chat":
        return [call["function"]["name"] for c in chunks if c.get("choices")
                for call in c["choices"][0]["delta"].get("tool_calls") or []]
    if dialect == "responses":
        return [c["item"]["name"] for c in chunks if c["type"] == "response.output_item.done"
                and c["item"]["type"] == "function_call"]
    return [c["content_block"]["name"] for c in chunks if c["type"] == "content_block_start"
            and c["content_block"]["type"] == "tool_use"]


DIALECTS = {"chat": _chat, "responses": _responses, "anthropic": _anthropic}


def calls_and_text(dialect, body) -> tuple[list[str], str]:
    """(the names of the structured calls, the reply's visible text)."""
    if dialect == "chat":
        message = body["choices"][0]["message"]
        return ([c["function"]["name"] for c in message.get("tool_calls") or []],
                message.get("content") or "")
    if dialect == "responses":
        items = body["output"]
        text = "".join(part["text"] for item in items if item["type"] == "message"
                       for part in item["content"] if part["type"] == "output_text")
        return [i["name"] for i in items if i["type"] == "function_call"], text
    blocks = body["content"]
    return ([b["name"] for b in blocks if b["type"] == "tool_use"],
            "".join(b["text"] for b in blocks if b["type"] == "text"))


def field_error(dialect, status, body) -> str:
    """The field a 400 names, read from the dialect's own error shape."""
    assert status == 400, body
    if dialect == "anthropic":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        return body["error"]["message"]
    return body["error"]["param"]


# ------------------------------------------------------------------ tools need a tool format

@pytest.mark.parametrize("dialect", DIALECTS)
def test_tools_for_a_model_without_a_tool_format_are_a_field_400(plain_client, dialect):
    status, body = DIALECTS[dialect](plain_client, "hello")
    where = field_error(dialect, status, body)
    assert where.startswith("'tools'") if dialect == "anthropic" else where == "tools"
    # tool_choice none offers no tool, so there is nothing the model cannot honour.
    status, body = DIALECTS[dialect](plain_client, "hello", choice="none")
    assert status == 200, body


def test_counting_rejects_tools_the_model_cannot_call(plain_client):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "get_weather", "input_schema": SCHEMA}]}
    result = plain_client.simulate_post("/v1/messages/count_tokens", json=body)
    assert result.status_code == 400
    assert result.json["error"]["message"].startswith("'tools'")


# ------------------------------------------------------------------ forced tool choice

@pytest.mark.parametrize("dialect", DIALECTS)
def test_auto_choice_leaves_prose_alone(tools_client, dialect):
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:prose")
    assert status == 200, body
    assert calls_and_text(dialect, body) == ([], "The weather is nice today.")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_required_choice_opens_a_call_to_an_offered_tool(tools_client, dialect):
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:prose", choice="required")
    assert status == 200, body
    # The first answer token became the call prefix and the name was held to the first
    # offered tool; the script then ended, so the unfinished call is returned as text.
    assert calls_and_text(dialect, body) == ([], '<tool_call>\n{"name": "get_weather"')


@pytest.mark.parametrize("dialect", DIALECTS)
def test_named_choice_forces_and_offers_only_that_tool(tools_client, dialect):
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:prose", choice="search")
    assert status == 200, body
    assert calls_and_text(dialect, body) == ([], '<tool_call>\n{"name": "search"')
    # The forced tool is the only one offered: a call to another tool stays text.
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:call", choice="search")
    assert status == 200, body
    names, text = calls_and_text(dialect, body)
    assert names == [] and '"name": "search"' in text


@pytest.mark.parametrize("dialect", DIALECTS)
def test_forcing_keeps_a_call_the_model_writes_anyway(tools_client, dialect):
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:call", choice="required")
    assert status == 200, body
    assert calls_and_text(dialect, body)[0] == ["get_weather"]


@pytest.mark.parametrize("dialect, field", [
    ("chat", "tool_choice"), ("responses", "tool_choice.name"), ("anthropic", "tool_choice")])
def test_an_unknown_forced_name_is_a_field_400(tools_client, dialect, field):
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:prose", choice="nope")
    where = field_error(dialect, status, body)
    assert ("'nope'" in where and where.startswith(field)) if dialect == "anthropic" \
        else where == field


def test_responses_allowed_tools_required_forces_among_the_allowed(tools_client):
    choice = {"type": "allowed_tools", "mode": "required",
              "tools": [{"type": "function", "name": "search"}]}
    status, body = _responses(tools_client, "SCRIPT:prose", tool_choice=choice)
    assert status == 200, body
    assert calls_and_text("responses", body) == ([], '<tool_call>\n{"name": "search"')
    choice["tools"].append({"type": "function", "name": "nope"})
    status, body = _responses(tools_client, "SCRIPT:prose", tool_choice=choice)
    assert field_error("responses", status, body) == "tool_choice.tools[1]"


# ------------------------------------------------------------------ stops vs a forced call
# A stop that the forced call's own text fires would end the reply at the marker with no
# call: refused up front on the dialect's stop field (Responses has no stop strings).

STOP_FIELD = {"chat": "stop", "anthropic": "stop_sequences"}


@pytest.mark.parametrize("dialect", STOP_FIELD)
@pytest.mark.parametrize("choice", ["required", "get_weather"])
@pytest.mark.parametrize("stop", ["<tool_call>", '{"name"', "weather", 'r", "arguments'])
def test_a_stop_string_on_the_forced_call_is_a_field_400(tools_client, dialect, choice, stop):
    field = STOP_FIELD[dialect]
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:call", choice=choice,
                                     **{field: [stop]})
    where = field_error(dialect, status, body)
    assert where.startswith(f"'{field}'") if dialect == "anthropic" else where == field


@pytest.mark.parametrize("dialect", STOP_FIELD)
def test_a_stop_string_clear_of_the_forced_call_keeps_it(tools_client, dialect):
    # "search" is a name the named choice does not offer, and "<tool" only cuts the marker.
    for stop, choice in (("zzz", "required"), ("search", "get_weather"), ("<tool", "required")):
        status, body = DIALECTS[dialect](tools_client, "SCRIPT:call", choice=choice,
                                         **{STOP_FIELD[dialect]: [stop]})
        assert status == 200, body
        assert calls_and_text(dialect, body)[0] == ["get_weather"]
    # Without forcing, a stop on the marker is the client's way to end before any call.
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:call",
                                     **{STOP_FIELD[dialect]: ["<tool_call>"]})
    assert status == 200 and calls_and_text(dialect, body) == ([], "")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_stop_token_the_forced_call_commits_is_a_field_400(tools_client, dialect,
                                                           default_tokenizer):
    marker_head = default_tokenizer.encode("<tool_call>", special=True)[0]
    name_piece = default_tokenizer.encode("get_weather", special=False)[0]
    for token, choice in ((marker_head, "required"), (name_piece, "get_weather")):
        status, body = DIALECTS[dialect](tools_client, "SCRIPT:call", choice=choice,
                                         stop_token_ids=[token])
        where = field_error(dialect, status, body)
        assert where.startswith("'stop_token_ids'") if dialect == "anthropic" \
            else where == "stop_token_ids"
    # An end token stays a valid stop token under forcing.
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:call", choice="required",
                                     stop_token_ids=sorted(default_tokenizer.eos_ids))
    assert status == 200 and calls_and_text(dialect, body)[0] == ["get_weather"]


# ------------------------------------------------------------------ one call when not parallel

@pytest.mark.parametrize("dialect", DIALECTS)
def test_parallel_off_returns_at_most_one_call(tools_client, dialect):
    status, both = DIALECTS[dialect](tools_client, "SCRIPT:two-calls")
    assert status == 200, both
    assert calls_and_text(dialect, both)[0] == ["get_weather", "search"]
    status, one = DIALECTS[dialect](tools_client, "SCRIPT:two-calls", parallel=False)
    assert status == 200, one
    names, text = calls_and_text(dialect, one)
    assert names == ["get_weather"] and "search" not in text


@pytest.mark.parametrize("dialect", DIALECTS)
def test_parallel_off_streams_at_most_one_call(tools_client, dialect):
    status, both = DIALECTS[dialect](tools_client, "SCRIPT:two-calls", stream=True)
    assert status == 200 and streamed_calls(dialect, both) == ["get_weather", "search"]
    status, one = DIALECTS[dialect](tools_client, "SCRIPT:two-calls", parallel=False,
                                    stream=True)
    assert status == 200 and streamed_calls(dialect, one) == ["get_weather"]


def test_responses_echoes_parallel_tool_calls(tools_client):
    status, body = _responses(tools_client, "SCRIPT:two-calls", parallel=False)
    assert status == 200 and body["parallel_tool_calls"] is False


# ------------------------------------------------------------------ top_k

@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
@pytest.mark.parametrize("top_k", [-5, -1, 0])
def test_top_k_at_zero_or_below_is_accepted(tools_client, dialect, top_k):
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:prose", choice="none", top_k=top_k)
    assert status == 200, body


@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
def test_top_k_above_the_cap_is_a_field_400(tools_client, dialect):
    status, body = DIALECTS[dialect](tools_client, "SCRIPT:prose", choice="none", top_k=21)
    where = field_error(dialect, status, body)
    assert where.startswith("'top_k'") if dialect == "anthropic" else where == "top_k"


@pytest.mark.parametrize("top_k", [-3, -1])
def test_disabled_top_k_overrides_a_model_preset(top_k):
    top_k = sampling_fields({"top_k": top_k})["top_k"]
    assert top_k == 0
    params = resolve_sampling({"top_k": 20}, SamplingOverrides(), {"top_k": top_k}, seed=1)
    assert params.top_k == 0  # the engine reads top_k <= 0 as no top-k filter


# ------------------------------------------------------------------ the fallback warning

@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_undeclared_call_returned_as_text_warns_once(tools_client, dialect, caplog):
    with caplog.at_level(logging.WARNING, logger="ninfer_jax"):
        status, body = DIALECTS[dialect](tools_client, "SCRIPT:unknown-tool")
    assert status == 200, body
    assert calls_and_text(dialect, body) == ([], UNKNOWN_CALL)
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "returned as text" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "undeclared_tool" in warnings[0] and "rm_rf" not in warnings[0]
