"""Request timings in llama.cpp's shape, and prompt-progress observations.

`TimingClock` follows one request's events. Prompt time runs from admission (when the reused
prefix was fixed) to the first committed output token; generation time from that token to the
last one, so generation rates use max(predicted_n - 1, 0) intervals. Every rate is a finite
number: a zero count or a zero duration gives 0, never NaN or infinity.

Progress observations (`return_progress`) are cumulative and never move backwards: the first
has processed == cache, the last has processed == total and precedes the first output.
"""
from __future__ import annotations


def _rate(count: float, seconds: float) -> float:
    return count / seconds if count > 0 and seconds > 0 else 0.0


def _per_token_ms(milliseconds: float, count: float) -> float:
    return milliseconds / count if count > 0 and milliseconds > 0 else 0.0


def llama_timings(cache_n: int, prompt_n: int, prompt_s: float, predicted_n: int,
                  predicted_s: float) -> dict:
    intervals = max(predicted_n - 1, 0)
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_s * 1000.0,
        "prompt_per_token_ms": _per_token_ms(prompt_s * 1000.0, prompt_n),
        "prompt_per_second": _rate(prompt_n, prompt_s),
        "predicted_n": predicted_n,
        "predicted_ms": predicted_s * 1000.0,
        "predicted_per_token_ms": _per_token_ms(predicted_s * 1000.0, intervals),
        "predicted_per_second": _rate(intervals, predicted_s),
    }


class TimingClock:
    def __init__(self, prompt_tokens: int):
        self.prompt_tokens = prompt_tokens
        self.cache_n = 0
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.finished_at: float | None = None
        self.num_committed = 0
        self._processed = -1  # last reported prompt progress

    # -- events
    def admitted(self, event) -> dict | None:
        self.admitted_at = event.time
        self.cache_n = event.cache_n
        return self._progress(event.cache_n, event.time)

    def prompt_progress(self, event) -> dict | None:
        if self.admitted_at is None:
            self.admitted_at = event.time
        return self._progress(event.processed, event.time)

    def first_output(self, now: float) -> dict | None:
        """Before the first output: the closing progress observation if not yet reported."""
        if self.first_token_at is not None or self.admitted_at is None:
            return None
        return self._progress(self.prompt_tokens, now)

    def tokens(self, now: float, num_committed: int) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.num_committed = num_committed

    def finish(self, now: float, cache_n: int, completion_tokens: int) -> None:
        self.finished_at = now
        self.cache_n = cache_n
        self.num_committed = completion_tokens

    def _progress(self, processed: int, now: float) -> dict | None:
        processed = min(max(processed, self.cache_n), self.prompt_tokens)
        if processed <= self._processed:
            return None
        self._processed = processed
        elapsed = (now - self.admitted_at) if self.admitted_at is not None else 0.0
        return {"total": self.prompt_tokens, "cache": self.cache_n, "processed": processed,
                "time_ms": round(max(elapsed, 0.0) * 1000.0)}

    # -- views
    def timings(self) -> dict:
        """Cumulative timings so far (terminal ones once `finish` ran)."""
        start = self.admitted_at
        first = self.first_token_at
        if start is None:
            prompt_s = 0.0
        elif first is not None:
            prompt_s = first - start
        else:
            prompt_s = (self.finished_at or start) - start
        predicted_s = (self.last_token_at - first) if first is not None else 0.0
        return llama_timings(self.cache_n, max(self.prompt_tokens - self.cache_n, 0),
                             max(prompt_s, 0.0), self.num_committed, max(predicted_s, 0.0))
