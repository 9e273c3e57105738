"""The metadata of one ragged step and the per-token arrays every model family derives from it.

A ragged step runs two regions of tokens through one forward, concatenated as C + B rows:
  chunk region  C tokens of one sequence's prefill chunk (C static, possibly 0; the last
                C - chunk_len are padding), or of K sequences' chunks ("segments", the
                chunk fields then carry a leading axis of K: segment k holds tokens
                k*C/K .. (k+1)*C/K - 1, its padding last), so several prompts prefill in
                one step (dense families: `segmented`);
  row region    B single tokens, each with its own position and page table: decode rows,
                the K+1 tokens of a speculative verify row, and padding rows.
Padding (chunk tokens past chunk_len, rows with an all-DUMMY_PAGE table at position 0) writes
its K/V to the dummy page only. A row token may come from the previous step's device output
(`row_src` >= 0), so the host can launch a step before it has read the last one's samples.
Shape letters: C chunk tokens, B row tokens, W page-table width, S page size, H hidden.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.kernels.paged_attention import DUMMY_PAGE
from ninfer_jax.model.token_automaton import TOKEN_MASK

FROM_HOST = -1  # row_src value: the row's token is row_tokens[i], not a previous output
DUMMY_STATE_SLOT = 0  # the state slot of padding rows (hybrid families)


@dataclasses.dataclass(frozen=True)
class RaggedBatch:
    """Inputs of one ragged step (a pytree of arrays; every shape is part of the compile)."""

    chunk_tokens: jax.Array  # int32 [C]: the chunk's token ids (C may be 0: no chunk region)
    chunk_start: jax.Array  # int32 [] (segments: [K]): position of chunk_tokens[0]
    # int32 [] (segments: [K]): real chunk tokens (>= 1 when C > 0), padding after them
    chunk_len: jax.Array
    # int32 [W] (segments: [K, W]): the chunk's sequence page table, DUMMY_PAGE-padded; a
    # padding segment has an all-DUMMY_PAGE table, start 0 and length 1
    chunk_table: jax.Array
    row_tokens: jax.Array  # int32 [B]: host token ids of the row region
    row_src: jax.Array  # int32 [B]: FROM_HOST, or j >= 0: the token is prev_out[j]
    row_positions: jax.Array  # int32 [B]: absolute position of each row token
    row_tables: jax.Array  # int32 [B, W]: each row token's sequence page table
    # Hybrid families only (None for dense ones): the state slot (engine/state_slots) holding
    # each sequence's Gated DeltaNet conv and recurrent state. Slot 0 is the dummy slot that
    # padding reads and writes, like DUMMY_PAGE. A chunk with chunk_start == 0 starts from a
    # zero state; any other chunk continues from its slot's state.
    chunk_state_slot: jax.Array | None = None  # int32 []
    row_state_slots: jax.Array | None = None  # int32 [B]
    # Static. Speculative verify on hybrid families: a row on the same (real) state slot as
    # the row before it is that sequence's next token (`chain_depths`); rows' states are
    # written after sampling, the accepted one per chain (hybrid.settle_rows).
    chained_rows: bool = False
    # With the MTP head (model/mtp.py): the token after the chunk's last one when the host
    # knows it (a prompt continues past the chunk), else -1 (the chunk's sample follows).
    chunk_next: jax.Array | None = None  # int32 []


jax.tree_util.register_dataclass(
    RaggedBatch, data_fields=[f.name for f in dataclasses.fields(RaggedBatch)
                              if f.name != "chained_rows"], meta_fields=["chained_rows"])


def chunk_only(tokens, start, num_tokens, page_table) -> RaggedBatch:
    """A batch with the chunk region only (B = 0): the plain prefill step."""
    return RaggedBatch(tokens, start, num_tokens, page_table,
                       row_tokens=jnp.zeros(0, jnp.int32), row_src=jnp.zeros(0, jnp.int32),
                       row_positions=jnp.zeros(0, jnp.int32),
                       row_tables=jnp.zeros((0, page_table.shape[0]), jnp.int32))


def rows_only(tokens, positions, page_tables) -> RaggedBatch:
    """A batch with the row region only (C = 0): the plain decode step."""
    return RaggedBatch(jnp.zeros(0, jnp.int32), jnp.int32(0), jnp.int32(0),
                       jnp.full(page_tables.shape[1:], DUMMY_PAGE, jnp.int32), tokens,
                       jnp.full(tokens.shape, FROM_HOST, jnp.int32), positions, page_tables)


def chain_depths(row_state_slots):
    """int32 [B]: how many rows before each row continue its chain (0 for a chain's first
    row). Slots are never shared between sequences, so equal real slots in consecutive rows
    mean consecutive tokens of one sequence; padding rows (DUMMY_STATE_SLOT) never chain."""
    slots = jnp.asarray(row_state_slots, jnp.int32)
    continues = jnp.concatenate([jnp.zeros(1, bool),
                                 (slots[1:] == slots[:-1]) & (slots[1:] != DUMMY_STATE_SLOT)])
    index = jnp.arange(slots.shape[0], dtype=jnp.int32)
    chain_start = jax.lax.cummax(jnp.where(continues, 0, index))
    return index - chain_start


def last_accepted_rows(row_state_slots, row_tokens, row_samples):
    """bool [B]: the row of each chain (chain_depths) whose state and sample a speculative
    round keeps. row_tokens [B] the rows' tokens, row_samples [B] the token sampled after
    each; row i+1's token is a draft, accepted when row i sampled it. The kept row is the
    last one whose fed draft (if any) was accepted and whose own sample is a correction or
    the bonus (engine/speculation.py `num_accepted`); a chain of one keeps its row."""
    depth = chain_depths(row_state_slots)
    index = jnp.arange(depth.shape[0])
    next_continues = jnp.concatenate([depth[1:] > 0, jnp.zeros(1, bool)])
    next_token = jnp.concatenate([row_tokens[1:], jnp.zeros(1, row_tokens.dtype)])
    matched = next_continues & (row_samples == next_token)
    broken = (depth > 0) & ~jnp.roll(matched, 1)  # the draft this row feeds was rejected
    breaks = jnp.cumsum(broken)
    return (breaks == breaks[index - depth]) & ~matched


def num_chunk_tokens(batch: RaggedBatch) -> int:
    return batch.chunk_tokens.shape[0]


def num_segments(batch: RaggedBatch) -> int:
    """K, the chunks the chunk region holds (static): 1 for today's single chunk."""
    return 1 if jnp.ndim(batch.chunk_start) == 0 else batch.chunk_start.shape[0]


