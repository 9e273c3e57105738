"""Parsing and validating an Anthropic Messages (or count_tokens) body.

Produces an `AnthropicRequest`: the lowered Conversation plus what generation needs
(max_tokens, sampling, stop sequences, thinking budget, and the engine fields every dialect
shares: seed, ignore_eos, stop_token_ids, min_p and the penalties). Advisory fields
(metadata, service tier, speed, inference geography) are validated and change nothing;
features needing an executor or constraint this server lacks are rejected with the field
named; any other top-level field is ignored, as serving.md says (Anthropic's own API would
refuse it), and the service names it in a log warning. The model
is a free local label, echoed back. tool_choice any/tool become forced calls through the
shared ForcedToolCall policy (the chat path's required/named choice).

Cache-control counting: at most four distinct block-level breakpoints; a request-level
cache_control targets the last cacheable block, merges with a marker there of the same
TTL, conflicts with a different TTL, and needs a free slot otherwise.
"""
from __future__ import annotations

import dataclasses
import json

from ninfer_jax.errors import InvalidRequest, Unsupported
from ninfer_jax.serve.core import fields
from ninfer_jax.serve.core.engine_fields import ENGINE_FIELDS, EngineFields, engine_fields
from ninfer_jax.serve.anthropic.history import (
    LoweredMessages, cache_control_ttl, cache_ttl, lower_messages)
from ninfer_jax.serve.core.tools import ToolChoice, effective_tools
from ninfer_jax.text.conversation import Conversation, PromptOptions, ToolSpec

MAX_CACHE_BREAKPOINTS = 4
MIN_THINKING_BUDGET = 1024
# Each stop string is matched after every token; the same bound as Chat's `stop`.
MAX_STOP_SEQUENCES = 4
ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")
REJECTED_FIELDS = {
    "container": "Containers (code execution sandboxes) are not supported.",
    "mcp_servers": "Remote MCP servers are not supported.",
    "output_format": "Structured outputs need constrained decoding.",
    "diagnostics": "Prompt-cache miss diagnostics are not reported.",
}
# Anthropic's own top-level fields, then the extensions shared with the other dialects.
ANTHROPIC_FIELDS = frozenset({
    "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream",
    "temperature", "top_k", "top_p", "tools", "tool_choice", "thinking", "service_tier",
    "inference_geo", "speed", "output_config", "cache_control", "context_management",
    *REJECTED_FIELDS,
})
KNOWN_FIELDS = ANTHROPIC_FIELDS | {"priority", "draft", "chat_template_kwargs",
                                   "preserve_thinking", *ENGINE_FIELDS}


@dataclasses.dataclass
class AnthropicRequest:
    model: str
    conversation: Conversation
    tools: list[ToolSpec]  # effective tools the model may call
    tool_choice: ToolChoice
    parallel_tool_calls: bool  # False: tool_choice.disable_parallel_tool_use
    max_tokens: int | None  # None -> server default
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    # seed, ignore_eos, stop_token_ids and the sampler extensions (top_k, min_p, penalties)
    engine: EngineFields = dataclasses.field(default_factory=EngineFields)
    stop_sequences: tuple[str, ...] = ()
    thinking_budget: int | None = None  # budget_tokens of thinking.type "enabled"
    thinking_mode: str | None = None  # disabled | adaptive | enabled | None (unspecified)
    background: bool = False  # `priority` (an extension: Anthropic's API has no such field)
    draft: bool = True  # `draft` (TensorFold's extension: false turns speculation off)
    # The lowest clear_tool_uses trigger of `context_management` (context_edit_trigger).
    clear_trigger: int | None = None


def _with_examples(description: str | None, examples, param: str) -> str | None:
    """Tool input examples have no slot in a chat template's tool list, so they reach the
    model as part of the description: one JSON object per line, member order kept."""
    if examples is None:
        return description
    lines = [json.dumps(fields.require_object(example, f"{param}[{k}]"), ensure_ascii=False)
             for k, example in enumerate(fields.require_list(examples, param))]
    if not lines:
        return description
    examples_text = "Input examples:\n" + "\n".join(lines)
    return f"{description}\n\n{examples_text}" if description else examples_text


