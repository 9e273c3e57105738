"""One internal conversation model for every wire dialect.

Each adapter (OpenAI Chat, Responses, Anthropic) lowers its request into a `Conversation`;
the chat-template renderer (text/chat_template.py) turns a Conversation into prompt text and
token ids. Nothing here knows about JSON wire shapes.

JSON-valued fields (tool parameter schemas, tool-call arguments) keep the client's member
order: schemas are dicts built with object_pairs_hook order preserved, arguments are the JSON
text exactly as received or generated.
"""
from __future__ import annotations

import dataclasses
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
MEDIA_KINDS = ("image", "video")


@dataclasses.dataclass(frozen=True)
class MediaPart:
    """One image or video of a message, as every dialect lowers it: where it sits in the
    message's text and where its bytes come from. serve/media acquires and prepares it."""

    kind: str  # one of MEDIA_KINDS
    url: str  # a data: URI or an http(s) URL, as the client sent it
    param: str  # the wire field that carried it (errors name it)
    offset: int  # character offset in Message.content before which it appears


@dataclasses.dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON object text, member order preserved
    namespace: str | None = None


@dataclasses.dataclass
class ToolSpec:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON schema, member order preserved
    namespace: str | None = None

    @property
    def qualified_name(self) -> str:
        """The name the model sees and writes (namespace and function joined)."""
        return f"{self.namespace}.{self.name}" if self.namespace else self.name


@dataclasses.dataclass
class Message:
    role: str  # one of ROLES
    content: str = ""  # text parts concatenated without separators
    reasoning: str | None = None  # assistant reasoning (thinking) text
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    tool_call_id: str | None = None  # role "tool": which call this result answers
    is_error: bool = False  # tool result marked as an error (Anthropic is_error)
    # Token offsets are unknown until rendering; a cache breakpoint asks the renderer to
    # report the prompt position at the end of this message's content.
    cache_breakpoint: bool = False
    # Images and videos in content order; each sits at `offset` in `content`.
    media: list[MediaPart] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PromptOptions:
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # assistant prefill: no end-of-turn after the last msg
    enable_thinking: bool | None = None  # None: the template's default
    preserve_thinking: bool | None = None
    reasoning_effort: str | None = None
    template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Conversation:
    messages: list[Message]
    tools: list[ToolSpec] = dataclasses.field(default_factory=list)
    options: PromptOptions = dataclasses.field(default_factory=PromptOptions)

    @property
    def media(self) -> list[MediaPart]:
        """Every media part in prompt order (messages in order, parts in content order)."""
        return [part for message in self.messages for part in message.media]
