"""Periodic throughput records (--log-stats-interval-ms): a pretty stderr line and, with
--request-log-jsonl, a `throughput` JSONL event per interval.

A daemon thread wakes every interval, takes the engine's published stats snapshot (never the
live state) and reports the deltas against the previous one: prompt tokens computed by
prefill (prefix-cache hits excluded), tokens committed by decode rounds (the first token of a
request, sampled by prefill, excluded), replayed tokens, pauses and restores, decode rounds
and their average batch size, step time; plus the scheduler gauges at the end of the
interval. Fully idle intervals (no deltas, nothing running, waiting or paused) are skipped.
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("ninfer_jax.serve.throughput")

DELTA_FIELDS = ("prompt_tokens", "cached_tokens", "prefill_tokens", "replayed_tokens",
                "generation_tokens", "decode_tokens", "preemptions", "replay_restores",
                "snapshot_restores",
                "prefill_units", "decode_rounds", "decode_rows", "prefill_seconds",
                "decode_seconds", "spec_rounds", "spec_draft_tokens", "spec_accepted_tokens",
                "spec_fallback_steps")
GAUGE_FIELDS = ("running", "prefilling", "decode_ready", "waiting", "paused", "replaying",
                "kv_pages_used", "kv_pages_capacity", "kv_pages_cached", "host_pages_used",
                "host_pages_capacity")


def throughput_record(before, after, interval_s: float) -> dict | None:
    """The interval's record, or None for a fully idle interval."""
    delta = {f: getattr(after, f) - getattr(before, f) for f in DELTA_FIELDS}
    finished = {k: v - before.requests.get(k, 0) for k, v in after.requests.items()}
    gauges = {f: getattr(after, f) for f in GAUGE_FIELDS}
    busy = any(delta.values()) or any(finished.values()) or any(
        gauges[f] for f in ("running", "waiting", "paused"))
    if not busy:
        return None
    rounds, rows = delta["decode_rounds"], delta["decode_rows"]
    step_seconds = delta["prefill_seconds"] + delta["decode_seconds"]
    return {
        "interval_seconds": interval_s,
        "tokens": {"prompt": delta["prompt_tokens"], "cached": delta["cached_tokens"],
                   "prefill": delta["prefill_tokens"], "decode": delta["decode_tokens"],
                   "generation": delta["generation_tokens"],
                   "replayed": delta["replayed_tokens"]},
        "scheduling": {"preemptions": delta["preemptions"],
                       "replay_restores": delta["replay_restores"],
                       "snapshot_restores": delta["snapshot_restores"],
                       "replayed_tokens": delta["replayed_tokens"]},
        "decode": {"rounds": rounds, "row_rounds": rows,
                   "average_size": rows / rounds if rounds else None},
        "prefill": {"units": delta["prefill_units"]},
        "speculative": _speculative(delta),
        "host_work": {"step_seconds": {"prefill": delta["prefill_seconds"],
                                       "decode": delta["decode_seconds"],
                                       "total": step_seconds},
                      "busy_fraction": step_seconds / interval_s if interval_s > 0 else None},
        "finished_requests": finished,
        "gauges": {**gauges, "materializing": 0, "capture_pending": 0, "terminal_pending": 0},
    }


def _speculative(delta: dict) -> dict:
    drafted, accepted = delta["spec_draft_tokens"], delta["spec_accepted_tokens"]
    return {"rounds": delta["spec_rounds"], "draft_tokens": drafted,
            "accepted_tokens": accepted, "fallback_steps": delta["spec_fallback_steps"],
            "acceptance": accepted / drafted if drafted else None}


def _rate(count: float, seconds: float) -> str:
    return f"{count / seconds:.1f}/s" if seconds > 0 else "-"


def pretty(record: dict) -> str:
    """One readable line: nonzero rates, composition, nonzero waiting states, batch, busy time."""
    seconds, tokens, gauges = record["interval_seconds"], record["tokens"], record["gauges"]
    parts = []
    for name in ("prefill", "decode", "replayed"):
        if tokens[name]:
            parts.append(f"{name} {tokens[name]} tok ({_rate(tokens[name], seconds)})")
    parts.append(f"running {gauges['running']} (prefill {gauges['prefilling']}, "
                 f"decode {gauges['decode_ready']})")
    for name in ("waiting", "paused", "replaying"):
        if gauges[name]:
            parts.append(f"{name} {gauges[name]}")
    average = record["decode"]["average_size"]
    if average is not None:
        parts.append(f"batch {average:.2f}")
    spec = record.get("speculative") or {}
    if spec.get("draft_tokens"):
        parts.append(f"spec accepted {spec['accepted_tokens']}/{spec['draft_tokens']} "
                     f"({100 * spec['acceptance']:.0f}%, "
                     f"{spec['accepted_tokens'] / spec['rounds']:.2f}/round)")
    work = record["host_work"]
    busy = work["busy_fraction"]
    parts.append(f"busy {work['step_seconds']['total']:.2f}s"
                 + (f" ({100 * busy:.0f}%)" if busy is not None else ""))
    return f"throughput {seconds:.1f}s: " + ", ".join(parts)


class ThroughputReporter:
    def __init__(self, engine, interval_s: float, writer=None):
        self.engine = engine
        self.interval_s = interval_s
        self.writer = writer
        self._stop = threading.Event()
        self._previous = None
        self._previous_at = 0.0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # Warm-up goes around the scheduler, so the counters are zero until real work.
        self._previous, self._previous_at = self.engine.stats(), time.monotonic()
        self._thread = threading.Thread(target=self._run, name="ninfer-throughput", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.report()
            except Exception:  # noqa: BLE001 - reporting must never stop
                log.exception("throughput report failed")

    def report(self) -> dict | None:
        """Compare with the previous snapshot, log and return the record (None when idle)."""
        stats, now = self.engine.stats(), time.monotonic()
        previous, previous_at = self._previous, self._previous_at
        self._previous, self._previous_at = stats, now
        if previous is None:
            return None
        record = throughput_record(previous, stats, now - previous_at)
        if record is None:
            return None
        log.info("%s", pretty(record))
        if self.writer is not None:
            self.writer.emit("throughput", record)
        return record
