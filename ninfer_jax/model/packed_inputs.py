"""One step's small inputs packed into two host arrays, and unpacked inside the step.

A ragged step takes a RaggedBatch (8 int arrays) and a SamplingBatch (7 arrays). Passed as
numpy arrays, each is its own host-to-device transfer at every launch; on the H200 those
transfers and their bookkeeping were most of the host's launch cost. The runner instead
writes every integer into one int32 buffer and every float into one float32 buffer, and the
compiled step slices them back apart at static offsets (`PackedLayout`). The penalty bias
is not sent: the step computes it from the device-resident output counts of each row's
penalty lane (model/sampling.py `penalty_bias`).

int32 buffer, in order (R = 1 + B sampled rows: the chunk's, then each row token's; with K
chunk segments R = K + B, and chunk_start, chunk_len, chunk_table carry K of each):
    chunk_tokens [C], chunk_start [1], chunk_len [1], chunk_table [W],
    row_tokens [B], row_src [B], row_positions [B], row_tables [B * W],
    chunk_state_slot [1], row_state_slots [B]   (hybrid families only: `state_slots`)
    chunk_next [1]                               (with the MTP head only: `mtp_drafts`)
    top_k [R], seed_high [R], seed_low [R] (uint32 bit patterns), sample_index [R],
    is_greedy [R] (0/1), penalty_lane [R]
float32 buffer: temperature [R], top_p [R], min_p [R], presence [R], frequency [R]
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.model.ragged_batch import RaggedBatch, out_slots
from ninfer_jax.model.sampling import SamplingBatch, penalty_bias


@dataclasses.dataclass(frozen=True)
class PackedLayout:
    """The static shape of a packed step: chunk tokens C, row tokens B, table width W, and
    whether the step carries state slots (hybrid families; dense layouts are unchanged) and
    whether its rows may chain (RaggedBatch.chained_rows: speculation on a hybrid family)."""

    chunk: int
    rows: int
    width: int
    state_slots: bool = False
    chained_rows: bool = False
    mtp_drafts: int = 0  # K drafts of the MTP head after each sampled row (0: no head)
    # K drafts of a DFlash / DFlash2 drafter after each sampled row, and its config (static)
    dflash_drafts: int = 0
    dflash: Any = None  # model/dflash.DFlashConfig
    # The chunk region as this many segments of chunk / segments tokens, one sequence each
    # (model/ragged_batch.py); 1: one chunk, the fields without the segment axis
    segments: int = 1
    # The runner's most chunks per step: where the rows' samples start in `out` (steps.py)
    chunk_slots: int = 1

    def __post_init__(self):
        if self.segments > 1 and (self.chunk % self.segments or self.state_slots
                                  or self.num_drafts or self.segments > self.chunk_slots):
            raise ValueError(f"{self.segments} chunk segments do not fit this layout")

    @property
    def num_drafts(self) -> int:
        return self.mtp_drafts or self.dflash_drafts

    @property
    def sampled(self) -> int:
        return (self.segments if self.chunk else 1) + self.rows

    def out_slots(self) -> np.ndarray:
        """Where the R sampled rows land in the step's output (ragged_batch.out_slots)."""
        return out_slots(self.sampled - self.rows, self.rows, self.chunk_slots)

    def int_fields(self) -> list[tuple[str, int]]:
        C, B, W, R, K = self.chunk, self.rows, self.width, self.sampled, self.segments
        slots = [("chunk_state_slot", 1), ("row_state_slots", B)] if self.state_slots else []
        if self.mtp_drafts:
            slots.append(("chunk_next", 1))
        return [("chunk_tokens", C), ("chunk_start", K), ("chunk_len", K), ("chunk_table", K * W),
                ("row_tokens", B), ("row_src", B), ("row_positions", B),
                ("row_tables", B * W), *slots, ("top_k", R), ("seed_high", R), ("seed_low", R),
                ("sample_index", R), ("is_greedy", R), ("penalty_lane", R)]

    @property
    def num_ints(self) -> int:
        return sum(size for _, size in self.int_fields())

    @property
    def num_floats(self) -> int:
        return 5 * self.sampled

    def offsets(self) -> dict[str, tuple[int, int]]:
        """field -> (start, size) in the int32 buffer."""
        spans, start = {}, 0
        for name, size in self.int_fields():
            spans[name] = (start, size)
            start += size
        return spans


