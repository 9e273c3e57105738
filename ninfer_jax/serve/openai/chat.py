"""POST /v1/chat/completions: the OpenAI Chat Completions adapter.

Parse and validate (chat_request, chat_messages) -> Conversation + GenerationOptions ->
`generation.prepare_chat` -> engine -> `OutputAssembler` -> one aggregate body, or an SSE
stream: an assistant-role chunk, separate reasoning_content and content deltas, tool-call
deltas, a finish-reason chunk, an optional usage chunk (choices: []), then [DONE]. The
terminal `timings` object rides on the last JSON chunk. The stream opens only after
admission (generation.start), so overload and queue timeout are HTTP errors (429, 503). A
client that goes away (while queued, waiting for the aggregate, or mid-stream) cancels the
request.
"""
from __future__ import annotations

import time

import falcon

from ninfer_jax.errors import InvalidRequest
from ninfer_jax.serve.openai import chat_request as fields
from ninfer_jax.serve.openai.chat_messages import parse_messages, parse_tools
from ninfer_jax.serve.core.context import ServingContext
from ninfer_jax.serve.wire.disconnect import peer_of
from ninfer_jax.serve.core.generation import GenerationOptions, prepare_chat, start
from ninfer_jax.serve.wire.json_body import read_json_body
from ninfer_jax.serve.core.output import HEARTBEAT, GenerationResult, OutputAssembler
from ninfer_jax.serve.core.fields import (REASONING_EFFORTS, check_enum,
                                               merge_template_options, opt_bool, opt_int)
from ninfer_jax.serve.wire.sse import KEEPALIVE_SECONDS, openai_event_stream, start_sse
from ninfer_jax.text.conversation import Conversation, PromptOptions

_TEMPLATE_FIELDS = ("enable_thinking", "preserve_thinking", "reasoning_effort")


def _prompt_options(body: dict, messages) -> PromptOptions:
    opt_bool(body.get("enable_thinking"), "enable_thinking")
    opt_bool(body.get("preserve_thinking"), "preserve_thinking")
    if body.get("reasoning_effort") is not None:
        check_enum(body["reasoning_effort"], "reasoning_effort", REASONING_EFFORTS)
    merged = merge_template_options(
        body.get("chat_template_kwargs"), {name: body.get(name) for name in _TEMPLATE_FIELDS},
        typed_params={name: name for name in _TEMPLATE_FIELDS})
    continue_final = bool(opt_bool(body.get("continue_final_message"), "continue_final_message"))
    if continue_final and messages[-1].role != "assistant":
        raise InvalidRequest("'continue_final_message' needs a final assistant message.",
                             param="continue_final_message")
    add_generation_prompt = opt_bool(body.get("add_generation_prompt"), "add_generation_prompt")
    if continue_final and add_generation_prompt:
        raise InvalidRequest("'add_generation_prompt' and 'continue_final_message' cannot both "
                             "be true: the reply either opens a new turn or continues the "
                             "final one.", param="add_generation_prompt")
    return PromptOptions(
        add_generation_prompt=not continue_final if add_generation_prompt is None
        else add_generation_prompt,
        continue_final_message=continue_final, enable_thinking=merged.enable_thinking,
        preserve_thinking=merged.preserve_thinking, reasoning_effort=merged.template_effort,
        template_kwargs=merged.extra_kwargs)


def parse_chat(body: dict, ctx: ServingContext):
    """(Conversation, GenerationOptions, StreamOptions) of a validated request body."""
    fields.check_model(body, ctx.model_id)
    messages = parse_messages(body.get("messages"), vision=ctx.config.vision,
                              implicit_cache=fields.implicit_cache(body))
    tools = parse_tools(body.get("tools"))
    fields.check_chat_unsupported(body)
    options: GenerationOptions = fields.base_options(body, "chat", ctx.tokenizer.vocab_size)
    options.tool_choice = fields.tool_choice(body.get("tool_choice"))
    parallel = opt_bool(body.get("parallel_tool_calls"), "parallel_tool_calls")
    options.parallel_tool_calls = parallel is not False
    options.thinking_budget = opt_int(body.get("thinking_budget"), "thinking_budget", 1)
    conversation = Conversation(messages, tools, _prompt_options(body, messages))
    return conversation, options, fields.stream_options(body)


# ----------------------------------------------------------------------------- rendering


def usage_body(result: GenerationResult) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": result.reasoning_tokens},
    }


def tool_calls_body(result: GenerationResult, *, streaming: bool) -> list[dict]:
    calls = []
    for index, call in enumerate(result.tool_calls):
        name = f"{call.namespace}.{call.name}" if call.namespace else call.name
        body = {"id": call.id, "type": "function",
                "function": {"name": name, "arguments": call.arguments}}
        calls.append({"index": index, **body} if streaming else body)
    return calls


class ChatCompletionsResource:
    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        body = read_json_body(req, ctx.config.max_request_mib * 1024 * 1024)
        conversation, options, stream = parse_chat(body, ctx)
        request_id = req.context.request_id
        fields.warn_unknown(body, fields.CHAT_FIELDS, request_id)
        prepared = prepare_chat(ctx, conversation, options, request_id)
        started = start(ctx, prepared, peer_of(req))
        assembler = started.assembler
        envelope = {"id": f"chatcmpl-{request_id}", "created": int(time.time()),
                    "model": ctx.model_id, "system_fingerprint": None}
        if stream.stream:
            start_sse(resp, openai_event_stream(
                self._chunks(assembler, envelope, stream), assembler.release, request_id,
                assembler.response_failed))
            return
        with assembler.answering():
            resp.media = self._aggregate(assembler.run_to_end(), envelope)

    @staticmethod
    def _aggregate(result: GenerationResult, envelope: dict) -> dict:
        message = {"role": "assistant", "content": result.content or None,
                   "reasoning_content": result.reasoning or None, "refusal": None}
        if result.tool_calls:
            message["tool_calls"] = tool_calls_body(result, streaming=False)
        elif message["content"] is None:
            message["content"] = ""
        return {**envelope, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": result.finish_reason}],
                "usage": usage_body(result), "timings": result.timings}

    @staticmethod
    def _chunks(assembler: OutputAssembler, envelope: dict, stream):
        def chunk(delta: dict, finish_reason=None) -> dict:
            return {**envelope, "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish_reason}]}

        yield chunk({"role": "assistant", "content": ""})
        for item in assembler.stream(KEEPALIVE_SECONDS):
            if item is HEARTBEAT:
                yield item
            elif item.kind == "progress":
                if stream.return_progress:
                    yield {**envelope, "object": "chat.completion.chunk", "choices": [],
                           "prompt_progress": item.progress}
            else:
                key = "reasoning_content" if item.kind == "reasoning" else "content"
                out = chunk({key: item.text})
                if stream.timings_per_token:
                    out["timings"] = assembler.clock.timings()
                yield out
        if assembler.error is not None:
            raise assembler.error
        result = assembler.result()
        if result.tool_calls:
            yield chunk({"tool_calls": tool_calls_body(result, streaming=True)})
        final = chunk({}, result.finish_reason)
        if not stream.include_usage:
            yield {**final, "timings": result.timings}
            return
        yield final
        yield {**envelope, "object": "chat.completion.chunk", "choices": [],
               "usage": usage_body(result), "timings": result.timings}


def register(app: falcon.App, ctx: ServingContext) -> None:
    app.add_route("/v1/chat/completions", ChatCompletionsResource(ctx))
