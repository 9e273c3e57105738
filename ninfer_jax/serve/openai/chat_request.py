"""Validation of a Chat Completions (and Completions) request body into typed options.

Three kinds of field: those the engine executes (sampling, limits, stop strings, stop token
ids, tools, thinking options, priority), those that are accepted because their value is
neutral or advisory (metadata, user, all-zero logit_bias, logprobs:false, ...), and those whose
behaviour the engine cannot provide, rejected with a field-specific 400 that says what is
missing. Unknown top-level fields are ignored, as OpenAI-compatible servers do, and named
in one warning (`warn_unknown`). A malformed value names its field.
"""
from __future__ import annotations

import dataclasses
import json
import math

from ninfer_jax.errors import InvalidRequest, ModelNotFound, Unsupported
from ninfer_jax.serve.core.generation import GenerationOptions
from ninfer_jax.serve.core.tools import ToolChoice
from ninfer_jax.serve.core.fields import (allows_draft, check_enum, integer_key,
                                         is_background, opt_bool, opt_int, opt_number,
                                         opt_string, require_list, require_object,
                                         require_string, warn_unknown)
from ninfer_jax.serve.core.engine_fields import ENGINE_FIELDS, engine_fields, sampler_extensions
from ninfer_jax.serve.core.sampling import SAMPLING_FIELDS

MAX_STOP_STRINGS = 4
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
# Constrained-decoding aliases from other servers: rejected explicitly, never ignored.
# (vLLM's guided_decoding_backend only picks the engine for those, so alone it is neutral.)
CONSTRAINED_ALIASES = ("grammar", "structured_outputs", "guided_json", "guided_regex",
                       "guided_choice", "guided_grammar")
_SAMPLING_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
# vLLM's sampling extras that clients of OpenAI-compatible servers send: each changes the reply
# (or the prompt) at any value but its neutral one, which alone is accepted (name -> neutral).
VLLM_EXTRAS = {"min_tokens": 0, "include_stop_str_in_output": False, "use_beam_search": False,
               "length_penalty": 1.0, "truncate_prompt_tokens": None, "prompt_logprobs": None,
               "allowed_token_ids": None, "bad_words": ()}
# Every top-level field Completions reads, refuses or accepts as advisory, and Chat's on top.
COMPLETIONS_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "max_completion_tokens", *SAMPLING_FIELDS, *ENGINE_FIELDS,
    "stop", "stream", "stream_options", "n", "best_of", "logprobs", "suffix", "echo",
    "logit_bias", "metadata", "user", "safety_identifier", "service_tier",
    "guided_decoding_backend", *CONSTRAINED_ALIASES, "repetition_penalty", *VLLM_EXTRAS,
    "mm_processor_kwargs", "prompt_cache_key", "prompt_cache_retention",
    "prompt_cache_options", "timings_per_token", "return_progress", "priority", "draft",
})
CHAT_FIELDS = (COMPLETIONS_FIELDS - {"prompt", "best_of", "suffix", "echo"}) | {
    "messages", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs",
    "response_format", "modalities", "audio", "store", "web_search_options", "moderation",
    "verbosity", "functions", "function_call", "prediction", "chat_template_kwargs",
    "enable_thinking", "preserve_thinking", "reasoning_effort", "thinking_budget",
    "continue_final_message", "add_generation_prompt",
}


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    stream: bool = False
    include_usage: bool = False
    timings_per_token: bool = False
    return_progress: bool = False


def unsupported(param: str, guarantee: str) -> Unsupported:
    return Unsupported(f"'{param}' is not supported: {guarantee}.", param=param)


def check_model(body: dict, public_id: str) -> None:
    model = require_string(body.get("model"), "model", non_empty=True)
    if model != public_id:
        raise ModelNotFound(f"The model '{model}' does not exist; this server serves "
                            f"'{public_id}'.", param="model")


def max_tokens(body: dict) -> tuple[int | None, str]:
    """(limit, the field it came from): max_completion_tokens or the legacy max_tokens."""
    new = opt_int(body.get("max_completion_tokens"), "max_completion_tokens", 0)
    old = opt_int(body.get("max_tokens"), "max_tokens", 0)
    if new is not None and old is not None and new != old:
        raise InvalidRequest("'max_tokens' and 'max_completion_tokens' disagree; send one.",
                             param="max_tokens")
    return (new, "max_completion_tokens") if new is not None else (old, "max_tokens")


