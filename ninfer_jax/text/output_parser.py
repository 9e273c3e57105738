"""Dialect-neutral parsing of a reply's text: reasoning, answer content and tool calls.

`OutputParser` chains the reasoning splitter and two tool-call region streams (one over the
answer, one over the reasoning for a call written before the block closes when the reply
ends inside it). Text goes in as it is decoded (stop strings already removed); pieces of
reasoning and content come out as soon as they are unambiguous; tool calls are known at
`finish()`. Nothing here knows about JSON wire shapes or tokens.
"""
from __future__ import annotations

from ninfer_jax.text.reasoning import CONTENT, REASONING, REASONING_END, Piece, ReasoningSplitter
from ninfer_jax.text.tool_parsers import ParsedCall
from ninfer_jax.text.tool_stream import ToolCallStream, ToolParseReport


class OutputParser:
    def __init__(self, *, reasoning_markers: tuple[str, str] | None = None,
                 starts_in_reasoning: bool = False, tool_format=None,
                 max_calls: int | None = None):
        open_marker, close_marker = reasoning_markers or (None, None)
        self._splitter = ReasoningSplitter(open_marker, close_marker,
                                           starts_in_reasoning=starts_in_reasoning)
        self._content_tools = ToolCallStream(tool_format, CONTENT) if tool_format else None
        self._reasoning_tools = (ToolCallStream(tool_format, REASONING, rearm=True)
                                 if tool_format and close_marker else None)
        self._max_calls = max_calls
        self.calls: list[ParsedCall] = []
        self.report = ToolParseReport()

    @property
    def in_reasoning(self) -> bool:
        return self._splitter.in_reasoning

    def push(self, text: str) -> list[Piece]:
        return self._route(self._splitter.push(text))

    def finish(self) -> list[Piece]:
        ended_in_reasoning = self._splitter.in_reasoning
        pieces = self._route(self._splitter.finish())
        reasoning_calls: list[ParsedCall] = []
        if self._reasoning_tools and ended_in_reasoning:
            released, reasoning_calls = self._reasoning_tools.finish()
            pieces += released
        content_calls: list[ParsedCall] = []
        if self._content_tools:
            released, content_calls = self._content_tools.finish()
            pieces += released
            self.report = self._content_tools.report
        if reasoning_calls and not content_calls:
            self.report = self._reasoning_tools.report
            content_calls = reasoning_calls
        self.calls = content_calls[: self._max_calls] if self._max_calls else content_calls
        return [p for p in pieces if p.kind != REASONING_END]

    def _route(self, pieces: list[Piece]) -> list[Piece]:
        out: list[Piece] = []
        for piece in pieces:
            if piece.kind == REASONING and self._reasoning_tools:
                out += self._reasoning_tools.push(piece.text)
            elif piece.kind == REASONING_END and self._reasoning_tools:
                out += self._reasoning_tools.close_block()
            elif piece.kind == CONTENT and self._content_tools:
                out += self._content_tools.push(piece.text)
            elif piece.kind != REASONING_END:
                out.append(piece)
        return out
