"""Stop strings matched on generated text as it streams.

`StopMatcher` sees the decoded output piece by piece (pieces come from token boundaries, so a
stop string may span several of them). It releases text that can no longer be the start of a
stop string and holds back only the longest suffix that still could be. The first stop string
to complete (earliest end in the stream) wins; the text before it is released, the match and
everything after it are withheld. Offsets are absolute character positions in the stream, so
the caller can translate the match end into a committed token count.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class StopMatch:
    stop: str
    start: int  # absolute character offset of the match in the generated text
    end: int  # one past its last character


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._held = ""  # text not yet released: a possible stop-string prefix
        self._released = 0  # characters released so far (absolute offset of _held)
        self.match: StopMatch | None = None

    def push(self, text: str) -> str:
        """Add generated text; return what is now safe to emit. After a match, returns ''."""
        if self.match is not None or not text:
            return ""
        if not self._stops:
            self._released += len(text)
            return text
        buffer = self._held + text
        found = self._first_completed(buffer)
        if found is not None:
            stop, start = found
            self.match = StopMatch(stop, self._released + start, self._released + start + len(stop))
            self._held = ""
            self._released += start
            return buffer[:start]
        keep = self._ambiguous_suffix_length(buffer)
        emit = buffer[: len(buffer) - keep]
        self._held = buffer[len(buffer) - keep:]
        self._released += len(emit)
        return emit

    def flush(self) -> str:
        """The generation ended without a match: release the held suffix."""
        if self.match is not None:
            return ""
        held, self._held = self._held, ""
        self._released += len(held)
        return held

    def _first_completed(self, buffer: str) -> tuple[str, int] | None:
        best = None  # (end, start, stop): earliest end first, then the longest match
        for stop in self._stops:
            start = buffer.find(stop)
            if start >= 0:
                key = (start + len(stop), start, stop)
                if best is None or key < best:
                    best = key
        return None if best is None else (best[2], best[1])

    def _ambiguous_suffix_length(self, buffer: str) -> int:
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest
