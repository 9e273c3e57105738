"""From a validated request to a submitted engine request: shared by every wire dialect.

`prepare_chat(ctx, conversation, options, request_id)` renders the conversation with the
artifact's chat template (tools filtered by tool_choice, thinking defaults from the server
flags), resolves sampling (model defaults < process flags < request fields, --greedy last),
the output budget (explicit, else the remaining context capped by --default-max-tokens) and
the token policies (thinking budget, forced tool call), carries the request's priority
(background or foreground) to the engine, and describes how the output must be parsed
(`OutputPlan`). `prepare_raw` does the same for a raw completion prompt. `start`
hands the request to the engine and waits for its admission, which every dialect does before
it writes a byte: overload (raised by submit), a queue timeout and a client that left while
queued (raised while waiting) are all plain HTTP outcomes, never events inside a stream.
"""
from __future__ import annotations

import dataclasses
import time
import weakref

from ninfer_jax.engine.request import (Admitted, GenerationRequest, MediaInput,
                                       RequestHandle, SamplingParams)
from ninfer_jax.errors import ContextLengthExceeded, InvalidRequest, Unsupported
from ninfer_jax.serve.observability import request_trace
from ninfer_jax.serve.core import sampling as sampling_mod
from ninfer_jax.serve.core.context import ServingContext
from ninfer_jax.serve.core.fields import vision_disabled
from ninfer_jax.serve.wire.disconnect import NO_PEER, PeerWatch
from ninfer_jax.serve.core.output import OutputAssembler
from ninfer_jax.engine.policies import (EARLY_CLOSE_GUIDANCE, BlankToken, ForcedToolCall,
                                       PlainEncode, PolicyChain, ThinkingBudget)
from ninfer_jax.text.conversation import Conversation, ToolSpec
from ninfer_jax.serve.core.tools import (ForcedText, ToolChoice, check_stops_spare_forced_call,
                                         check_tool_format, effective_tools)
from ninfer_jax.text.tool_parsers import tool_format


@dataclasses.dataclass
class GenerationOptions:
    """Dialect-neutral, already validated request options."""

    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"
    prompt_param: str = "messages"  # the field a too-long prompt error names
    sampling: dict = dataclasses.field(default_factory=dict)  # SAMPLING_FIELDS -> value|None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_param: str = "stop"  # the field `stop` came from (Anthropic: stop_sequences)
    stop_token_ids: tuple[int, ...] = ()  # vLLM's field (Chat and Completions), validated
    ignore_eos: bool = False
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    thinking_budget: int | None = None  # None: --default-thinking-budget
    thinking_budget_param: str = "thinking_budget"
    protocol: str = "chat"
    session_key: str | None = None
    # prompt_cache_options.mode implicit (True): the engine writes every full page; explicit
    # (False): only up to the request's cache breakpoints.
    implicit_cache: bool = True
    background: bool = False  # the request's `priority` (responses/request.py)
    draft: bool = True  # the request's `draft` (responses/request.py)
    stream: bool = False  # recorded in the request log only


@dataclasses.dataclass
class OutputPlan:
    """How the HTTP thread must turn the engine's tokens into a reply."""

    stop_strings: tuple[str, ...] = ()
    hidden_token_ids: frozenset[int] = frozenset()  # stop tokens: counted, never shown
    reasoning_markers: tuple[str, str] | None = None
    starts_in_reasoning: bool = False
    tool_format: object | None = None  # text.tool_parsers format, None: no tool parsing
    tools: tuple[ToolSpec, ...] = ()
    max_calls: int | None = None


@dataclasses.dataclass
class PreparedGeneration:
    request: GenerationRequest
    plan: OutputPlan
    prompt_text: str | None
    thinking: bool  # the reply starts in thinking mode
    thinking_budget: int | None
    policies: tuple = ()
    trace: object | None = None  # serve.request_trace.RequestTrace (the request log's view)
    # serve/media/intake.MediaBatch: the leases that keep this request's media payloads
    # live; released at the request's end (release_media, or when this object goes away).
    media: object | None = None

    def release_media(self) -> None:
        if self.media is not None:
            self.media.release()


def render_chat(ctx: ServingContext, conversation: Conversation):
    """The prompt exactly as generation renders it; token counting calls this, so a count
    never drifts from what a generation submits."""
    check_tool_format(ctx.tool_call_format, conversation.tools)
    rendered, media = _render(ctx, _with_server_defaults(ctx, conversation, conversation.tools),
                              deadline=time.monotonic() + ctx.config.pending_timeout_ms / 1000.0)
    if media is not None:
        media.release()
    return rendered