def segmented(batch: RaggedBatch) -> bool:
    """Whether the chunk fields carry the segment axis (families without segment support
    refuse such batches: only the dense llama / qwen3 forward takes them)."""
    return jnp.ndim(batch.chunk_start) == 1


def _segments(batch: RaggedBatch):
    """(starts [K], lengths [K], tables [K, W], tokens per segment Cs), single chunks as K=1."""
    K = num_segments(batch)
    starts = jnp.reshape(jnp.asarray(batch.chunk_start, jnp.int32), (K,))
    lengths = jnp.reshape(jnp.asarray(batch.chunk_len, jnp.int32), (K,))
    tables = jnp.reshape(batch.chunk_table, (K, -1))
    return starts, lengths, tables, num_chunk_tokens(batch) // K


def num_sampled(batch: RaggedBatch) -> int:
    """The step's sampled rows before the row tokens: one per segment (one, never used,
    without a chunk)."""
    return num_segments(batch) if num_chunk_tokens(batch) else 1


def step_tokens(batch: RaggedBatch, prev_out=None):
    """Token ids of all C + B rows, row tokens with row_src >= 0 read from prev_out
    (without token_automaton.FORCED_BIT)."""
    rows = jnp.asarray(batch.row_tokens, jnp.int32)
    if prev_out is not None:
        fed_back = jnp.take(prev_out, batch.row_src, mode="clip").astype(jnp.int32)
        fed_back = fed_back & TOKEN_MASK  # a token a policy forced carries a flag bit
        rows = jnp.where(batch.row_src >= 0, fed_back, rows)
    return jnp.concatenate([jnp.asarray(batch.chunk_tokens, jnp.int32), rows])


