"""POST /v1/completions: raw text (or token ids) continued without a chat template.

`prompt` is a string, a list of token ids, or a one-element list holding either. Control-token
spellings in a raw prompt are read as control tokens (the client writes the raw prompt,
template markup included). No reasoning split and no tool parsing: the reply is plain text.
Same sampling, limit, stop and streaming fields as Chat; `echo` prepends the prompt text.
Like Chat, the stream opens only after admission (generation.start).
"""
from __future__ import annotations

import time

import falcon

from ninfer_jax.errors import ContextLengthExceeded, InvalidRequest
from ninfer_jax.serve.openai import chat_request as fields
from ninfer_jax.serve.core.context import ServingContext
from ninfer_jax.serve.wire.disconnect import peer_of
from ninfer_jax.serve.core.generation import prepare_raw, start
from ninfer_jax.serve.wire.json_body import read_json_body
from ninfer_jax.serve.core.output import HEARTBEAT, GenerationResult, OutputAssembler
from ninfer_jax.serve.openai.chat import usage_body
from ninfer_jax.serve.core.fields import integral, opt_bool, opt_int
from ninfer_jax.serve.wire.sse import KEEPALIVE_SECONDS, openai_event_stream, start_sse


def _is_token_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        integral(t) is not None for t in value)


def prompt_ids(value, ctx: ServingContext) -> tuple[list[int], str]:
    """(token ids, prompt text for echo) of the `prompt` field."""
    if isinstance(value, list) and len(value) == 1 and (
            isinstance(value[0], str) or _is_token_list(value[0])):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("'prompt' must not be empty.", param="prompt")
        if not ctx.tokenizer.may_fit(len(value), ctx.max_context):
            at_least = len(value) // ctx.tokenizer.max_chars_per_token
            raise ContextLengthExceeded(at_least, ctx.max_context, param="prompt", message=(
                f"The prompt has {len(value)} characters, at least {at_least} tokens, more "
                f"than the server's context ceiling of {ctx.max_context} tokens."))
        ids = ctx.tokenizer.encode(value, special=True)
        if getattr(ctx.tokenizer, "add_bos", False) and ctx.tokenizer.bos_id is not None:
            ids = [ctx.tokenizer.bos_id] + ids
        return ids, value
    if _is_token_list(value):
        value = [integral(t) for t in value]
        vocab = ctx.tokenizer.vocab_size
        bad = next((t for t in value if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequest(f"'prompt' holds token id {bad}, outside the vocabulary "
                                 f"(0..{vocab - 1}).", param="prompt")
        return value, ctx.tokenizer.decode(value)
    if isinstance(value, list) and len(value) > 1 and all(
            isinstance(item, str) or _is_token_list(item) for item in value):
        raise fields.unsupported("prompt", "one prompt per request (batch prompts are not "
                                 "supported)")
    raise InvalidRequest("'prompt' must be a non-empty string or a list of token ids.",
                         param="prompt")


def _check_unsupported(body: dict) -> None:
    fields.check_common_unsupported(body)
    if opt_int(body.get("logprobs"), "logprobs", 0, 5) not in (None, 0):
        raise fields.unsupported("logprobs", "log probabilities are not computed")
    if body.get("suffix") not in (None, ""):
        raise fields.unsupported("suffix", "fill-in-the-middle is not supported")
    if opt_int(body.get("best_of"), "best_of", 1) not in (None, 1):
        raise fields.unsupported("best_of", "only one candidate is generated")


class CompletionsResource:
    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        body = read_json_body(req, ctx.config.max_request_mib * 1024 * 1024)
        fields.check_model(body, ctx.model_id)
        ids, prompt_text = prompt_ids(body.get("prompt"), ctx)
        _check_unsupported(body)
        options = fields.base_options(body, protocol="completions",
                                     vocab_size=ctx.tokenizer.vocab_size)
        stream = fields.stream_options(body)
        echo = bool(opt_bool(body.get("echo"), "echo"))
        request_id = req.context.request_id
        fields.warn_unknown(body, fields.COMPLETIONS_FIELDS, request_id)
        prepared = prepare_raw(ctx, ids, options, request_id)
        started = start(ctx, prepared, peer_of(req))
        assembler = started.assembler
        envelope = {"id": f"cmpl-{request_id}", "object": "text_completion",
                    "created": int(time.time()), "model": ctx.model_id,
                    "system_fingerprint": None}
        prefix = prompt_text if echo else ""
        if stream.stream:
            start_sse(resp, openai_event_stream(
                self._chunks(assembler, envelope, stream, prefix), assembler.release, request_id,
                assembler.response_failed))
            return
        with assembler.answering():
            result = assembler.run_to_end()
            resp.media = {**envelope, "choices": [self._choice(prefix + result.content,
                                                               result.finish_reason)],
                          "usage": usage_body(result), "timings": result.timings}

    @staticmethod
    def _choice(text: str, finish_reason: str | None) -> dict:
        return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}

    def _chunks(self, assembler: OutputAssembler, envelope: dict, stream, prefix: str):
        if prefix:
            yield {**envelope, "choices": [self._choice(prefix, None)]}
        for item in assembler.stream(KEEPALIVE_SECONDS):
            if item is HEARTBEAT:
                yield item
            elif item.kind == "progress":
                if stream.return_progress:
                    yield {**envelope, "choices": [], "prompt_progress": item.progress}
            else:
                out = {**envelope, "choices": [self._choice(item.text, None)]}
                if stream.timings_per_token:
                    out["timings"] = assembler.clock.timings()
                yield out
        if assembler.error is not None:
            raise assembler.error
        result: GenerationResult = assembler.result()
        final = {**envelope, "choices": [self._choice("", result.finish_reason)]}
        if not stream.include_usage:
            yield {**final, "timings": result.timings}
            return
        yield final
        yield {**envelope, "choices": [], "usage": usage_body(result), "timings": result.timings}


def register(app: falcon.App, ctx: ServingContext) -> None:
    app.add_route("/v1/completions", CompletionsResource(ctx))