def _with_server_defaults(ctx: ServingContext, conversation: Conversation,
                          tools: list[ToolSpec]) -> Conversation:
    options = dataclasses.replace(conversation.options)
    if options.enable_thinking is None and ctx.config.no_thinking:
        options.enable_thinking = False
    if options.preserve_thinking is None and ctx.config.preserve_thinking:
        options.preserve_thinking = True
    return Conversation(conversation.messages, tools, options)


def _render(ctx: ServingContext, conversation: Conversation, deadline: float | None = None):
    """(RenderedPrompt, MediaBatch | None): media parts are acquired and prepared first
    (serve/media), so their placeholders expand to their real token counts; `deadline`
    bounds the wait for the preparation gate (the request's admission deadline)."""
    parts = conversation.media
    if not parts:
        return ctx.renderer.render(conversation, max_tokens=ctx.max_context), None
    if ctx.media is None:
        raise vision_disabled(parts[0].param)
    batch = ctx.media.prepare(parts, deadline)
    try:
        rendered = ctx.renderer.render(conversation, max_tokens=ctx.max_context,
                                       media=[item.layout() for item in batch.items])
    except BaseException:
        batch.release()
        raise
    return rendered, batch


def _media_inputs(batch, rendered) -> tuple[MediaInput, ...]:
    if batch is None:
        return ()
    return tuple(MediaInput(item.kind, item.digest, item.grid_thw, spans, item.pixel_values)
                 for item, spans in zip(batch.items, rendered.media_spans))


def _resolve_max_tokens(ctx: ServingContext, num_prompt: int, options: GenerationOptions,
                        prompt_param: str = "messages") -> int:
    limit = ctx.max_context
    if num_prompt > limit:
        raise ContextLengthExceeded(num_prompt, limit, param=prompt_param, message=(
            f"The prompt has {num_prompt} tokens, more than the server's context ceiling of "
            f"{limit} tokens. Shorten the conversation."))
    if options.max_tokens is not None:
        if num_prompt + options.max_tokens > limit:
            raise ContextLengthExceeded(
                num_prompt + options.max_tokens, limit, param=options.max_tokens_param,
                message=(f"The prompt has {num_prompt} tokens and {options.max_tokens_param} "
                         f"asks for {options.max_tokens} more, but the context ceiling is "
                         f"{limit} tokens; ask for at most {limit - num_prompt}."))
        return options.max_tokens
    remaining = limit - num_prompt
    if remaining <= 0:
        raise ContextLengthExceeded(num_prompt + 1, limit, param=prompt_param, message=(
            f"The prompt fills the whole context ({num_prompt} of {limit} tokens); no room "
            "is left for a reply."))
    return min(ctx.config.default_max_tokens, remaining)


def stop_token_ids(ctx: ServingContext, options: GenerationOptions) -> frozenset[int]:
    """The tokens that end this request, counted in usage but never shown: the model's end
    tokens unless ignore_eos (then they are plain text), and the client's stop_token_ids
    always (ignore_eos keeps user stops active, as it does stop strings)."""
    ends = frozenset() if options.ignore_eos else ctx.eos_ids
    return ends | frozenset(options.stop_token_ids)


def _single_token(ctx: ServingContext, text: str) -> int | None:
    ids = ctx.tokenizer.encode(text, special=True)
    return ids[0] if len(ids) == 1 else None


def _open_marker(ctx: ServingContext, text: str) -> tuple[int | None, int]:
    """(head id, tail length) of the reasoning open marker as the model writes it: one token,
    or a control token and plain text after it (Gemma 4's `<|channel>thought`), which client
    text can never produce. (None, 0) when the model cannot be seen opening a block."""
    ids = ctx.tokenizer.encode(text, special=True)
    if len(ids) == 1 or (ids and ctx.tokenizer.is_control(ids[0])):
        return ids[0], len(ids) - 1
    return None, 0


