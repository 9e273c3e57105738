"""The bodies of the per-request JSONL records (docs/operations.md lists every field).

Pure functions of a RequestTrace and the engine's events: request shape, request_start,
request_rejected, request_done, request_error and request_scheduling. They read counts, ids,
flags and seconds, and never copy text: no prompt, no generated text, no stop strings, no
tool names or arguments.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.errors import NinferError
from ninfer_jax.engine.policies import ForcedToolCall, ThinkingBudget

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
             "responses": "/v1/responses", "anthropic": "/v1/messages"}
# The speculative object of a request the server does not speculate for (no --spec, or the
# request's `draft: false`): the documented shape, zeros.
NO_SPECULATION = {"backend": None, "draft_window": 0, "rounds": 0, "drafted_tokens": 0,
                  "accepted_tokens": 0, "fallback_steps": 0, "accepted_per_position": []}


def seed_source(options, overrides) -> str:
    """Where the request's seed came from: request | server (--seed) | random."""
    if getattr(options, "seed", None) is not None:
        return "request"
    return "server" if overrides.seed is not None else "random"


def request_shape(options, conversation) -> dict:
    choice = getattr(options, "tool_choice", None)
    prompt_options = getattr(conversation, "options", None)
    return {
        "protocol": getattr(options, "protocol", "unknown"),
        "endpoint": ENDPOINTS.get(getattr(options, "protocol", ""), None),
        "stream": bool(getattr(options, "stream", False)),
        "num_messages": len(conversation.messages) if conversation is not None else None,
        "num_tools": len(conversation.tools) if conversation is not None else 0,
        "tool_choice": getattr(choice, "mode", "auto"),
        "tool_choice_named": getattr(choice, "name", None) is not None,
        "parallel_tool_calls": getattr(options, "parallel_tool_calls", True),
        "requested_max_tokens": getattr(options, "max_tokens", None),
        "num_stop_strings": len(getattr(options, "stop", ()) or ()),
        "num_stop_token_ids": len(getattr(options, "stop_token_ids", ()) or ()),
        "ignore_eos": bool(getattr(options, "ignore_eos", False)),
        "requested_reasoning_effort": getattr(prompt_options, "reasoning_effort", None),
        "requested_enable_thinking": getattr(prompt_options, "enable_thinking", None),
        "preserve_thinking": getattr(prompt_options, "preserve_thinking", None),
        "requested_thinking_budget": getattr(options, "thinking_budget", None),
        "has_session": getattr(options, "session_key", None) is not None,
        "num_media_items": len(conversation.media) if conversation is not None else 0,
    }


def _identity(trace) -> dict:
    return {"request_id": trace.request_id, "request_seq": trace.request_seq,
            "protocol": trace.shape["protocol"]}


def error_fields(error: NinferError, protocol: str) -> dict:
    """The status/type/code/param/message the client received for `error`."""
    from ninfer_jax.serve.core.errors import anthropic_status

    anthropic = protocol == "anthropic"
    return {"status": anthropic_status(error) if anthropic else error.status,
            "type": error.anthropic_type if anthropic else error.openai_type,
            "code": error.code, "param": error.param, "message": error.message}


def _sampling(trace) -> dict:
    params = trace.prepared.request.sampling
    return {**dataclasses.asdict(params), "greedy": params.is_greedy,
            "seed_source": trace.seed_source}


def _policy_flags(prepared) -> dict:
    return {"thinking_budget": any(isinstance(p, ThinkingBudget) for p in prepared.policies),
            "forced_tool_call": any(isinstance(p, ForcedToolCall) for p in prepared.policies)}


def rejected(trace, error: NinferError, stage: str) -> dict:
    return {**_identity(trace), "phase": "prepare", "stage": stage, "shape": trace.shape,
            "error": error_fields(error, trace.shape["protocol"])}


