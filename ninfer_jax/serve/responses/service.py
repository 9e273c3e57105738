"""The Responses Core flows: create (aggregate or SSE), input token count, store access.

HTTP-framework free: the Falcon resources in responses/routes.py call these methods with a
parsed JSON body and a request id. A create request is prepared (parsed, parent context
joined, rendered, submitted) synchronously and waits for admission (generation.start, the
path every dialect shares), so a queue timeout or overload is still an ordinary HTTP error,
and only then opens the stream. Anything failing after that point becomes a
`response.failed` event.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Iterator

from ninfer_jax.engine.request import RequestHandle
from ninfer_jax.errors import (
    InternalError, InvalidRequest, NinferError, Unsupported)
from ninfer_jax.serve.core import generation
from ninfer_jax.serve.wire.disconnect import NO_PEER, PeerWatch
from ninfer_jax.serve.core.output import HEARTBEAT, GenerationResult, OutputAssembler
from ninfer_jax.serve.responses.store import (
    ResponseStore, StoredResponse, build_record, page_items)
from ninfer_jax.serve.core.fields import check_enum, new_id
from ninfer_jax.serve.responses.output import ResponseBuilder, usage_object
from ninfer_jax.serve.wire.sse import builder_frames, sse_frames
from ninfer_jax.serve.responses.request import (
    ResponsesRequest, build_conversation, parse_request, resolve_preserve_thinking)

log = logging.getLogger("ninfer_jax.serve.responses")
# After a client disconnects, how long to wait for the engine's terminal event so that a
# stored Response records its cancelled state.
CANCEL_GRACE_S = 2.0


def error_object(error: NinferError) -> dict:
    return {"code": error.code, "message": error.message}


@dataclasses.dataclass
class ResponsesRun:
    """One prepared and submitted create request."""

    request: ResponsesRequest
    parent: StoredResponse | None
    preserve_thinking: bool | None
    builder: ResponseBuilder
    handle: RequestHandle
    assembler: OutputAssembler


class ResponsesService:
    def __init__(self, ctx, store: ResponseStore):
        self.ctx = ctx
        self.store = store

    # ------------------------------------------------------------------ create
    def _conversation(self, request: ResponsesRequest):
        parent = None
        if request.previous_response_id is not None:
            parent = self.store.get(request.previous_response_id, param="previous_response_id")
        preserve = resolve_preserve_thinking(request, parent, self.ctx.config.preserve_thinking)
        return parent, preserve, build_conversation(request, parent, preserve_thinking=preserve)

    def start(self, body, request_id: str, peer: PeerWatch = NO_PEER) -> ResponsesRun:
        """Parse, prepare and submit; wait for admission while watching the client (`peer`).
        Raises typed errors, or disconnect.ClientGone."""
        request = parse_request(body, self.ctx.model_id,
                                vocab_size=self.ctx.tokenizer.vocab_size,
                                vision=self.ctx.config.vision)
        if request.store:
            self.store.check_can_store()
        parent, preserve, conversation = self._conversation(request)
        response_id = new_id("resp")
        if parent is not None:
            session_key = parent.session_key
        else:
            session_key = response_id if request.store else None
        options = generation.GenerationOptions(
            max_tokens=request.max_output_tokens, max_tokens_param="max_output_tokens",
            prompt_param="input",
            sampling={"temperature": request.temperature, "top_p": request.top_p,
                      **request.engine.sampling},
            seed=request.engine.seed, stop_token_ids=request.engine.stop_token_ids,
            ignore_eos=request.engine.ignore_eos, tool_choice=request.tools.choice,
            parallel_tool_calls=request.tools.parallel_tool_calls,
            thinking_budget_param="reasoning", protocol="responses", session_key=session_key,
            background=request.background_priority, draft=request.draft,
            stream=request.stream, implicit_cache=request.implicit_cache)
        prepared = generation.prepare_chat(self.ctx, conversation, options, request_id)
        builder = ResponseBuilder(self._envelope(response_id, request, prepared))
        started = generation.start(self.ctx, prepared, peer)
        return ResponsesRun(request, parent, preserve, builder, started.handle,
                            started.assembler)

    def _envelope(self, response_id: str, request: ResponsesRequest, prepared) -> dict:
        sampling = prepared.request.sampling
        echo = request.echo
        return {
            "id": response_id, "object": "response", "created_at": int(time.time()),
            "model": self.ctx.model_id, "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "max_tool_calls": echo["max_tool_calls"],
            "parallel_tool_calls": request.tools.parallel_tool_calls,
            "previous_response_id": request.previous_response_id,
            "reasoning": echo["reasoning"], "service_tier": "default", "store": request.store,
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "text": echo["text"], "tool_choice": echo["tool_choice"], "tools": echo["tools"],
            "top_logprobs": 0, "truncation": "disabled", "metadata": echo["metadata"],
            "background": False, "user": echo["user"],
            "prompt_cache_key": echo["prompt_cache_key"],
            "prompt_cache_retention": echo["prompt_cache_retention"],
            "safety_identifier": echo["safety_identifier"],
        }

    def _feed(self, run: ResponsesRun, deltas) -> None:
        for delta in deltas:
            if delta.kind == "reasoning":
                run.builder.reasoning(delta.text)
            elif delta.kind == "content":
                run.builder.content(delta.text)

    def _complete(self, run: ResponsesRun, result: GenerationResult) -> None:
        """Tool calls, terminal status and storage; emits the terminal (or failed) event."""
        builder = run.builder
        for call in result.tool_calls:
            builder.tool_call(call.name, call.arguments, namespace=call.namespace)
        usage = usage_object(result.prompt_tokens, result.cached_tokens,
                             result.completion_tokens, result.reasoning_tokens)
        if result.finish_reason == "length":
            builder.finish("incomplete", usage, incomplete_reason="max_output_tokens",
                           emit_terminal=False)
        else:
            status = "cancelled" if result.finish_reason == "cancelled" else "completed"
            builder.finish(status, usage, emit_terminal=False)
        if run.request.store:
            try:
                self.store.put(build_record(builder.response, run.request.input_items,
                                            run.parent, run.preserve_thinking, True))
            except NinferError as error:
                builder.fail(error_object(error))
                raise
        builder.emit_terminal()

    def run_aggregate(self, run: ResponsesRun) -> dict:
        for item in run.assembler.stream():
            if item is not HEARTBEAT:
                self._feed(run, [item])
        if run.assembler.error is not None:
            raise run.assembler.error
        self._complete(run, run.assembler.result())
        return run.builder.response

    def run_stream(self, run: ResponsesRun) -> Iterator[bytes]:
        """SSE frames for an admitted run; the client disconnecting cancels generation."""
        builder, assembler = run.builder, run.assembler
        builder.start()
        has_failed = False
        try:
            yield sse_frames(builder.take_events())
            try:
                yield from builder_frames(assembler, lambda delta: self._feed(run, [delta]),
                                          builder.take_events)
                if assembler.error is not None:
                    builder.fail(error_object(assembler.error))
                else:
                    self._complete_quietly(run)
            except Exception as error:
                log.exception("responses stream failed (request %s, response %s)",
                              run.handle.request.request_id, builder.response["id"])
                has_failed = True
                assembler.response_failed(error)
                builder.fail(error_object(InternalError("The server hit an internal error.")))
            yield sse_frames(builder.take_events())
        finally:
            if not assembler.done and has_failed:
                # response.failed is this Response's end: feeding the rest of the output to
                # the assembler that just broke (to store a cancelled Response) would raise
                # again, out of the stream.
                run.handle.cancel()
            elif not assembler.done:
                self._cancel_and_record(run)
            assembler.release()

    def _complete_quietly(self, run: ResponsesRun) -> None:
        try:
            self._complete(run, run.assembler.result())
        except NinferError as error:  # _complete already turned it into response.failed
            run.assembler.response_failed(error)

    def _cancel_and_record(self, run: ResponsesRun) -> None:
        """The client went away mid-stream: cancel, and store the cancelled Response."""
        run.handle.cancel()
        deadline = time.monotonic() + CANCEL_GRACE_S
        while not run.assembler.done and time.monotonic() < deadline:
            event = run.handle.next_event(timeout=max(deadline - time.monotonic(), 0.0))
            if event is None:
                break
            self._feed(run, run.assembler.feed(event))
        if run.assembler.finished is not None and run.request.store:
            self._complete_quietly(run)

    # ------------------------------------------------------------------ other endpoints
    def count_input_tokens(self, body) -> dict:
        request = parse_request(body, self.ctx.model_id, count_only=True,
                                vocab_size=self.ctx.tokenizer.vocab_size,
                                vision=self.ctx.config.vision)
        _, _, conversation = self._conversation(request)
        rendered = generation.render_chat(self.ctx, conversation)
        return {"object": "response.input_tokens", "input_tokens": len(rendered.ids)}

    def retrieve(self, response_id: str, query: dict) -> dict:
        if str(query.get("stream", "false")).lower() not in ("false", "0", ""):
            raise Unsupported("Stream recovery of a stored response is not supported.",
                              param="stream")
        if query.get("starting_after") not in (None, ""):
            raise Unsupported("Stream recovery is not supported.", param="starting_after")
        if query.get("include"):
            raise Unsupported("'include' must be empty.", param="include")
        return self.store.get(response_id).response

    def list_input_items(self, response_id: str, query: dict) -> dict:
        record = self.store.get(response_id)
        limit = query.get("limit", "20")
        try:
            limit = int(limit)
        except (TypeError, ValueError):
            raise InvalidRequest("'limit' must be an integer.", param="limit") from None
        if not 1 <= limit <= 100:
            raise InvalidRequest("'limit' must be in [1, 100].", param="limit")
        order = check_enum(query.get("order", "desc"), "order", ("asc", "desc"))
        if query.get("include"):
            raise Unsupported("'include' must be empty.", param="include")
        return page_items(record.input_items, after=query.get("after") or None, limit=limit,
                          order=order)

    def delete(self, response_id: str) -> dict:
        self.store.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}
