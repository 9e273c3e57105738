"""FakeRunner: a deterministic StepRunner without JAX, for engine and server tests.

Its "KV cache" is an int array [P, S] holding the token id written at each page slot, so it
behaves like the real cache: a step writes its tokens through the page table and computes the
next token from the context it *reads back through the page table*. A wrong page table, a page
freed while still in use, or a replay that rebuilds the wrong tokens therefore changes the
output, exactly as it would with a model.

Default next token, checkable by hand: with context tokens t_0..t_p (position p is the token
being processed),
    greedy:   next = (sum_i (i + 1) * t_i) mod vocab_size
    sampled:  next = (greedy + 7919 * seed + 104729 * sample_index) mod vocab_size
so a seeded row depends only on its own context, seed and sample index, never on its batch.
Pass `next_token=` to script other behaviour (see `scripted`).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from ninfer_jax.engine.pages import DUMMY_PAGE
from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec

NextToken = Callable[[np.ndarray, SampleSpec], int]
EMPTY_SLOT = -1


def weighted_sum_next_token(vocab_size: int) -> NextToken:
    def next_token(context: np.ndarray, sample: SampleSpec) -> int:
        weights = np.arange(1, len(context) + 1, dtype=np.int64)
        greedy = int((weights * context).sum() % vocab_size)
        params = sample.params
        if params.is_greedy:
            return greedy
        return (greedy + 7919 * params.seed + 104729 * sample.sample_index) % vocab_size
    return next_token


def scripted(script: Sequence[int], end_token: int) -> NextToken:
    """Output `script` in order whatever the prompt, then `end_token` forever."""
    def next_token(context: np.ndarray, sample: SampleSpec) -> int:
        index = sample.sample_index
        return int(script[index]) if index < len(script) else end_token
    return next_token


class FakeRunner:
    def __init__(self, *, num_pages: int = 64, page_size: int = 4, max_batch: int = 8,
                 vocab_size: int = 1000, next_token: NextToken | None = None,
                 prefill_sleep: float = 0.0, decode_sleep: float = 0.0,
                 warmup_sleep: float = 0.0, warmup_gate=None, fail_at_step: int | None = None):
        self.page_size = page_size
        self.num_pages = num_pages
        self.max_batch = max_batch
        self.vocab_size = vocab_size
        self.next_token = next_token or weighted_sum_next_token(vocab_size)
        self.prefill_sleep = prefill_sleep  # seconds per prefill unit
        self.decode_sleep = decode_sleep  # seconds per decode step
        self.warmup_sleep = warmup_sleep
        self.warmup_gate = warmup_gate  # a threading.Event warm-up waits for (tests)
        self.fail_at_step = fail_at_step  # raise on this step (0-based) to test engine failure
        self.kv = np.full((num_pages, page_size), EMPTY_SLOT, np.int64)
        self.steps: list[tuple] = []  # ("prefill", seq_id, start, T) / ("decode", seq ids)
        self.is_warm = False

    def warmup(self) -> None:
        if self.warmup_gate is not None:
            self.warmup_gate.wait()
        time.sleep(self.warmup_sleep)
        self.is_warm = True

    def prefill(self, unit: PrefillUnit) -> int | None:
        self._step(("prefill", unit.seq_id, unit.start, len(unit.tokens)), self.prefill_sleep)
        for offset, token in enumerate(unit.tokens):
            self._write(unit.page_table, unit.start + offset, int(token))
        if unit.sample is None:
            return None
        end = unit.start + len(unit.tokens)
        return self.next_token(self._read(unit.page_table, end), unit.sample)

    def decode(self, rows: Sequence[DecodeRow]) -> np.ndarray:
        if not 1 <= len(rows) <= self.max_batch:
            raise ValueError(f"decode batch of {len(rows)} rows (max {self.max_batch})")
        self._step(("decode", tuple(r.seq_id for r in rows)), self.decode_sleep)
        out = np.empty(len(rows), np.int32)
        for i, row in enumerate(rows):
            self._write(row.page_table, row.position, row.token)
            out[i] = self.next_token(self._read(row.page_table, row.position + 1), row.sample)
        return out

    # ------------------------------------------------------------------ fake KV

    def _step(self, record: tuple, sleep: float) -> None:
        if self.fail_at_step is not None and len(self.steps) >= self.fail_at_step:
            raise RuntimeError("fake device failure")
        self.steps.append(record)
        if sleep:
            time.sleep(sleep)

    def _slot(self, page_table: np.ndarray, position: int) -> tuple[int, int]:
        index = position // self.page_size
        if index >= len(page_table):
            raise AssertionError(f"page table of {len(page_table)} pages misses position "
                                 f"{position}")
        page = int(page_table[index])
        if page == DUMMY_PAGE or not 0 < page < self.num_pages:
            raise AssertionError(f"real position {position} maps to page {page}")
        return page, position % self.page_size

    def _write(self, page_table: np.ndarray, position: int, token: int) -> None:
        page, slot = self._slot(page_table, position)
        self.kv[page, slot] = token

    def _read(self, page_table: np.ndarray, length: int) -> np.ndarray:
        context = np.array([self.kv[self._slot(page_table, p)] for p in range(length)])
        if (context == EMPTY_SLOT).any():
            raise AssertionError("a step read KV that was never written")
        return context
