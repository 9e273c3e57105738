"""Stop strings matched on generated text as it streams.

`StopMatcher` sees the decoded output piece by piece (pieces come from token boundaries, so a
stop string may span several of them). It releases text that can no longer be the start of a
stop string and holds back only the longest suffix that still could be. The first stop string
to complete (earliest end in the stream) wins; the text before it is released, the match and
everything after it are withheld. Offsets are absolute character positions in the stream, so
the caller can translate the match end into a committed token count.

Markers (`markers`: the reasoning and tool-call markers the output parser consumes) are atomic
for matching. serving.md applies stop strings to "reasoning and answer output", and a marker
is neither: it is one control token to the model (vLLM matches on detokenized text, where such
a token never splits). So a match whose start or end falls strictly inside a marker is not a
match: cutting there would hand the client a piece of markup ("<t" of "<think>") as text. A
match that holds a whole marker is still one, and text on either side of a marker matches as
before. A suffix that may still grow into a marker is held like a partial stop string, and a
match that reaches into it waits until the marker completes (the match is void) or cannot
(the match stands: its `end` then lies before the text that decided it).
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
    def __init__(self, stops: Sequence[str], markers: Sequence[str] = ()):
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._markers = tuple(m for m in markers if m)
        self._held = ""  # text not yet released: a possible stop-string or marker prefix
        self._released = 0  # characters released so far (absolute offset of _held)
        self.match: StopMatch | None = None

    def push(self, text: str) -> str:
        """Add generated text; return what is now safe to emit. After a match, returns ''."""
        if self.match is not None or not text:
            return ""
        if not self._stops:
            self._released += len(text)
            return text
        return self._scan(self._held + text, final=False)

    def flush(self) -> str:
        """The generation ended: a held partial marker is plain text, so a match waiting on it
        stands; otherwise release the held suffix."""
        if self.match is not None:
            return ""
        held, self._held = self._held, ""
        return self._scan(held, final=True) if held else ""

    def _scan(self, buffer: str, final: bool) -> str:
        spans = self._marker_spans(buffer)

        def cuts(pos: int) -> bool:
            return any(start < pos < end for start, end in spans)

        # Where a marker may still be completing: nothing from there on is decided yet.
        pending = len(buffer) if final else self._partial_start(buffer, self._markers, cuts)
        matches = [m for m in self._all_matches(buffer) if not (cuts(m[1]) or cuts(m[0]))]
        best = min(matches, default=None)
        if best is not None and best[0] <= pending:
            end, start, stop = best
            self.match = StopMatch(stop, self._released + start, self._released + end)
            self._held = ""
            self._released += start
            return buffer[:start]
        if final:
            keep_from = len(buffer)
        else:
            keep_from = min([pending, self._partial_start(buffer, self._stops, cuts)]
                            + [start for _, start, _ in matches])
        emit, self._held = buffer[:keep_from], buffer[keep_from:]
        self._released += len(emit)
        return emit

    def _marker_spans(self, buffer: str) -> list[tuple[int, int]]:
        spans = []
        for marker in self._markers:
            start = buffer.find(marker)
            while start >= 0:
                spans.append((start, start + len(marker)))
                start = buffer.find(marker, start + 1)
        return spans

    def _all_matches(self, buffer: str) -> list[tuple[int, int, str]]:
        """(end, start, stop) of every occurrence: the minimum is the earliest end, then the
        longest match."""
        found = []
        for stop in self._stops:
            start = buffer.find(stop)
            while start >= 0:
                found.append((start + len(stop), start, stop))
                start = buffer.find(stop, start + 1)
        return found

    @staticmethod
    def _partial_start(buffer: str, texts: Sequence[str], cuts) -> int:
        """Start of the longest suffix that is a proper prefix of one of `texts` and does not
        begin inside a complete marker (len(buffer) when there is none)."""
        start = len(buffer)
        for text in texts:
            for size in range(min(len(text) - 1, len(buffer)), len(buffer) - start, -1):
                if buffer.endswith(text[:size]) and not cuts(len(buffer) - size):
                    start = len(buffer) - size
                    break
        return start


def overlaps(stop: str, text: str, markers: Sequence[str] = (), earliest: int | None = None
             ) -> bool:
    """Whether `stop` could match (as StopMatcher matches) somewhere that overlaps `text` by
    at least one character, whatever text comes before and after it. `earliest` (a
    character offset in `text`) bars matches that start before it, for a piece that can
    only begin there; None lets the match start in the text before. A match that starts or
    ends strictly inside a marker of `text` is not one, as in StopMatcher."""
    spans = [(start, start + len(m)) for m in markers if m
             for start in _occurrences(text, m)]

    def cuts(pos: int) -> bool:
        return any(start < pos < end for start, end in spans)

    low = -(len(stop) - 1) if earliest is None else earliest
    for offset in range(low, len(text)):
        first, last = max(0, offset), min(len(text), offset + len(stop))
        if text[first:last] == stop[first - offset:last - offset] and not (
                cuts(offset) or cuts(offset + len(stop))):
            return True
    return False


def _occurrences(text: str, piece: str):
    start = text.find(piece)
    while start >= 0:
        yield start
        start = text.find(piece, start + 1)
