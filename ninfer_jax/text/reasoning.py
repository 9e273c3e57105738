"""Split generated text into reasoning and answer content at the thinking markers.

`ReasoningSplitter` is a streaming state machine over decoded text. A reply is in reasoning
from its start when the prompt opened the block (`starts_in_reasoning`, e.g. a template that
prefills "<think>\\n"), or when the reply itself begins with the open marker (leading
whitespace allowed). The close marker ends reasoning; everything after is content. Markers
never reach the output, nor does the whitespace that only frames them (after the open marker,
before and after the close marker). Only a suffix that may still become the close marker (or
the open marker at the very start) is held back.

Pieces are ("reasoning" | "content", text); a ("reasoning_end", "") piece marks the point
where the block closed so downstream parsers can react to it.
"""
from __future__ import annotations

import dataclasses

REASONING = "reasoning"
CONTENT = "content"
REASONING_END = "reasoning_end"

_START, _IN_REASONING, _IN_CONTENT = "start", "reasoning", "content"


@dataclasses.dataclass(frozen=True)
class Piece:
    kind: str  # REASONING, CONTENT or REASONING_END
    text: str = ""


def partial_suffix_length(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class ReasoningSplitter:
    def __init__(self, open_marker: str | None, close_marker: str | None, *,
                 starts_in_reasoning: bool = False):
        self._open = open_marker
        self._close = close_marker
        self._held = ""
        self._trim_leading = False  # drop whitespace at the start of a reasoning/content run
        if not close_marker:
            self._state = _IN_CONTENT
        elif starts_in_reasoning:
            self._state = _IN_REASONING
            self._trim_leading = True
        else:
            self._state = _START if open_marker else _IN_CONTENT

    @property
    def in_reasoning(self) -> bool:
        return self._state == _IN_REASONING

    def push(self, text: str) -> list[Piece]:
        pieces: list[Piece] = []
        buffer = self._held + text
        self._held = ""
        if self._state == _START:
            buffer = self._leave_start(buffer, pieces)
        if self._state == _IN_REASONING:
            buffer = self._reasoning(buffer, pieces)
        if self._state == _IN_CONTENT and buffer:
            self._emit(CONTENT, buffer, pieces)
        return pieces

    def finish(self) -> list[Piece]:
        """End of the reply: release whatever is held (an unfinished marker is plain text)."""
        pieces: list[Piece] = []
        held, self._held = self._held, ""
        if self._state == _START and held:
            pieces.append(Piece(CONTENT, held))
        elif self._state == _IN_REASONING:
            self._emit(REASONING, held.rstrip(), pieces)
        return pieces

    def _leave_start(self, buffer: str, pieces: list[Piece]) -> str:
        stripped = buffer.lstrip()
        if stripped.startswith(self._open):
            self._state = _IN_REASONING
            self._trim_leading = True
            return stripped[len(self._open):]
        if not stripped or self._open.startswith(stripped):
            self._held = buffer  # still possibly the open marker
            return ""
        self._state = _IN_CONTENT
        return buffer

    def _reasoning(self, buffer: str, pieces: list[Piece]) -> str:
        index = buffer.find(self._close)
        if index >= 0:
            self._emit(REASONING, buffer[:index].rstrip(), pieces)
            pieces.append(Piece(REASONING_END))
            self._state = _IN_CONTENT
            self._trim_leading = True
            return buffer[index + len(self._close):]
        # Hold a possible partial close marker and the whitespace right before it: if the
        # marker completes, that whitespace only framed it.
        keep = partial_suffix_length(buffer, self._close)
        cut = len(buffer) - keep
        while cut > 0 and buffer[cut - 1].isspace():
            cut -= 1
        self._held = buffer[cut:]
        self._emit(REASONING, buffer[:cut], pieces)
        return ""

    def _emit(self, kind: str, text: str, pieces: list[Piece]) -> None:
        if self._trim_leading:
            text = text.lstrip()
            if not text:
                return
            self._trim_leading = False
        if text:
            pieces.append(Piece(kind, text))
