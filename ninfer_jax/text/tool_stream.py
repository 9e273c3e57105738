"""Streaming detection of the tool-call region in generated text.

A reply's tool-call region starts at the first `<tool_call>` opener and must consist only of
complete calls separated by whitespace up to the end of the reply. Text before the opener is
released as it arrives, holding back only an ambiguous suffix (a partial opener and the
whitespace before it, which belongs to the region if a call follows). The region itself is
held: it becomes structured calls when the reply ends with every call valid; otherwise the
whole region, byte for byte, is released as ordinary text with the first fallback reason.
Invalid structure or trailing text is detected as early as possible so the stream resumes.

In reasoning (`rearm=True`) a region is also abandoned when the thinking block closes (a call
only mentioned while thinking stays reasoning), and detection starts again after a fallback.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.text.reasoning import Piece, partial_suffix_length
from ninfer_jax.text.tool_parsers import (COMPLETE, INCOMPLETE, TRAILING_CONTENT, ParsedCall,
                                          skip_ws)


@dataclasses.dataclass
class ToolParseReport:
    """Counters for the request log: no argument values, no generated text."""

    marker_seen: bool = False
    num_calls: int = 0
    omitted_empty: int = 0
    schema_mismatches: int = 0
    fallback_reason: str = "none"


class ToolCallStream:
    def __init__(self, fmt, kind: str, *, rearm: bool = False):
        self._format = fmt
        self._kind = kind
        self._rearm = rearm
        self._held = ""  # ambiguous text suffix (before any region)
        self._lead_ws = ""  # whitespace right before the region's opener
        self._region: str | None = None
        self._disabled = False
        self.report = ToolParseReport()

    def push(self, text: str) -> list[Piece]:
        if self._disabled:
            return self._text(text)
        if self._region is None:
            return self._scan_text(self._held + text)
        self._region += text
        return self._scan_region(final=False)[0]

    def close_block(self) -> list[Piece]:
        """The enclosing reasoning block closed: a held region was only mentioned."""
        pieces = self._release_region(reason=None)
        pieces += self._text(self._held)
        self._held = ""
        self._disabled = True
        return pieces

    def finish(self) -> tuple[list[Piece], list[ParsedCall]]:
        if self._region is None:
            held, self._held = self._held, ""
            return self._text(held), []
        return self._scan_region(final=True)

    def _scan_text(self, buffer: str) -> list[Piece]:
        opener = self._format.opener
        index = buffer.find(opener)
        if index < 0:
            cut = len(buffer) - partial_suffix_length(buffer, opener)
            while cut > 0 and buffer[cut - 1].isspace():
                cut -= 1
            self._held = buffer[cut:]
            return self._text(buffer[:cut])
        before = buffer[:index]
        kept = before.rstrip()
        self._held = ""
        self._lead_ws = before[len(kept):]
        self._region = buffer[index:]
        self.report.marker_seen = True
        return self._text(kept) + self._scan_region(final=False)[0]

    def _scan_region(self, final: bool) -> tuple[list[Piece], list[ParsedCall]]:
        region, opener = self._region, self._format.opener
        calls: list[ParsedCall] = []
        pos = 0
        while True:
            scan = self._format.scan_call(region, pos, final)
            if scan.status == INCOMPLETE:
                return [], []
            if scan.status != COMPLETE:
                return self._release_region(scan.reason), []
            calls.extend(scan.calls)
            pos = skip_ws(region, scan.end)
            rest = region[pos:]
            if rest.startswith(opener):
                continue
            if not final and opener.startswith(rest):
                return [], []  # more calls may follow (or the reply ends here)
            if rest:
                return self._release_region(TRAILING_CONTENT), []
            self._region = None
            self._record(calls)
            return [], calls

    def _record(self, calls: list[ParsedCall]) -> None:
        self.report.num_calls = len(calls)
        self.report.omitted_empty = sum(c.omitted_empty for c in calls)
        self.report.schema_mismatches = sum(c.schema_mismatches for c in calls)

    def _release_region(self, reason: str | None) -> list[Piece]:
        if self._region is None:
            return []
        if reason and self.report.fallback_reason == "none":
            self.report.fallback_reason = reason
        text = self._lead_ws + self._region
        self._region, self._lead_ws = None, ""
        if not self._rearm:
            self._disabled = True
        return self._text(text)

    def _text(self, text: str) -> list[Piece]:
        return [Piece(self._kind, text)] if text else []