def unpack(layout: PackedLayout, ints, floats, counts):
    """Inside the step: the RaggedBatch and SamplingBatch the packed buffers hold, the
    penalties' bias read from `counts` (int32 [lanes + 1, V]), and each sampled row's
    penalty lane (int32 [R]): (batch, sampling, lanes)."""
    spans = layout.offsets()

    def field(name):
        start, size = spans[name]
        return jax.lax.slice_in_dim(ints, start, start + size)

    B, W, R = layout.rows, layout.width, layout.sampled
    if layout.segments > 1:  # the fields keep their segment axis
        chunk = dict(chunk_start=field("chunk_start"), chunk_len=field("chunk_len"),
                     chunk_table=field("chunk_table").reshape(layout.segments, W))
    else:
        chunk = dict(chunk_start=field("chunk_start")[0], chunk_len=field("chunk_len")[0],
                     chunk_table=field("chunk_table"))
    batch = RaggedBatch(
        chunk_tokens=field("chunk_tokens"), **chunk,
        row_tokens=field("row_tokens"), row_src=field("row_src"),
        row_positions=field("row_positions"), row_tables=field("row_tables").reshape(B, W))
    if layout.state_slots:
        batch = dataclasses.replace(batch, chunk_state_slot=field("chunk_state_slot")[0],
                                    row_state_slots=field("row_state_slots"),
                                    chained_rows=layout.chained_rows)
    if layout.mtp_drafts:
        batch = dataclasses.replace(batch, chunk_next=field("chunk_next")[0])
    words = jnp.stack([field("seed_high"), field("seed_low")], axis=1)
    lanes = field("penalty_lane")
    bias = penalty_bias(counts[lanes], floats[3 * R:4 * R], floats[4 * R:])
    sampling = SamplingBatch(
        temperature=floats[:R], top_k=field("top_k"), top_p=floats[R:2 * R],
        min_p=floats[2 * R:3 * R],
        seed_words=jax.lax.bitcast_convert_type(words, jnp.uint32),
        sample_index=field("sample_index"), is_greedy=field("is_greedy") != 0,
        logit_bias=bias)
    return batch, sampling, lanes


class HostPacker:
    """Builds the packed buffers of one step on the host (the runner's side).

    Per-request sampling values are computed once per SamplingParams and cached, since a
    request's params object is the same every step."""

    def __init__(self):
        self._params: dict = {}

    def pack(self, layout: PackedLayout, batch: dict, specs) -> tuple[np.ndarray, np.ndarray]:
        """`batch`: RaggedBatch fields as numpy arrays; `specs`: R SampleSpecs or None
        (padding rows sample greedily)."""
        spans = layout.offsets()
        ints = np.zeros(layout.num_ints, np.int32)
        floats = np.zeros(layout.num_floats, np.float32)
        for name, value in batch.items():
            start, size = spans[name]
            ints[start:start + size] = np.ravel(value)
        R = layout.sampled
        # per row: temperature, top_p, min_p, presence, frequency, top_k, seed high,
        # seed low, greedy
        padding = (1.0, 1.0, 0.0, 0.0, 0.0, 20, 0, 0, 1)
        values = np.full((R, 9), padding, np.float64)
        index, lanes = np.zeros(R, np.int32), np.zeros(R, np.int32)
        if specs:  # one conversion of a list, not a numpy row assignment per row
            values[:len(specs)] = [padding if s is None else self._values(s.params)
                                   for s in specs]
            index[:len(specs)] = [0 if s is None else s.sample_index for s in specs]
            lanes[:len(specs)] = [0 if s is None else s.penalty_lane for s in specs]
        floats[:] = values[:, :5].T.reshape(-1)
        for column, name in ((5, "top_k"), (6, "seed_high"), (7, "seed_low"), (8, "is_greedy")):
            start, _ = spans[name]
            ints[start:start + R] = values[:, column].astype(np.uint32).view(np.int32)
        for name, column in (("sample_index", index), ("penalty_lane", lanes)):
            start, _ = spans[name]
            ints[start:start + R] = column
        return ints, floats

    def _values(self, params) -> tuple:
        # Keyed by identity (the entry holds the object, so its id is not reused while
        # cached): hashing and comparing a SamplingParams' fields cost more, row by row.
        entry = self._params.get(id(params))
        if entry is not None and entry[0] is params:
            return entry[1]
        from ninfer_jax.model.limits import TOP_K_CAP
        from ninfer_jax.model.sampling import seed_words

        high, low = seed_words(params.seed)
        top_k = TOP_K_CAP if params.top_k <= 0 else min(params.top_k, TOP_K_CAP)
        cached = (max(params.temperature, 0.0), params.top_p, params.min_p,
                  params.presence_penalty, params.frequency_penalty, top_k, high, low,
                  1 if params.is_greedy else 0)
        if len(self._params) > 4096:
            self._params.clear()
        self._params[id(params)] = (params, cached)
        return cached
