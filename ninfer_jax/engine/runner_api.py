"""The seam between the scheduler (host bookkeeping) and the runner (the only caller of
jitted steps). The scheduler builds these plain values; the runner turns them into padded
int32/float32 arrays, runs one compiled step and returns sampled tokens as numpy.

Positions are absolute sequence positions. A page table lists the pages holding positions
[0, len) in order; the runner pads it with DUMMY_PAGE to its compiled width bucket.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

import numpy as np

from ninfer_jax.engine.request import SamplingParams


@dataclasses.dataclass(frozen=True)
class SampleSpec:
    """How to pick the next token for one row. `sample_index` = number of output tokens
    committed before this one: with `params.seed` it fixes the random stream per token, so a
    seeded request samples the same tokens whatever it is batched with."""

    params: SamplingParams
    sample_index: int
    output_ids: Sequence[int] = ()  # committed output so far (presence/frequency penalties)


@dataclasses.dataclass(frozen=True)
class PrefillUnit:
    """Compute KV for tokens at positions [start, start + len(tokens)) of one sequence.
    When `sample` is set, also sample the token that follows the last one."""

    seq_id: int
    tokens: np.ndarray  # int32 [T]
    start: int
    page_table: np.ndarray  # int32 [num pages covering start + T positions]
    sample: SampleSpec | None


@dataclasses.dataclass(frozen=True)
class DecodeRow:
    seq_id: int
    token: int  # the last committed token, whose KV is not yet in the cache
    position: int  # its position
    page_table: np.ndarray  # int32, covers position
    sample: SampleSpec


class StepRunner(Protocol):
    page_size: int
    num_pages: int  # pool size, DUMMY_PAGE included
    max_batch: int

    def warmup(self) -> None:
        """Compile every step shape bucket before the server reports healthy."""

    def prefill(self, unit: PrefillUnit) -> int | None:
        """Run one prefill chunk; return the sampled next token when unit.sample is set."""

    def decode(self, rows: Sequence[DecodeRow]) -> np.ndarray:
        """One decode step for len(rows) <= max_batch rows; returns int32 [len(rows)]."""