def _parse_tools(value) -> tuple[list[ToolSpec], list[tuple[str, str]]]:
    """Tools and their cache markers as (ttl, param)."""
    if value is None:
        return [], []
    specs, marks, seen = [], [], set()
    for n, tool in enumerate(fields.require_list(value, "tools")):
        param = f"tools[{n}]"
        tool = fields.require_object(tool, param)
        if tool.get("type") not in (None, "custom"):
            raise Unsupported(f"Tool type {fields.as_json(tool.get('type'))} is an "
                              "Anthropic-provided/server tool; only user-defined tools are "
                              "supported.", param=f"{param}.type")
        name = fields.require_string(tool.get("name"), f"{param}.name", non_empty=True)
        if not fields.TOOL_NAME.match(name) or name in seen:
            raise InvalidRequest(f"Tool name {fields.as_json(name)} is invalid or duplicated.",
                                 param=f"{param}.name")
        seen.add(name)
        schema = fields.require_object(tool.get("input_schema"), f"{param}.input_schema")
        if fields.opt_bool(tool.get("strict"), f"{param}.strict"):
            raise Unsupported("strict tools need constrained decoding.", param=f"{param}.strict")
        if fields.opt_bool(tool.get("defer_loading"), f"{param}.defer_loading"):
            raise Unsupported("Deferred tools are not supported.", param=f"{param}.defer_loading")
        callers = tool.get("allowed_callers")
        if callers is not None and "direct" not in fields.require_list(
                callers, f"{param}.allowed_callers"):
            raise Unsupported("A tool the model may not call directly cannot be offered.",
                              param=f"{param}.allowed_callers")
        description = _with_examples(
            fields.opt_string(tool.get("description"), f"{param}.description"),
            tool.get("input_examples"), f"{param}.input_examples")
        specs.append(ToolSpec(name=name, parameters=schema, description=description))
        ttl = cache_ttl(tool, param)
        if ttl is not None:
            marks.append((ttl, param))
    return specs, marks


def _tool_choice(value, tools: list[ToolSpec]) -> tuple[ToolChoice, list[ToolSpec], bool]:
    """The generation ToolChoice, the tools the template offers and whether several calls
    may be returned (not disable_parallel_tool_use).

    any / tool become forced calls (the shared ForcedToolCall policy: the answer opens a
    call and the name is held to the offered tools); a named tool is the only one offered.
    Resolution and its errors are the shared core's (serve.core.tools)."""
    if value is None:
        return ToolChoice("auto"), tools, True
    value = fields.require_object(value, "tool_choice")
    kind = fields.check_enum(value.get("type"), "tool_choice.type", ("auto", "none", "any", "tool"))
    parallel = not fields.opt_bool(value.get("disable_parallel_tool_use"),
                                   "tool_choice.disable_parallel_tool_use")
    if kind == "none":
        choice = ToolChoice("none")
    elif kind == "auto":
        choice = ToolChoice("auto")
    elif kind == "any":
        choice = ToolChoice("required")
    else:
        name = fields.require_string(value.get("name"), "tool_choice.name", non_empty=True)
        choice = ToolChoice("required", name=name, name_param="tool_choice.name")
    return choice, effective_tools(tools, choice), parallel


def _thinking(value, max_tokens: int | None, default_max_tokens: int):
    if value is None:
        return None, None, None
    value = fields.require_object(value, "thinking")
    kind = fields.check_enum(value.get("type"), "thinking.type", ("disabled", "adaptive", "enabled"))
    if value.get("display") == "omitted":
        raise Unsupported("display 'omitted' needs encrypted hidden-reasoning restore, which "
                          "this server cannot provide.", param="thinking.display")
    if kind == "disabled":
        return kind, False, None
    if kind == "adaptive":
        return kind, True, None
    budget = fields.opt_int(value.get("budget_tokens"), "thinking.budget_tokens", MIN_THINKING_BUDGET)
    if budget is None:
        raise InvalidRequest("thinking.budget_tokens is required when thinking is enabled.",
                             param="thinking.budget_tokens")
    limit = max_tokens if max_tokens is not None else default_max_tokens
    if budget >= limit:
        raise InvalidRequest(f"thinking.budget_tokens ({budget}) must be less than max_tokens "
                             f"({limit}).", param="thinking.budget_tokens")
    return kind, True, budget