def started(trace) -> dict:
    prepared = trace.prepared
    request, plan = prepared.request, prepared.plan
    return {
        **_identity(trace), "endpoint": trace.shape["endpoint"], "stream": trace.shape["stream"],
        "shape": trace.shape, "sampling": _sampling(trace),
        "requested_reasoning_effort": trace.shape["requested_reasoning_effort"],
        "preserve_thinking": trace.shape["preserve_thinking"],
        "enable_thinking": prepared.thinking, "thinking_budget": prepared.thinking_budget,
        "prompt_tokens": len(request.prompt_ids), "max_tokens": request.max_tokens,
        "priority": "background" if request.background else "foreground",
        "num_tools_offered": len(plan.tools),
        "tool_parsing": plan.tool_format is not None,
        "policies": _policy_flags(prepared),
        "num_cache_breakpoints": len(request.cache_breakpoints),
        "prepare_seconds": trace.submitted_at - trace.began_at,
        "media": _media(prepared),
    }


def _media(prepared) -> dict | None:
    """Request-scoped media preparation (serve/media/intake.MediaBatch); None without media."""
    batch = getattr(prepared, "media", None)
    if batch is None:
        return None
    outcomes = batch.outcomes
    kinds = [item.kind for item in batch.items]
    return {"num_images": kinds.count("image"), "num_videos": kinds.count("video"),
            "vision_tokens": batch.num_tokens, "source_bytes": batch.source_bytes,
            "payload_bytes": sum(item.nbytes for item in batch.items),
            "cache_hits": outcomes["hit"], "cache_misses": outcomes["miss"],
            "single_flight_joins": outcomes["joined"],
            "preprocess_wall_seconds": batch.wall_s, "preprocess_work_seconds": batch.work_s}


def _tool_parse(result) -> dict | None:
    if result is None:
        return None
    report = result.tool_report
    return {"marker_seen": report.marker_seen, "num_calls": report.num_calls,
            "omitted_empty_arguments": report.omitted_empty,
            "schema_mismatched_arguments": report.schema_mismatches,
            "fallback_reason": report.fallback_reason}


def _budget_applied(prepared) -> int:
    return sum(p.applied for p in prepared.policies if isinstance(p, ThinkingBudget))


def done(trace, finished, result) -> dict:
    """request_done from the engine's Finished event and, when the consumer produced one, the
    reply it built (finish reason after stop strings/tool calls, tool-parse diagnostics)."""
    usage, counters, prepared = finished.usage, finished.counters, trace.prepared
    completion = result.completion_tokens if result is not None else usage.completion_tokens
    output_ids = result.output_ids if result is not None else finished.output_ids
    engine_t = finished.timings
    first = trace.first_token_at
    return {
        **_identity(trace),
        "finish_reason": result.finish_reason if result is not None else finished.reason,
        "engine_finish_reason": finished.reason,
        "tokens": {"prompt": usage.prompt_tokens, "completion": completion,
                   "cached": usage.cached_tokens,
                   "computed_prefill": counters.get("prefill_tokens", 0),
                   "reasoning": result.reasoning_tokens if result is not None else None},
        "prefix_cache_hit_tokens": usage.cached_tokens,
        "prefix_reuse_path": "prefix" if usage.cached_tokens else "none",
        "result": {"generated_token_ids": list(output_ids), "tool_call_parse": _tool_parse(result),
                   "stop_string_matched": bool(result is not None and result.matched_stop)},
        "timings_seconds": {
            "prepare": trace.submitted_at - trace.began_at,
            "queue": engine_t.get("queue", 0.0),
            "ttft": None if first is None else first - trace.began_at,
            "vision": counters.get("vision_seconds", 0.0),
            "prefill": engine_t.get("prefill", 0.0),
            "decode": engine_t.get("decode", 0.0), "total": finished.time - trace.began_at,
            "speculative": _speculative(trace, counters),
        },
        "generation": {"scheduling": {
            "preemptions": counters.get("preemptions", 0),
            "snapshot_restores": counters.get("snapshot_restores", 0),
            "replay_restores": counters.get("replay_restores", 0),
            "replayed_tokens": counters.get("replayed_tokens", 0),
            "restored_cached_tokens": counters.get("restored_cached_tokens", 0),
            "paused_seconds": counters.get("paused_seconds", 0.0), "transfer_bytes": 0}},
        "engine_counters": {"prefill_units": counters.get("prefill_units", 0),
                            "decode_rounds": counters.get("decode_rounds", 0)},
        "thinking": {"enabled": prepared.thinking, "budget": prepared.thinking_budget,
                     "budget_applied": _budget_applied(prepared)},
        "media": None if getattr(prepared, "media", None) is None else {
            # items inside a reused prefix are not encoded again
            "items_encoded": counters.get("vision_items", 0),
            "encode_seconds": counters.get("vision_seconds", 0.0)},
    }


