"""Per-request verdicts: the replay's generated_token_ids against the earlier run's.

The earlier run decides what can be expected. When it was deterministic (greedy, or a seed a
rerun gets again: the request's own or the server's --seed), any difference is a `mismatch`,
whatever caused it (a changed sampling field, a changed engine). When it drew a random seed
the outputs are `not_comparable`. The other verdicts say which side lacks a result:
`missing_previous` (no request_done for the captured id in the compare log), `failed` (the
replay got no outcome: HTTP error or request_error), `identical`. A request the earlier run
rejected must be rejected again with the same status and code (`identical`), else `mismatch`.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.replay.records import LoggedRequest
from ninfer_jax.replay.sender import Sent

IDENTICAL, MISMATCH = "identical", "mismatch"
NOT_COMPARABLE, MISSING_PREVIOUS, FAILED = "not_comparable", "missing_previous", "failed"
VERDICTS = (IDENTICAL, MISMATCH, NOT_COMPARABLE, MISSING_PREVIOUS, FAILED)
# Sampling fields whose change makes a rerun differ on purpose (reported with a mismatch).
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                  "frequency_penalty", "seed")


@dataclasses.dataclass
class Verdict:
    capture_id: str
    replay_id: str | None
    endpoint: str
    verdict: str
    num_previous: int | None = None
    num_replayed: int | None = None
    first_difference: int | None = None  # index of the first differing token
    changed_sampling: list[str] = dataclasses.field(default_factory=list)
    detail: str | None = None


def first_difference(a: list[int], b: list[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def changed_sampling(previous: LoggedRequest, replayed: LoggedRequest) -> list[str]:
    if previous.start is None or replayed.start is None:
        return []
    old, new = previous.start["sampling"], replayed.start["sampling"]
    keys = [k for k in _SAMPLING_KEYS if k != "seed" or old.get("seed_source") != "random"]
    return [k for k in keys if old.get(k) != new.get(k)]


def _rejection(logged: LoggedRequest | None) -> tuple | None:
    if logged is None or logged.rejected is None:
        return None
    error = logged.rejected["error"]
    return error["status"], error["code"]


def judge(sent: Sent, previous: LoggedRequest | None, replayed: LoggedRequest | None) -> Verdict:
    verdict = Verdict(sent.capture.request_id, sent.request_id, sent.capture.endpoint, FAILED)
    rejection = _rejection(previous)
    if rejection is not None:  # rejected before: expected again, with the same status and code
        again = _rejection(replayed)
        verdict.verdict = IDENTICAL if again == rejection else MISMATCH
        verdict.detail = f"earlier rejected {rejection}, replay {again or sent.status}"
        return verdict
    if replayed is None or replayed.token_ids is None:
        reason = sent.error or (replayed.error["error"]["code"] if replayed and replayed.error
                                else None)
        verdict.detail = reason or "no request_done for the replayed request"
        return verdict
    verdict.num_replayed = len(replayed.token_ids)
    if previous is None or previous.token_ids is None:
        verdict.verdict = MISSING_PREVIOUS
        return verdict
    verdict.num_previous = len(previous.token_ids)
    verdict.changed_sampling = changed_sampling(previous, replayed)
    verdict.first_difference = first_difference(previous.token_ids, replayed.token_ids)
    if verdict.first_difference is None:
        verdict.verdict = IDENTICAL
    elif previous.is_deterministic:
        verdict.verdict = MISMATCH
    else:
        verdict.verdict = NOT_COMPARABLE
        verdict.detail = "the earlier run sampled with a random seed"
    return verdict


def compare_all(sent: list[Sent], previous: dict[str, LoggedRequest],
                replayed: dict[str, LoggedRequest]) -> list[Verdict]:
    return [judge(s, previous.get(s.capture.request_id),
                  replayed.get(s.request_id) if s.request_id else None) for s in sent]