def _thinking_budget(ctx, options, thinking, starts_in_reasoning, max_tokens):
    budget = options.thinking_budget
    if budget is None:
        budget = ctx.config.default_thinking_budget
    if budget is None or not thinking:
        return None
    open_marker, close_marker = ctx.reasoning_markers
    close_id = _single_token(ctx, close_marker)
    if close_id is None:
        raise Unsupported("This model's thinking close marker is not a single token, so a "
                          "thinking budget cannot be applied.", param=options.thinking_budget_param)
    suffix = ctx.tokenizer.encode(EARLY_CLOSE_GUIDANCE + close_marker + "\n\n", special=True)
    first_cap = budget + (0 if starts_in_reasoning else 1)
    if first_cap < max_tokens < first_cap + len(suffix) + 1:
        raise InvalidRequest(
            f"The output budget ({max_tokens} tokens) reaches past the thinking budget "
            f"({budget}) but cannot hold the {len(suffix)}-token close suffix plus one answer "
            "token; raise the output budget or lower the thinking budget.",
            param=options.max_tokens_param, code="thinking_budget_capacity_insufficient")
    open_id, open_tail = _open_marker(ctx, open_marker)
    return ThinkingBudget(budget=budget, open_id=open_id, open_tail=open_tail,
                          close_id=close_id, suffix_ids=suffix,
                          starts_in_reasoning=starts_in_reasoning, max_tokens=max_tokens,
                          stop_ids=stop_token_ids(ctx, options),
                          is_blank=BlankToken(ctx.tokenizer))


def _forced_call(ctx, options, tools, fmt, thinking, starts_in_reasoning):
    choice = options.tool_choice
    if choice.mode != "required":
        return None
    # effective_tools left at least one tool and check_tool_format a format: fmt is set.
    markers = ctx.reasoning_markers or (None, None)
    tokenizer = ctx.tokenizer
    prefix_ids = tokenizer.encode(fmt.call_prefix, special=True)
    forced = ForcedText(fmt.call_prefix, tuple(prefix_ids),
                        tuple(t.qualified_name + fmt.name_terminator for t in tools),
                        tuple(m for m in (*markers, fmt.opener, fmt.closer) if m))
    check_stops_spare_forced_call(forced, options.stop, options.stop_param,
                                  options.stop_token_ids, lambda t: tokenizer.decode([t]))
    return ForcedToolCall(
        decode=tokenizer.decode, encode=PlainEncode(tokenizer),
        prefix_ids=prefix_ids,
        names=[t.qualified_name for t in tools], terminator=fmt.name_terminator,
        open_id=_open_marker(ctx, markers[0])[0] if markers[0] else None,
        close_id=_single_token(ctx, markers[1]) if markers[1] else None,
        starts_in_reasoning=starts_in_reasoning, may_open_thinking=thinking)


def prepare_chat(ctx: ServingContext, conversation: Conversation, options: GenerationOptions,
                 request_id: str, arrival: float | None = None) -> PreparedGeneration:
    # The request log's trace starts here: a failure below is a request_rejected.
    with request_trace.begin(ctx, request_id, options, conversation).rejecting("render") as trace:
        return trace.attach(_prepare_chat(ctx, conversation, options, request_id, arrival))


def _prepare_chat(ctx, conversation, options, request_id, arrival) -> PreparedGeneration:
    arrival = time.monotonic() if arrival is None else arrival
    tools = effective_tools(conversation.tools, options.tool_choice)
    check_tool_format(ctx.tool_call_format, tools)
    conversation = _with_server_defaults(ctx, conversation, tools)
    rendered, media = _render(ctx, conversation,
                              deadline=arrival + ctx.config.pending_timeout_ms / 1000.0)
    try:
        prepared = _prepared_chat(ctx, conversation, options, request_id, arrival, tools,
                                  rendered, media)
    except BaseException:
        if media is not None:
            media.release()
        raise
    if media is not None:
        prepared.media = media
        weakref.finalize(prepared, media.release)
    return prepared