def sampling_fields(body: dict) -> dict:
    values = {name: opt_number(body.get(name), name, *bounds)
              for name, bounds in _SAMPLING_RANGES.items()}
    values.update(sampler_extensions(body))
    return {name: values[name] for name in SAMPLING_FIELDS}


def stop_strings(value) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else require_list(value, "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"'stop' holds at most {MAX_STOP_STRINGS} strings.", param="stop")
    for index, stop in enumerate(stops):
        where = "stop" if isinstance(value, str) else f"stop[{index}]"
        require_string(stop, where, non_empty=True)
    return tuple(stops)


def stream_options(body: dict) -> StreamOptions:
    stream = bool(opt_bool(body.get("stream"), "stream"))
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        options = require_object(options, "stream_options")
        include_usage = bool(opt_bool(options.get("include_usage"),
                                      "stream_options.include_usage"))
        opt_bool(options.get("include_obfuscation"), "stream_options.include_obfuscation")
    return StreamOptions(
        stream, include_usage,
        bool(opt_bool(body.get("timings_per_token"), "timings_per_token")),
        bool(opt_bool(body.get("return_progress"), "return_progress")))


def implicit_cache(body: dict) -> bool:
    """prompt_cache_options.mode: implicit (default) or explicit (no automatic write). The
    other OpenAI cache hints are validated here and have no further effect: the key is no
    prefix identity and retention follows the resource scheduler (the contract)."""
    opt_string(body.get("prompt_cache_key"), "prompt_cache_key")
    if body.get("prompt_cache_retention") is not None:
        check_enum(body["prompt_cache_retention"], "prompt_cache_retention", ("in_memory", "24h"))
    options = body.get("prompt_cache_options")
    if options is None:
        return True
    mode = require_object(options, "prompt_cache_options").get("mode", "implicit")
    return check_enum(mode, "prompt_cache_options.mode", ("implicit", "explicit")) == "implicit"


def check_advisory(body: dict) -> None:
    """Advisory identifiers change nothing here, but a non-string one is still the client's
    bug (a 400 naming it), as it is at OpenAI. `metadata` stays free-form: clients of
    OpenAI-compatible servers put structured tracing data there."""
    for name in ("user", "safety_identifier", "service_tier", "guided_decoding_backend"):
        opt_string(body.get(name), name)


def check_common_unsupported(body: dict) -> None:
    """Fields shared by Chat and Completions whose requested behaviour cannot be provided."""
    check_advisory(body)
    n = opt_int(body.get("n"), "n", 1)
    if n not in (None, 1):
        raise unsupported("n", "only one choice is generated per request")
    logit_bias = body.get("logit_bias")
    if logit_bias is not None:
        for token, bias in require_object(logit_bias, "logit_bias").items():
            integer_key(token, "logit_bias")
            opt_number(bias, f"logit_bias.{token}", -100, 100)
            if bias != 0:
                raise unsupported("logit_bias", "token biases are not applied by the sampler")
    for name in CONSTRAINED_ALIASES:
        if body.get(name) is not None:
            raise unsupported(name, "constrained decoding is not available")
    penalty = opt_number(body.get("repetition_penalty"), "repetition_penalty", 0, 10)
    if penalty not in (None, 1.0):
        raise unsupported("repetition_penalty", "only the neutral value 1 is accepted")
    check_vllm_extras(body)
    kwargs = body.get("mm_processor_kwargs")
    if kwargs is not None and any(v is not None for v in
                                  require_object(kwargs, "mm_processor_kwargs").values()):
        raise unsupported("mm_processor_kwargs", "there is no media processor to configure")


def check_vllm_extras(body: dict) -> None:
    """vLLM's sampling extras (VLLM_EXTRAS) are refused unless neutral: ignoring one would
    hand back a reply that lacks what the client asked for (a minimum length, the stop
    string kept, a banned word avoided) without saying so."""
    values = {"min_tokens": opt_int(body.get("min_tokens"), "min_tokens", 0),
              "include_stop_str_in_output": opt_bool(body.get("include_stop_str_in_output"),
                                                     "include_stop_str_in_output"),
              "use_beam_search": opt_bool(body.get("use_beam_search"), "use_beam_search"),
              "length_penalty": opt_number(body.get("length_penalty"), "length_penalty",
                                          -math.inf, math.inf)}
    bad_words = body.get("bad_words")
    values["bad_words"] = () if bad_words is None else tuple(require_list(bad_words,
                                                                          "bad_words"))
    for name in ("truncate_prompt_tokens", "prompt_logprobs", "allowed_token_ids"):
        values[name] = body.get(name)
    for name, neutral in VLLM_EXTRAS.items():
        if values[name] is not None and values[name] != neutral:
            raise unsupported(name, f"only its neutral value {json.dumps(neutral)} is accepted"
                              if neutral is not None else "only null is accepted")


def base_options(body: dict, protocol: str, vocab_size: int) -> GenerationOptions:
    limit, limit_param = max_tokens(body)
    engine = engine_fields(body, vocab_size)
    return GenerationOptions(
        max_tokens=limit, max_tokens_param=limit_param, sampling=sampling_fields(body),
        seed=engine.seed, stop=stop_strings(body.get("stop")),
        stop_token_ids=engine.stop_token_ids, ignore_eos=engine.ignore_eos, protocol=protocol,
        background=is_background(body.get("priority")), draft=allows_draft(body.get("draft")),
        stream=body.get("stream") is True, implicit_cache=implicit_cache(body))


def check_chat_unsupported(body: dict) -> None:
    check_common_unsupported(body)
    if opt_bool(body.get("logprobs"), "logprobs"):
        raise unsupported("logprobs", "log probabilities are not computed")
    if opt_int(body.get("top_logprobs"), "top_logprobs", 0, 20) not in (None, 0):
        raise unsupported("top_logprobs", "log probabilities are not computed")
    fmt = body.get("response_format")
    if fmt is not None:
        kind = check_enum(require_object(fmt, "response_format").get("type"),
                          "response_format.type", RESPONSE_FORMATS)
        if kind != "text":
            raise unsupported("response_format", "JSON output needs constrained decoding")
    modalities = body.get("modalities")
    if modalities is not None and require_list(modalities, "modalities") != ["text"]:
        raise unsupported("modalities", "the model produces text only")
    if opt_bool(body.get("store"), "store"):
        raise unsupported("store", "chat completions are not stored")
    if body.get("web_search_options") is not None:
        raise unsupported("web_search_options", "the server has no web search")
    if body.get("moderation") not in (None, False):
        raise unsupported("moderation", "the server runs no moderation")
    verbosity = body.get("verbosity")
    if verbosity is not None:
        check_enum(verbosity, "verbosity", ("low", "medium", "high"))
        if verbosity != "medium":
            raise unsupported("verbosity", "the model's length cannot be steered")
    functions = body.get("functions")
    if functions is not None and require_list(functions, "functions"):
        raise unsupported("functions", "use 'tools' for function definitions")
    legacy_choice = body.get("function_call")
    if legacy_choice not in (None, "none", "auto"):
        raise unsupported("function_call", "use 'tool_choice' to select a tool")


def _named_function(value, param: str) -> str:
    value = require_object(value, param)
    if value.get("type") != "function":
        raise InvalidRequest(f"'{param}.type' must be 'function'.", param=f"{param}.type")
    function = require_object(value.get("function"), f"{param}.function")
    return require_string(function.get("name"), f"{param}.function.name", non_empty=True)


def tool_choice(value) -> ToolChoice:
    if value is None or value == "auto":
        return ToolChoice("auto")
    if value in ("none", "required"):
        return ToolChoice(value)
    if isinstance(value, str):
        raise InvalidRequest("'tool_choice' must be auto, none, required or an object.",
                             param="tool_choice")
    value = require_object(value, "tool_choice")
    if value.get("type") == "function":
        return ToolChoice("required", name=_named_function(value, "tool_choice"))
    if value.get("type") != "allowed_tools":
        raise InvalidRequest("'tool_choice.type' must be 'function' or 'allowed_tools'.",
                             param="tool_choice.type")
    allowed = require_object(value.get("allowed_tools"), "tool_choice.allowed_tools")
    mode = check_enum(allowed.get("mode", "auto"), "tool_choice.allowed_tools.mode",
                      ("auto", "required"))
    names = tuple(_named_function(tool, f"tool_choice.allowed_tools.tools[{i}]") for i, tool in
                  enumerate(require_list(allowed.get("tools"), "tool_choice.allowed_tools.tools")))
    return ToolChoice(mode, allowed=names)
