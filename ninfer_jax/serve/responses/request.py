"""Parsing and validating a Responses create / input_tokens body into a ResponsesRequest.

Top-level fields fall in three sets: accepted (validated here, the engine fields every
dialect shares included: seed, ignore_eos, stop_token_ids, top_k, min_p, the penalties),
recognized but unsupported (a field-specific 400 naming what cannot be honoured), and
unknown (`unknown_parameter`). `build_conversation` then joins the stored parent context with the
new input Items and lowers them into the one internal Conversation.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.errors import InvalidRequest, ModelNotFound, UnknownParameter, Unsupported
from ninfer_jax.serve.core import fields
from ninfer_jax.serve.core.engine_fields import ENGINE_FIELDS, EngineFields, engine_fields
from ninfer_jax.serve.responses.store import StoredResponse
from ninfer_jax.serve.responses.history import lower_items
from ninfer_jax.serve.responses.input import normalize_input
from ninfer_jax.serve.responses.tools import ToolSet, parse_tool_choice, parse_tools
from ninfer_jax.text.conversation import Conversation, Message, PromptOptions

PROMPT_FIELDS = frozenset({
    "model", "input", "instructions", "previous_response_id", "reasoning", "tools",
    "tool_choice", "parallel_tool_calls", "text", "truncation", "preserve_thinking",
    "chat_template_kwargs",
})
CREATE_FIELDS = PROMPT_FIELDS | {
    "stream", "store", "max_output_tokens", "temperature", "top_p", "metadata",
    "client_metadata", "max_tool_calls", "top_logprobs", "service_tier", "background",
    "include", "stream_options", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "safety_identifier", "user", "priority", "draft",
    *ENGINE_FIELDS,
}
# Recognized OpenAI features that this server cannot provide at all.
UNSUPPORTED_FIELDS = {
    "conversation": "Conversations objects are not supported; use previous_response_id.",
    "prompt": "Stored prompt templates are not supported.",
    "context_management": "Context management (compaction) is not supported.",
    "moderation": "Hosted moderation is not supported.",
    "image": "Image generation is not supported.",
    "access_programs": "Programmatic tool calling is not supported.",
    "background_options": "Background execution is not supported.",
    "personality": "Personalities are not supported.",
}
METADATA_MAX_PAIRS, METADATA_MAX_KEY, METADATA_MAX_VALUE = 16, 64, 512
TEXT_FORMATS = ("text", "json_object", "json_schema")


@dataclasses.dataclass
class ResponsesRequest:
    model: str
    input_items: list[dict]
    instructions: str | None
    previous_response_id: str | None
    tools: ToolSet
    template: fields.TemplateOptions
    echo: dict  # wire fields the Response object repeats (tool_choice, tools, text, ...)
    stream: bool = False
    store: bool = True
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    implicit_cache: bool = True
    # `priority` background (yields to foreground work); unrelated to the wire's `background`
    # (asynchronous execution), which is rejected.
    background_priority: bool = False
    draft: bool = True  # TensorFold's `draft` (false: no speculation for this request)
    # seed, ignore_eos, stop_token_ids and the sampler extensions (top_k, min_p, penalties)
    engine: EngineFields = dataclasses.field(default_factory=EngineFields)


def check_fields(body: dict, allowed: frozenset) -> None:
    for key in body:
        if key in UNSUPPORTED_FIELDS:
            raise Unsupported(UNSUPPORTED_FIELDS[key], param=key)
        if key not in allowed:
            raise UnknownParameter(f"Unknown parameter: '{key}'.", param=key)


def check_model(value, public_model_id: str, *, required: bool = True) -> str:
    if value is None and not required:
        return public_model_id
    model = fields.require_string(value, "model", non_empty=True)
    if model != public_model_id:
        raise ModelNotFound(f"The model '{model}' does not exist; this server serves "
                            f"'{public_model_id}'.", param="model")
    return model


def _metadata(value) -> dict:
    if value is None:
        return {}
    value = fields.require_object(value, "metadata")
    if len(value) > METADATA_MAX_PAIRS:
        raise InvalidRequest(f"'metadata' holds at most {METADATA_MAX_PAIRS} pairs.",
                             param="metadata")
    for key, item in value.items():
        if len(key) > METADATA_MAX_KEY:
            raise InvalidRequest(f"metadata keys are at most {METADATA_MAX_KEY} characters.",
                                 param=f"metadata.{key}")
        fields.require_string(item, f"metadata.{key}")
        if len(item) > METADATA_MAX_VALUE:
            raise InvalidRequest(f"metadata values are at most {METADATA_MAX_VALUE} "
                                 "characters.", param=f"metadata.{key}")
    return dict(value)


def _text_config(value) -> dict:
    value = {} if value is None else fields.require_object(value, "text")
    text_format = value.get("format")
    if text_format is not None:
        kind = fields.check_enum(fields.require_object(text_format, "text.format").get("type"),
                                 "text.format.type", TEXT_FORMATS)
        if kind != "text":
            raise Unsupported("Only text.format {'type':'text'} is supported; structured "
                              "outputs and JSON mode need constrained decoding.",
                              param="text.format")
    verbosity = value.get("verbosity")
    if verbosity is not None:
        fields.check_enum(verbosity, "text.verbosity", ("low", "medium", "high"))
    if verbosity not in (None, "medium"):
        raise Unsupported("Only medium verbosity is supported.", param="text.verbosity")
    echo = {"format": {"type": "text"}}
    if verbosity:
        echo["verbosity"] = verbosity
    return echo


def _reasoning(value) -> dict:
    value = {} if value is None else fields.require_object(value, "reasoning")
    effort = value.get("effort")
    if effort is not None:
        fields.check_enum(effort, "reasoning.effort", fields.REASONING_EFFORTS)
    # Summaries are advisory: reasoning Items always carry raw text and an empty summary.
    summary = value.get("summary", value.get("generate_summary"))
    if summary is not None:
        fields.check_enum(summary, "reasoning.summary", ("auto", "concise", "detailed"))
    return {"effort": effort, "summary": summary}


def _check_neutral_values(body: dict) -> None:
    """Fields accepted only at values that change nothing the engine cannot honour."""
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        raise Unsupported("truncation must be 'disabled': overlong input fails instead of "
                          "silently dropping items.", param="truncation")
    if fields.opt_int(body.get("top_logprobs"), "top_logprobs", 0):
        raise Unsupported("Log probabilities are not supported.", param="top_logprobs")
    if body.get("service_tier") not in (None, "auto", "default"):
        raise Unsupported("Only the default service tier exists.", param="service_tier")
    if fields.opt_bool(body.get("background"), "background"):
        raise Unsupported("Background execution is not supported.", param="background")
    include = body.get("include")
    if include is not None and fields.require_list(include, "include"):
        raise Unsupported("'include' must be empty: no optional output data is produced.",
                          param="include")
    fields.opt_int(body.get("max_tool_calls"), "max_tool_calls", 0)
    for key in ("prompt_cache_key", "safety_identifier", "user"):
        fields.opt_string(body.get(key), key)
    if body.get("prompt_cache_retention") is not None:
        fields.check_enum(body["prompt_cache_retention"], "prompt_cache_retention",
                          ("in_memory", "24h"))
    if body.get("client_metadata") is not None:
        fields.require_object(body["client_metadata"], "client_metadata")
    options = body.get("stream_options")
    if options is not None:
        options = fields.require_object(options, "stream_options")
        fields.opt_bool(options.get("include_obfuscation"), "stream_options.include_obfuscation")


def _implicit_cache(value) -> bool:
    if value is None:
        return True
    value = fields.require_object(value, "prompt_cache_options")
    mode = value.get("mode")
    if mode is None:
        return True
    return fields.check_enum(mode, "prompt_cache_options.mode", ("implicit", "explicit")) == "implicit"


def parse_request(body, public_model_id: str, *, vocab_size: int, count_only: bool = False,
                  vision: bool = False) -> ResponsesRequest:
    body = fields.require_object(body, "body")
    check_fields(body, PROMPT_FIELDS if count_only else CREATE_FIELDS)
    model = check_model(body.get("model"), public_model_id, required=not count_only)
    reasoning = _reasoning(body.get("reasoning"))
    template = fields.merge_template_options(
        body.get("chat_template_kwargs"),
        {"preserve_thinking": fields.opt_bool(body.get("preserve_thinking"), "preserve_thinking"),
         "reasoning_effort": reasoning["effort"]},
        typed_params={"preserve_thinking": "preserve_thinking",
                      "reasoning_effort": "reasoning.effort"})
    declared = parse_tools(body.get("tools"))
    tools = parse_tool_choice(body.get("tool_choice"), declared, body.get("parallel_tool_calls"))
    _check_neutral_values(body)
    request = ResponsesRequest(
        model=model,
        input_items=normalize_input(body.get("input"), vision=vision),
        instructions=fields.opt_string(body.get("instructions"), "instructions"),
        previous_response_id=fields.opt_string(body.get("previous_response_id"),
                                               "previous_response_id"),
        tools=tools, template=template,
        echo={"tool_choice": body.get("tool_choice") or "auto",
              "tools": body.get("tools") or [], "text": _text_config(body.get("text")),
              "reasoning": reasoning, "metadata": _metadata(body.get("metadata")),
              "max_tool_calls": fields.opt_int(body.get("max_tool_calls"), "max_tool_calls", 0),
              "prompt_cache_key": body.get("prompt_cache_key"),
              "prompt_cache_retention": body.get("prompt_cache_retention"),
              "safety_identifier": body.get("safety_identifier"), "user": body.get("user")},
        implicit_cache=_implicit_cache(body.get("prompt_cache_options")),
    )
    if not count_only:
        request.stream = bool(fields.opt_bool(body.get("stream"), "stream"))
        store = fields.opt_bool(body.get("store"), "store")
        request.store = True if store is None else store
        request.max_output_tokens = fields.opt_int(body.get("max_output_tokens"),
                                                   "max_output_tokens", 0)
        request.temperature = fields.opt_number(body.get("temperature"), "temperature", 0, 2)
        request.top_p = fields.opt_number(body.get("top_p"), "top_p", 0, 1)
        request.background_priority = fields.is_background(body.get("priority"))
        request.draft = fields.allows_draft(body.get("draft"))
        request.engine = engine_fields(body, vocab_size)
    return request


def resolve_preserve_thinking(request: ResponsesRequest, parent: StoredResponse | None,
                              server_default: bool) -> bool | None:
    """Request value, else the parent's resolved value, else the server flag (None = template)."""
    if request.template.preserve_thinking is not None:
        return request.template.preserve_thinking
    if parent is not None:
        return parent.preserve_thinking
    return True if server_default else None