def _apply_cache_marks(lowered: LoweredMessages, tool_marks, request_level) -> None:
    marks = [(ttl, None, param) for ttl, param in tool_marks]
    marks += [(m.ttl, m.message_index, m.param) for m in lowered.marks]
    targets = {param: (ttl, index) for ttl, index, param in marks}
    if len(targets) > MAX_CACHE_BREAKPOINTS:
        raise InvalidRequest(f"At most {MAX_CACHE_BREAKPOINTS} cache_control breakpoints are "
                             f"allowed; got {len(targets)}.", param="cache_control")
    if request_level is not None and lowered.last_block is not None:
        index, param = lowered.last_block
        if param in targets and targets[param][0] != request_level:
            raise InvalidRequest("Request-level cache_control conflicts with the TTL of the "
                                 "marker on the same block.", param="cache_control")
        if param not in targets and len(targets) == MAX_CACHE_BREAKPOINTS:
            raise InvalidRequest("Request-level cache_control needs a fifth breakpoint slot.",
                                 param="cache_control")
        targets[param] = (request_level, index)
    for _, index in targets.values():
        if index is not None:  # unrepresentable boundaries are advisory and ignored
            lowered.messages[index].cache_breakpoint = True


def _check_fields(body: dict) -> None:
    for key, message in REJECTED_FIELDS.items():
        if body.get(key) is not None:
            raise Unsupported(message, param=key)


# Anthropic's default trigger of clear_tool_uses_20250919 (input tokens).
DEFAULT_CLEAR_TRIGGER = 100_000


def context_edit_trigger(value) -> int | None:
    """`context_management`: server-side clearing is not implemented, so only edits that can
    never change the prompt are accepted. Returns the lowest input-token trigger of its
    clear_tool_uses edits (None when there is none); the service refuses it unless the
    context window is below it (a prompt can then never reach it: agents such as Claude Code
    send a 180k trigger). clear_thinking keeps every thinking turn only with keep "all"."""
    if value is None:
        return None
    edits = fields.require_list(fields.require_object(value, "context_management").get(
        "edits", []), "context_management.edits")
    triggers = []
    for index, edit in enumerate(edits):
        param = f"context_management.edits[{index}]"
        edit = fields.require_object(edit, param)
        kind = fields.check_enum(edit.get("type"), f"{param}.type",
                                 ("clear_tool_uses_20250919", "clear_thinking_20251015"))
        if kind == "clear_thinking_20251015":
            if edit.get("keep") != "all":
                raise Unsupported("Clearing earlier thinking turns is not supported; "
                                  "only keep: \"all\" is accepted.", param=f"{param}.keep")
            continue
        trigger = edit.get("trigger")
        if trigger is None:
            triggers.append(DEFAULT_CLEAR_TRIGGER)
            continue
        trigger = fields.require_object(trigger, f"{param}.trigger")
        if trigger.get("type") != "input_tokens":
            raise Unsupported("Only input_tokens triggers are accepted (clearing is not "
                              "supported, so a trigger must be out of the context's reach).",
                              param=f"{param}.trigger.type")
        triggers.append(fields.opt_int(trigger.get("value"), f"{param}.trigger.value", 1)
                        or DEFAULT_CLEAR_TRIGGER)
    return min(triggers, default=None)


def _check_advisory(body: dict) -> None:
    """Fields that steer accounting or placement at Anthropic and change nothing here; a
    malformed value is still the client's bug."""
    metadata = body.get("metadata")
    if metadata is not None:
        fields.opt_string(fields.require_object(metadata, "metadata").get("user_id"),
                          "metadata.user_id")
    for name, allowed in (("service_tier", ("auto", "standard_only")),
                          ("speed", ("standard", "fast"))):
        if body.get(name) is not None:
            fields.check_enum(body[name], name, allowed)
    fields.opt_string(body.get("inference_geo"), "inference_geo")