def _prepared_chat(ctx, conversation, options, request_id, arrival, tools, rendered,
                   media) -> PreparedGeneration:
    markers = ctx.reasoning_markers
    enable = conversation.options.enable_thinking
    thinking = markers is not None and (
        rendered.starts_in_reasoning or (ctx.thinking_default if enable is None else enable))
    max_tokens = _resolve_max_tokens(ctx, len(rendered.ids), options,
                                    prompt_param=options.prompt_param)
    fmt_name = ctx.tool_call_format
    fmt = tool_format(fmt_name, tools) if (tools and fmt_name) else None
    policies = [p for p in (
        _thinking_budget(ctx, options, thinking, rendered.starts_in_reasoning, max_tokens),
        _forced_call(ctx, options, tools, fmt, thinking, rendered.starts_in_reasoning),
    ) if p is not None]
    plan = OutputPlan(
        stop_strings=options.stop,
        hidden_token_ids=stop_token_ids(ctx, options),
        reasoning_markers=markers, starts_in_reasoning=rendered.starts_in_reasoning,
        tool_format=fmt, tools=tuple(tools),
        max_calls=None if options.parallel_tool_calls else 1)
    request = _request(ctx, request_id, list(rendered.ids), options, max_tokens, thinking,
                       policies, arrival, tuple(getattr(rendered, "breakpoints", ()) or ()))
    request.media = _media_inputs(media, rendered)
    budget = next((p.budget for p in policies if isinstance(p, ThinkingBudget)), None)
    return PreparedGeneration(request, plan, rendered.text, thinking, budget, tuple(policies))


def prepare_raw(ctx: ServingContext, prompt_ids: list[int], options: GenerationOptions,
                request_id: str, arrival: float | None = None) -> PreparedGeneration:
    """A completion prompt: no template, no reasoning split, no tool parsing."""
    with request_trace.begin(ctx, request_id, options).rejecting("render") as trace:
        return trace.attach(_prepare_raw(ctx, prompt_ids, options, request_id, arrival))


def _prepare_raw(ctx, prompt_ids, options, request_id, arrival) -> PreparedGeneration:
    arrival = time.monotonic() if arrival is None else arrival
    if not prompt_ids:
        raise InvalidRequest("'prompt' must not be empty.", param="prompt")
    max_tokens = _resolve_max_tokens(ctx, len(prompt_ids), options, prompt_param="prompt")
    plan = OutputPlan(stop_strings=options.stop, hidden_token_ids=stop_token_ids(ctx, options))
    request = _request(ctx, request_id, list(prompt_ids), options, max_tokens, False, [],
                       arrival, ())
    return PreparedGeneration(request, plan, None, False, None)


def _request(ctx, request_id, prompt_ids, options, max_tokens, thinking, policies, arrival,
             breakpoints) -> GenerationRequest:
    defaults = sampling_mod.model_defaults(ctx.model_name, ctx.architecture, thinking)
    params: SamplingParams = sampling_mod.resolve_sampling(
        defaults, ctx.config.sampling, options.sampling, options.seed)
    token_policy = None
    if len(policies) == 1:
        token_policy = policies[0]
    elif policies:
        token_policy = PolicyChain(policies)
    return GenerationRequest(
        request_id=request_id, prompt_ids=prompt_ids, sampling=params, max_tokens=max_tokens,
        stop_token_ids=stop_token_ids(ctx, options), ignore_eos=options.ignore_eos,
        token_policy=token_policy,
        cache_breakpoints=breakpoints, cache_implicit=options.implicit_cache,
        session_key=options.session_key, arrival_time=arrival,
        deadline=arrival + ctx.config.pending_timeout_ms / 1000.0,
        background=options.background, speculative=options.draft,
        labels={"protocol": options.protocol})


@dataclasses.dataclass
class Started:
    """A submitted request that the engine has admitted (or already ended)."""

    handle: RequestHandle
    assembler: OutputAssembler
    admitted: Admitted | None  # None: finished before admission (nothing to generate)


def start(ctx: ServingContext, prepared: PreparedGeneration,
          peer: PeerWatch = NO_PEER) -> Started:
    """Submit, then wait for admission while watching the client (`peer`). Raises
    Overloaded, QueueTimeout, EngineUnavailable or disconnect.ClientGone; on any failure
    the request is cancelled, so nothing keeps running for a reply no one will read."""
    handle = submit(ctx, prepared)
    assembler = OutputAssembler(handle, prepared, ctx.new_detokenizer(), peer)
    try:
        admitted = assembler.wait_admitted()
    except BaseException:
        handle.cancel()
        raise
    return Started(handle, assembler, admitted)


def submit(ctx: ServingContext, prepared: PreparedGeneration) -> RequestHandle:
    """Overload or a request the engine can never run is still a request_rejected."""
    trace = prepared.trace or request_trace.NULL_TRACE
    with trace.rejecting("submit"):
        try:
            handle = ctx.engine.submit(prepared.request)
        except BaseException:
            prepared.release_media()
            raise
    ctx.in_flight.add(handle)
    trace.started(handle)
    return handle