def build_conversation(request: ResponsesRequest, parent: StoredResponse | None, *,
                       preserve_thinking: bool | None,
                       enable_thinking_default: bool | None = None) -> Conversation:
    """The Conversation for this request: instructions, parent context, then new input."""
    pairs = [(item, "previous_response_id") for item in (parent.context if parent else ())]
    pairs += [(item, f"input[{n}]") for n, item in enumerate(request.input_items)]
    if not request.input_items and not any(
            item["type"] == "message" and item["role"] == "user" for item, _ in pairs):
        raise InvalidRequest("'input' may be omitted only when previous_response_id already "
                             "supplies a user message.", param="input")
    lowered = lower_items(pairs)
    if request.instructions is not None:
        lowered.messages.insert(0, Message(role="developer", content=request.instructions))
        lowered.explicit_marks = [n + 1 for n in lowered.explicit_marks]
        lowered.cacheable = [0] + [n + 1 for n in lowered.cacheable]
    lowered.apply_cache_breakpoints(implicit=request.implicit_cache)
    enable = request.template.enable_thinking
    options = PromptOptions(
        enable_thinking=enable if enable is not None else enable_thinking_default,
        preserve_thinking=preserve_thinking,
        reasoning_effort=request.template.template_effort,
        template_kwargs=dict(request.template.extra_kwargs))
    return Conversation(messages=lowered.messages, tools=list(request.tools.effective),
                        options=options)
