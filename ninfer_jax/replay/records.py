"""Reading the two JSONL files replay works from.

A capture file (`--capture-requests`) holds `request_capture` lines: request id, endpoint and
JSON body. A request log (`--request-log-jsonl`) holds, per request id, a `request_start`
(resolved sampling: greedy flag, seed and where the seed came from) and one terminal record
(`request_done` with `result.generated_token_ids`, or `request_error`), or a
`request_rejected`. Ids repeat across server restarts only by accident (they are random), so
one log file may hold several runs and is still indexed by id.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib


class ReplayInputError(ValueError):
    """A capture or log file that cannot be used (names the file and the line)."""


@dataclasses.dataclass(frozen=True)
class Capture:
    request_id: str
    endpoint: str
    body: dict
    line: int


def _json_lines(path: str):
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ReplayInputError(f"{path}: {exc.strerror}") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            # A server killed mid-write may leave a torn last line; anything else is an error.
            if number == len(text.splitlines()):
                continue
            raise ReplayInputError(f"{path}:{number}: not a JSON line") from None
        if isinstance(record, dict):
            yield number, record


def load_captures(path: str) -> list[Capture]:
    captures = []
    for number, record in _json_lines(path):
        if record.get("event") != "request_capture":
            continue
        body, endpoint = record.get("body"), record.get("endpoint")
        if not isinstance(body, dict) or not isinstance(endpoint, str):
            raise ReplayInputError(f"{path}:{number}: a capture needs 'endpoint' and 'body'")
        captures.append(Capture(str(record.get("request_id")), endpoint, body, number))
    if not captures:
        raise ReplayInputError(f"{path}: no request_capture lines")
    return captures


@dataclasses.dataclass
class LoggedRequest:
    start: dict | None = None
    done: dict | None = None
    error: dict | None = None
    rejected: dict | None = None

    @property
    def token_ids(self) -> list[int] | None:
        return None if self.done is None else self.done["result"]["generated_token_ids"]

    @property
    def is_deterministic(self) -> bool:
        """Greedy, or sampled with a seed that a rerun gets again (request or --seed)."""
        if self.start is None:
            return False
        sampling = self.start["sampling"]
        return bool(sampling.get("greedy")) or sampling.get("seed_source") in ("request",
                                                                              "server")

    @property
    def is_settled(self) -> bool:
        return any(r is not None for r in (self.done, self.error, self.rejected))


_SLOTS = {"request_start": "start", "request_done": "done", "request_error": "error",
          "request_rejected": "rejected"}


def load_log(path: str) -> dict[str, LoggedRequest]:
    """request id -> its records (the last run wins if an id repeats)."""
    index: dict[str, LoggedRequest] = {}
    for _, record in _json_lines(path):
        slot = _SLOTS.get(record.get("event"))
        if slot is None or "request_id" not in record:
            continue
        setattr(index.setdefault(str(record["request_id"]), LoggedRequest()), slot, record)
    return index
