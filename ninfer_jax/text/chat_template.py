"""Chat-template rendering: a Conversation -> prompt text and token ids.

Templates are Hugging Face-style Jinja run in an immutable sandbox with the helpers such
templates expect (order-keeping `tojson`, `raise_exception`, `strftime_now`, loop controls,
the `{% generation %}` block).

Client strings never become control tokens. Before rendering, every control-token spelling in
client data (message text, reasoning, tool calls, tool schemas, template kwargs) is replaced
by one private-use placeholder character, so the template can neither see nor emit the real
spelling for it. After rendering, the output is split into trusted template text (whose
control spellings become control tokens) and client text (the placeholders restored and
encoded as plain text). A conversation without quoted control spellings renders exactly as
the template would render it unmasked.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import re
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer_jax.errors import ContextLengthExceeded, InvalidRequest
from ninfer_jax.text.conversation import Conversation, Message, ToolCall, ToolSpec
from ninfer_jax.text.media_prompt import MediaLayout, Span, expand_pieces, media_spans
from ninfer_jax.text.tokenizer import Segment, Tokenizer

# Supplementary Private Use Area-A: placeholder characters for masked client spellings.
_PLACEHOLDER_FIRST, _PLACEHOLDER_LAST = 0xF0000, 0xFFFFD
_PLACEHOLDER_CLASS = "[\U000F0000-\U000FFFFD]"
# Variables the renderer owns; template kwargs may not replace them.
RESERVED_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token",
                                "eos_token", "pad_token", "unk_token", "raise_exception",
                                "strftime_now", "continue_final_message"})


@dataclasses.dataclass(frozen=True)
class RenderedPrompt:
    text: str
    ids: list[int]
    breakpoints: tuple[int, ...]  # token offsets at the end of messages marked cache_breakpoint
    starts_in_reasoning: bool  # the generation prompt leaves a reasoning block open
    # Per media part (prompt order): the (offset, length) runs of its placeholder tokens.
    media_spans: tuple[tuple[Span, ...], ...] = ()


class TemplateRaised(jinja2.TemplateError):
    """raise_exception() called by the template itself."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (used by HF training templates): renders the body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson sorts keys and HTML-escapes; chat templates need neither.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message):
    raise TemplateRaised(str(message))


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template; raises ValueError naming the line of a syntax error."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template line {exc.lineno}: {exc.message}") from None