def _speculative(trace, counters: dict) -> dict:
    """request_done's speculative object: the server's backend and draft window, and the
    request's rounds, drafted/accepted tokens, fallback steps and acceptance by position."""
    config = trace.observer.ctx.config
    if config.spec is None or not trace.prepared.request.speculative:
        return {**NO_SPECULATION, "accepted_per_position": []}
    window = config.draft_tokens or 0
    return {"backend": config.spec, "draft_window": window,
            "rounds": counters.get("spec_rounds", 0),
            "drafted_tokens": counters.get("spec_drafted", 0),
            "accepted_tokens": counters.get("spec_accepted", 0),
            "fallback_steps": counters.get("spec_fallback_steps", 0),
            "accepted_per_position": list(counters.get("spec_accepted_per_position")
                                          or [0] * window)}


def errored(trace, error: NinferError, when: float, stage: str | None = None) -> dict:
    """`stage`: response (the server failed to render the reply), else queue before any
    output and generation after it."""
    prepared = trace.prepared
    if stage is None:
        stage = "queue" if trace.first_token_at is None else "generation"
    return {**_identity(trace), "stage": stage,
            "sampling": _sampling(trace), "max_tokens": prepared.request.max_tokens,
            "prompt_tokens": len(prepared.request.prompt_ids),
            "elapsed_seconds": when - trace.began_at,
            "error": error_fields(error, trace.shape["protocol"])}


def _global_progress(stats) -> dict:
    return {"prefill_tokens": stats.prefill_tokens, "decode_tokens": stats.decode_tokens,
            "replayed_tokens": stats.replayed_tokens,
            "generation_tokens": stats.generation_tokens}


def _request_progress(counters: dict) -> dict:
    return {"prefill_tokens": counters.get("prefill_tokens", 0),
            "decode_rounds": counters.get("decode_rounds", 0),
            "replayed_tokens": counters.get("replayed_tokens", 0)}


def scheduling(trace, event, stats) -> dict:
    """A pause/restore/recovery transition (lifecycle.SchedulingEvent's kinds); route is
    snapshot or replay, None at pause_started."""
    return {**_identity(trace), "kind": event.kind, "preemption_index": event.preemption_index,
            "route": event.route, "num_tokens": event.num_tokens,
            "steady_ns": int(event.time * 1e9),
            "elapsed_ns": int((event.time - (trace.submitted_at or trace.began_at)) * 1e9),
            "progress": {"global": _global_progress(stats),
                         "request": _request_progress(event.counters)}}


def scheduling_terminal(trace, finished, stats) -> dict:
    """The closing boundary of a request that was paused at least once."""
    return {**_identity(trace), "kind": "terminal", "finish_reason": finished.reason,
            "preemption_index": finished.counters.get("preemptions", 0), "route": None,
            "steady_ns": int(finished.time * 1e9),
            "elapsed_ns": int((finished.time - (trace.submitted_at or trace.began_at)) * 1e9),
            "progress": {"global": _global_progress(stats),
                         "request": _request_progress(finished.counters)}}
