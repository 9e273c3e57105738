"""The Anthropic Messages flows: create (aggregate or SSE) and count_tokens.

HTTP-framework free, like responses/service.py. A create request is parsed, rendered and
submitted synchronously and then waits for admission (generation.start, shared by every
dialect), so overload (529) and queue timeout
(504) remain HTTP errors; the stream opens with message_start only once admission has fixed
the cached-prefix split, which makes message_start's usage exact. An error after that is an
Anthropic `error` event.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Iterator

from ninfer_jax.engine.request import RequestHandle
from ninfer_jax.errors import InternalError, NinferError, Unsupported
from ninfer_jax.serve.core import fields, generation
from ninfer_jax.serve.anthropic.output import MessageBuilder, usage_object
from ninfer_jax.serve.anthropic.request import KNOWN_FIELDS, AnthropicRequest, parse_request
from ninfer_jax.serve.wire.disconnect import NO_PEER, PeerWatch
from ninfer_jax.serve.core.errors import anthropic_error_body
from ninfer_jax.serve.core.output import HEARTBEAT, GenerationResult, OutputAssembler
from ninfer_jax.serve.core.generation import render_chat
from ninfer_jax.serve.wire.sse import builder_frames, sse_frames

log = logging.getLogger("ninfer_jax.serve.anthropic")


@dataclasses.dataclass
class MessagesRun:
    request: AnthropicRequest
    request_id: str
    builder: MessageBuilder
    handle: RequestHandle
    assembler: OutputAssembler
    prompt_tokens: int
    cached_tokens: int


class MessagesService:
    def __init__(self, ctx):
        self.ctx = ctx

    def _parse(self, body, *, count_only: bool = False) -> AnthropicRequest:
        request = parse_request(body, default_max_tokens=self.ctx.config.default_max_tokens,
                                vocab_size=self.ctx.tokenizer.vocab_size,
                                count_only=count_only, vision=self.ctx.config.vision)
        if request.thinking_mode == "enabled" and self.ctx.reasoning_markers is None:
            # Enabled (unlike adaptive) promises thinking under a budget; a model with no
            # thinking channel would silently answer without it.
            raise Unsupported("thinking.type 'enabled' needs a model with a thinking mode; "
                              "this model's artifact declares none. Use 'adaptive' or "
                              "'disabled'.", param="thinking.type")
        if request.clear_trigger is not None and request.clear_trigger < self.ctx.max_context:
            raise Unsupported(
                f"Server-side clearing of tool uses is not supported, and a prompt can reach "
                f"this edit's trigger of {request.clear_trigger} input tokens (the context "
                f"window is {self.ctx.max_context}); use a trigger of at least the window.",
                param="context_management.edits")
        return request

    def count_tokens(self, body) -> dict:
        request = self._parse(body, count_only=True)
        return {"input_tokens": len(render_chat(self.ctx, request.conversation).ids)}

    def start(self, body, request_id: str, peer: PeerWatch = NO_PEER) -> MessagesRun:
        request = self._parse(body)
        fields.warn_unknown(body, KNOWN_FIELDS, request_id)
        options = generation.GenerationOptions(
            max_tokens=request.max_tokens, max_tokens_param="max_tokens",
            sampling={"temperature": request.temperature, "top_p": request.top_p,
                      **request.engine.sampling},
            seed=request.engine.seed, stop=request.stop_sequences, stop_param="stop_sequences",
            stop_token_ids=request.engine.stop_token_ids, ignore_eos=request.engine.ignore_eos,
            tool_choice=request.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            thinking_budget=request.thinking_budget,
            thinking_budget_param="thinking.budget_tokens", protocol="anthropic",
            background=request.background, draft=request.draft, stream=request.stream)
        prepared = generation.prepare_chat(self.ctx, request.conversation, options, request_id)
        started = generation.start(self.ctx, prepared, peer)
        cached = started.admitted.cache_n if started.admitted is not None else 0
        return MessagesRun(request, request_id, MessageBuilder(request.model), started.handle,
                           started.assembler, len(prepared.request.prompt_ids), cached)

    def _feed(self, run: MessagesRun, delta) -> None:
        if delta.kind == "reasoning":
            run.builder.thinking(delta.text)
        elif delta.kind == "content":
            run.builder.text(delta.text)

    def _stop_reason(self, run: MessagesRun, result: GenerationResult) -> tuple[str, str | None]:
        if result.finish_reason == "tool_calls":
            return "tool_use", None
        if result.finish_reason == "length":
            # The client's own max_tokens, once reached, is the reason even when it also
            # filled the context exactly; only a limit the context imposed is the window's.
            asked = run.request.max_tokens
            if (asked is None or result.completion_tokens < asked) and (
                    result.prompt_tokens + result.completion_tokens >= self.ctx.max_context):
                return "model_context_window_exceeded", None
            return "max_tokens", None
        if result.matched_stop is not None:
            return "stop_sequence", result.matched_stop
        return "end_turn", None

    def _finish(self, run: MessagesRun, result: GenerationResult) -> dict:
        for call in result.tool_calls:
            run.builder.tool_use(call.name, call.arguments)
        reason, sequence = self._stop_reason(run, result)
        usage = usage_object(result.prompt_tokens, result.cached_tokens,
                             result.completion_tokens)
        return run.builder.finish(reason, usage, stop_sequence=sequence)

    def run_aggregate(self, run: MessagesRun) -> dict:
        run.builder.start(run.prompt_tokens, run.cached_tokens)
        for item in run.assembler.stream():
            if item is not HEARTBEAT:
                self._feed(run, item)
        if run.assembler.error is not None:
            raise run.assembler.error
        return self._finish(run, run.assembler.result())

    def run_stream(self, run: MessagesRun) -> Iterator[bytes]:
        builder, assembler = run.builder, run.assembler
        builder.start(run.prompt_tokens, run.cached_tokens)
        try:
            yield sse_frames(builder.take_events())
            try:
                yield from builder_frames(assembler, lambda delta: self._feed(run, delta),
                                          builder.take_events)
                if assembler.error is not None:
                    builder.fail(self._error_body(run, assembler.error))
                else:
                    self._finish(run, assembler.result())
            except Exception as error:
                log.exception("messages stream failed (request %s)", run.request_id)
                assembler.response_failed(error)
                builder.fail(self._error_body(run, InternalError(
                    "The server hit an internal error.")))
            yield sse_frames(builder.take_events())
        finally:
            assembler.release()

    def _error_body(self, run: MessagesRun, error: NinferError) -> dict:
        return anthropic_error_body(error, f"req_{run.request_id}")