def _sampling(body: dict, request: AnthropicRequest, vocab_size: int) -> None:
    request.temperature = fields.opt_number(body.get("temperature"), "temperature", 0, 1)
    request.top_p = fields.opt_number(body.get("top_p"), "top_p", 0, 1)
    request.engine = engine_fields(body, vocab_size)
    stops = body.get("stop_sequences")
    if stops is not None:
        if len(fields.require_list(stops, "stop_sequences")) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(f"'stop_sequences' holds at most {MAX_STOP_SEQUENCES} strings.",
                                 param="stop_sequences")
        request.stop_sequences = tuple(
            fields.require_string(s, f"stop_sequences[{n}]", non_empty=True)
            for n, s in enumerate(fields.require_list(stops, "stop_sequences")))
    request.stream = bool(fields.opt_bool(body.get("stream"), "stream"))
    request.background = fields.is_background(body.get("priority"))
    request.draft = fields.allows_draft(body.get("draft"))


def _max_tokens(value) -> int | None:
    if value == 0 and not isinstance(value, bool):
        raise InvalidRequest("max_tokens must be positive: a zero-output (cache prewarm) "
                             "request is not supported.", param="max_tokens")
    return fields.opt_int(value, "max_tokens", 1)


def parse_request(body, *, default_max_tokens: int, vocab_size: int, count_only: bool = False,
                  vision: bool = False) -> AnthropicRequest:
    """`count_only` (count_tokens): the output-only fields (max_tokens, sampling, the engine
    fields, stream, priority, draft) are neither read nor validated, as they cannot affect a
    count (serving.md). Unknown fields are ignored (the caller warns: `fields.warn_unknown`)."""
    body = fields.require_object(body, "body")
    _check_fields(body)
    _check_advisory(body)
    model = fields.require_string(body.get("model"), "model", non_empty=True)
    max_tokens = None if count_only else _max_tokens(body.get("max_tokens"))
    output_config = fields.require_object(body.get("output_config") or {}, "output_config")
    if output_config.get("format") is not None:
        raise Unsupported("Structured outputs need constrained decoding.",
                          param="output_config.format")
    effort = output_config.get("effort")
    if effort is not None:
        fields.check_enum(effort, "output_config.effort", ANTHROPIC_EFFORTS)
    mode, enable, budget = _thinking(body.get("thinking"), max_tokens, default_max_tokens)
    template = fields.merge_template_options(
        body.get("chat_template_kwargs"),
        {"enable_thinking": enable, "reasoning_effort": effort,
         "preserve_thinking": fields.opt_bool(body.get("preserve_thinking"), "preserve_thinking")},
        typed_params={"enable_thinking": "thinking.type", "reasoning_effort": "output_config.effort",
                      "preserve_thinking": "preserve_thinking"})
    declared, tool_marks = _parse_tools(body.get("tools"))
    tool_choice, tools, parallel = _tool_choice(body.get("tool_choice"), declared)
    lowered = lower_messages(body.get("system"), body.get("messages"), vision=vision)
    if lowered.is_prefill and template.enable_thinking:
        raise InvalidRequest("An assistant prefill cannot start with thinking enabled.",
                             param="thinking")
    _apply_cache_marks(lowered, tool_marks,
                       cache_control_ttl(body.get("cache_control"), "cache_control"))
    options = PromptOptions(
        add_generation_prompt=not lowered.is_prefill,
        continue_final_message=lowered.is_prefill,
        enable_thinking=template.enable_thinking, preserve_thinking=template.preserve_thinking,
        reasoning_effort=template.template_effort, template_kwargs=dict(template.extra_kwargs))
    request = AnthropicRequest(model=model, tools=tools, tool_choice=tool_choice,
                               parallel_tool_calls=parallel,
                               max_tokens=max_tokens,
                               conversation=Conversation(lowered.messages, list(tools), options),
                               thinking_budget=budget, thinking_mode=mode)
    request.clear_trigger = context_edit_trigger(body.get("context_management"))
    if not count_only:
        _sampling(body, request, vocab_size)
    return request