class _Masker:
    """Replaces control spellings in client strings by placeholders and restores them."""

    def __init__(self, controls: list[str], template_source: str):
        alternatives = [re.escape(c) for c in sorted(controls, key=len, reverse=True)]
        self._pattern = re.compile("|".join([*alternatives, _PLACEHOLDER_CLASS]))
        self._taken = set(re.findall(_PLACEHOLDER_CLASS, template_source))
        self._next = _PLACEHOLDER_FIRST
        self.originals: dict[str, str] = {}  # placeholder -> client text it stands for
        self._by_text: dict[str, str] = {}

    def placeholder(self, original: str) -> str:
        if original not in self._by_text:
            char = self._allocate()
            self._by_text[original] = char
            self.originals[char] = original
        return self._by_text[original]

    def marker(self) -> str:
        """A fresh placeholder standing for nothing (marks a position in the output)."""
        char = self._allocate()
        self.originals[char] = ""
        return char

    def _allocate(self) -> str:
        while chr(self._next) in self._taken:
            self._next += 1
        if self._next > _PLACEHOLDER_LAST:
            raise InvalidRequest("too many distinct control-token spellings in the request",
                                 code="invalid_prompt")
        self._next += 1
        return chr(self._next - 1)

    def text(self, value: str) -> str:
        return self._pattern.sub(lambda m: self.placeholder(m.group()), value)

    def data(self, value: Any) -> Any:
        """Mask every string (and dict key) inside JSON-like data, keeping member order."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.data(k): self.data(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.data(v) for v in value]
        return value

    def segments(self, rendered: str) -> list[Segment]:
        """Split rendered text into trusted template text and restored client text."""
        if not self.originals:
            return [Segment(rendered, True)]
        pattern = re.compile("|".join(re.escape(c) for c in self.originals))
        segments, cursor = [], 0
        for match in pattern.finditer(rendered):
            segments.append(Segment(rendered[cursor:match.start()], True))
            segments.append(Segment(self.originals[match.group()], False))
            cursor = match.end()
        segments.append(Segment(rendered[cursor:], True))
        return [s for s in segments if s.text]


class ChatRenderer:
    """Renders Conversations with one compiled template; safe to share between threads."""

    def __init__(self, template: str, tokenizer: Tokenizer, chat_format: dict | None = None):
        self.source = template
        self.template = compile_template(template)
        self.tokenizer = tokenizer
        self.chat_format = chat_format or {}
        self._controls = list(tokenizer.control_tokens)
        reasoning = self.chat_format.get("reasoning") or {}
        self._reasoning_ids = {tokenizer.token_to_id(reasoning.get("open", "")): True,
                               tokenizer.token_to_id(reasoning.get("close", "")): False}
        self._reasoning_ids.pop(None, None)

    def render(self, conversation: Conversation, *, max_tokens: int | None = None,
               media: list[MediaLayout] | tuple = ()) -> RenderedPrompt:
        """The prompt's text and ids. With `max_tokens`, a rendered text too long to encode
        to that many tokens is refused (ContextLengthExceeded) before it is tokenized.
        `media`: the layout of each of the conversation's media parts (prompt order); their
        template placeholders are expanded to that many tokens (text/media_prompt.py)."""
        if len(media) != len(conversation.media):
            raise ValueError("one MediaLayout per media part of the conversation")
        masker = _Masker(self._controls, self.source)
        options = conversation.options
        messages = _template_messages(conversation.messages, masker)
        cut_marker = None
        if options.continue_final_message:
            cut_marker = self._mark_final_message(conversation.messages, messages, masker)
        variables = self._variables(conversation, masker, messages,
                                    add_generation_prompt=options.add_generation_prompt
                                    and not options.continue_final_message)
        rendered = self._run(variables)
        if cut_marker is not None:
            if rendered.count(cut_marker) != 1:
                raise InvalidRequest("the chat template does not render the final assistant "
                                     "message, so it cannot be continued", code="invalid_prompt")
            rendered = rendered[:rendered.index(cut_marker)]
        num_media = sum(layout.num_tokens for layout in media)
        if max_tokens is not None and not self.tokenizer.may_fit(len(rendered),
                                                                 max_tokens - num_media):
            at_least = len(rendered) // self.tokenizer.max_chars_per_token + num_media
            raise ContextLengthExceeded(at_least, max_tokens, param="messages", message=(
                f"The prompt has {len(rendered)} characters and {num_media} media tokens, "
                f"at least {at_least} tokens, more than the server's context ceiling of "
                f"{max_tokens} tokens."))
        return self._tokenize(masker.segments(rendered), conversation.messages, list(media))

    # ------------------------------------------------------------------ pieces

    @staticmethod
    def _mark_final_message(originals: list[Message], messages: list[dict],
                            masker: _Masker) -> str:
        if not originals or originals[-1].role != "assistant":
            raise InvalidRequest("continuing the final message needs an assistant message last",
                                 code="invalid_prompt")
        marker = masker.marker()
        messages[-1]["content"] = messages[-1]["content"] + marker
        return marker

    def _variables(self, conversation: Conversation, masker: _Masker, messages: list[dict],
                   *, add_generation_prompt: bool) -> dict[str, Any]:
        options = conversation.options
        variables: dict[str, Any] = {}
        for key, value in options.template_kwargs.items():
            if key in RESERVED_VARIABLES:
                raise InvalidRequest(f"chat_template_kwargs may not set {key!r}",
                                     param=f"chat_template_kwargs.{key}")
            variables[masker.data(key)] = masker.data(value)
        for key in ("enable_thinking", "preserve_thinking", "reasoning_effort"):
            if getattr(options, key) is not None:
                variables[key] = getattr(options, key)
        tokenizer = self.tokenizer
        variables.update(
            messages=messages,
            tools=[_template_tool(tool, masker) for tool in conversation.tools] or None,
            add_generation_prompt=add_generation_prompt,
            bos_token=_spelling(tokenizer, tokenizer.bos_id),
            eos_token=_spelling(tokenizer, tokenizer.eos_ids[0] if tokenizer.eos_ids else None))
        return variables

    def _run(self, variables: dict[str, Any]) -> str:
        try:
            return self.template.render(**variables)
        except TemplateRaised as exc:
            raise InvalidRequest(f"chat template: {exc}", code="invalid_prompt") from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError,
                AttributeError, ZeroDivisionError, OverflowError) as exc:
            raise InvalidRequest(f"the chat template failed on this request "
                                 f"({type(exc).__name__}: {exc})", code="invalid_prompt") from None

    def _tokenize(self, segments: list[Segment], messages: list[Message],
                  media: list[MediaLayout]) -> RenderedPrompt:
        pieces = self.tokenizer.split_segments(segments)
        controls = self.tokenizer.control_tokens
        if media:
            pieces = expand_pieces(pieces, media, controls)
        piece_ids = self.tokenizer.encode_pieces(pieces)
        text = "".join(piece_text for piece_text, _ in pieces)
        ids = [token_id for group in piece_ids for token_id in group]
        return RenderedPrompt(text=text, ids=ids,
                              breakpoints=_breakpoints(text, pieces, piece_ids, messages),
                              starts_in_reasoning=self._ends_in_reasoning(ids),
                              media_spans=media_spans(ids, media, controls) if media else ())

    def _ends_in_reasoning(self, ids: list[int]) -> bool:
        # Only template-made markers are single control ids; client text never produces one.
        for token_id in reversed(ids):
            if token_id in self._reasoning_ids:
                return self._reasoning_ids[token_id]
        return False


def _spelling(tokenizer: Tokenizer, token_id: int | None) -> str:
    return (tokenizer.id_to_token(token_id) or "") if token_id is not None else ""


def _template_messages(messages: list[Message], masker: _Masker) -> list[dict]:
    """Our Message dataclasses as the dicts Hugging Face templates read."""
    call_names = {call.id: _call_name(call) for m in messages for call in m.tool_calls}
    result = []
    for message in messages:
        entry: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                                 "content": _template_content(message, masker)}
        if message.reasoning is not None:
            entry["reasoning_content"] = masker.text(message.reasoning)
        if message.tool_calls:
            entry["tool_calls"] = [_template_call(call, masker) for call in message.tool_calls]
        if message.role == "tool":
            entry["tool_call_id"] = masker.text(message.tool_call_id or "")
            if message.tool_call_id in call_names:
                entry["name"] = masker.text(call_names[message.tool_call_id])
        if message.is_error:
            entry["is_error"] = True
        result.append(entry)
    return result


def _template_content(message: Message, masker: _Masker) -> str | list[dict]:
    """A string, or for a message with media the part list Qwen VL templates iterate
    ({"type": "text", "text"} and {"type": "image" | "video"} in content order)."""
    if not message.media:
        return masker.text(message.content)
    parts, cursor = [], 0
    for media in message.media:
        if media.offset > cursor:
            parts.append({"type": "text", "text": masker.text(message.content[cursor:media.offset])})
        parts.append({"type": media.kind})
        cursor = media.offset
    if cursor < len(message.content):
        parts.append({"type": "text", "text": masker.text(message.content[cursor:])})
    return parts


def _call_name(call: ToolCall) -> str:
    return f"{call.namespace}.{call.name}" if call.namespace else call.name


def _template_call(call: ToolCall, masker: _Masker) -> dict:
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError:
        arguments = call.arguments  # templates print a non-object argument text as it is
    return {"id": masker.text(call.id), "type": "function",
            "function": {"name": masker.text(_call_name(call)),
                         "arguments": masker.data(arguments)}}


def _template_tool(tool: ToolSpec, masker: _Masker) -> dict:
    function: dict[str, Any] = {"name": tool.qualified_name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    return {"type": "function", "function": masker.data(function)}


def _breakpoints(text: str, pieces, piece_ids, messages: list[Message]) -> tuple[int, ...]:
    """Token offsets at the end of each cache_breakpoint message's content.

    Contents are located in order in the rendered text. When a content end falls inside an
    encoded piece, the offset moves back to that piece's start: every reported offset is a
    true prefix boundary of the ids.
    """
    piece_ends, token_ends, chars, tokens = [], [], 0, 0
    for (piece_text, _), ids in zip(pieces, piece_ids):
        piece_ends.append((chars, chars + len(piece_text), tokens))
        chars += len(piece_text)
        tokens += len(ids)
        token_ends.append(tokens)
    found, cursor = [], 0
    for message in messages:
        position = text.find(message.content, cursor) if message.content else -1
        if position < 0:
            continue
        cursor = position + len(message.content)
        if message.cache_breakpoint:
            found.append(_token_offset(cursor, piece_ends, token_ends))
    return tuple(sorted(set(found)))


def _token_offset(char_offset: int, piece_ends, token_ends) -> int:
    for (start, end, tokens_before), tokens_after in zip(piece_ends, token_ends):
        if char_offset < end or char_offset == start:
            return tokens_before
        if char_offset == end:
            return tokens_after
    return token_ends[-1] if token_ends else 0