def _chunk_positions(batch: RaggedBatch):
    """Absolute positions of the C chunk tokens, and whether each is a real token."""
    starts, lengths, _, Cs = _segments(batch)
    offsets = jnp.arange(Cs, dtype=jnp.int32)
    positions = (starts[:, None] + offsets).reshape(-1)
    return positions, (offsets < lengths[:, None]).reshape(-1)


def step_positions(batch: RaggedBatch):
    """Absolute positions of all C + B rows."""
    chunk, _ = _chunk_positions(batch)
    return jnp.concatenate([chunk, jnp.asarray(batch.row_positions, jnp.int32)])


def step_slots(batch: RaggedBatch, page_size: int):
    """Flat cache slots (page * S + offset) where each of the C + B rows writes its K/V;
    chunk padding goes to the dummy page (rows carry their own dummy tables)."""
    _, _, tables, Cs = _segments(batch)
    chunk_positions, real = _chunk_positions(batch)
    # each chunk token's page from its own segment's table (flat index: segment * W + entry)
    K, W = tables.shape
    segment = jnp.arange(K * Cs, dtype=jnp.int32) // max(Cs, 1)
    entry = jnp.clip(chunk_positions // page_size, 0, W - 1)
    chunk_pages = jnp.take(tables.reshape(-1), segment * W + entry, mode="clip")
    chunk_pages = jnp.where(real, chunk_pages, DUMMY_PAGE)
    positions = jnp.asarray(batch.row_positions, jnp.int32)
    row_pages = jnp.take_along_axis(batch.row_tables, (positions // page_size)[:, None],
                                    axis=1)[:, 0]
    pages = jnp.concatenate([chunk_pages, row_pages])
    return pages * page_size + step_positions(batch) % page_size


def live_rows(slots, page_size: int):
    """bool [C + B]: the rows of a step that are real tokens, from their cache slots
    (step_slots): padding (chunk tokens past chunk_len, padding rows, a padding chunk)
    writes the dummy page and nothing else does. Work that only padding would need, such as
    the experts a padding row's router picks (model/moe_mlp.py), is skipped by this mask."""
    return slots // page_size != DUMMY_PAGE


def sampled_logits(x, batch: RaggedBatch, logits_of):
    """`logits_of` (a family's LM head) over the sampled rows of x [C + B, H] (K + B with K
    segments, num_sampled; 1 + B for one chunk or none). With no
    chunk its row would be a wasted LM-head row (on XLA CPU a 2-row product costs nearly twice
    a 1-row one), so it gets zero logits without the product."""
    if num_chunk_tokens(batch) == 0:
        logits = logits_of(x)
        return jnp.concatenate([jnp.zeros_like(logits[:1]), logits])
    return logits_of(sampled_rows(x, batch))


def sampled_rows(x, batch: RaggedBatch):
    """Of the step's final residual x [C + B, H], the rows that are sampled: each chunk's
    (segment's) last real token (one zero row when C == 0, never used), then every row
    token."""
    C = num_chunk_tokens(batch)
    if not C:
        return jnp.concatenate([jnp.zeros((1, *x.shape[1:]), x.dtype), x])
    _, lengths, _, Cs = _segments(batch)
    last = jnp.arange(lengths.shape[0], dtype=jnp.int32) * Cs + jnp.clip(lengths - 1, 0, Cs - 1)
    return jnp.concatenate([jnp.take(x, last, axis=0), x[C:]])


def out_slots(num_sampled_chunks: int, num_rows: int, chunk_slots: int):
    """Where a step's sampled rows go in its output (numpy, static): chunk sample k at k,
    row i at chunk_slots + i. chunk_slots (the runner's most chunks per step) is the same
    for every compiled shape, so a row's index in `out` never depends on the shape."""
    return np.concatenate([np.arange(num_sampled_chunks),
                           chunk_slots + np.arange(num_rows)]).astype(np.int32)
