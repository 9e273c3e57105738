"""The metadata of one ragged step and the per-token arrays every model family derives from it.

A ragged step runs two regions of tokens through one forward, concatenated as C + B rows:
  chunk region  C tokens of one sequence's prefill chunk (C static, possibly 0; the last
                C - chunk_len are padding);
  row region    B single tokens, each with its own position and page table: decode rows,
                the K+1 tokens of a speculative verify row, and padding rows.
Padding (chunk tokens past chunk_len, rows with an all-DUMMY_PAGE table at position 0) writes
its K/V to the dummy page only. A row token may come from the previous step's device output
(`row_src` >= 0), so the host can launch a step before it has read the last one's samples.
Shape letters: C chunk tokens, B row tokens, W page-table width, S page size, H hidden.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import ragged_attention
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE
from ninfer_jax.model.layers import rope_inverse_frequencies, rope_tables

FROM_HOST = -1  # row_src value: the row's token is row_tokens[i], not a previous output
DUMMY_STATE_SLOT = 0  # the state slot of padding rows (hybrid families)


@dataclasses.dataclass(frozen=True)
class RaggedBatch:
    """Inputs of one ragged step (a pytree of arrays; every shape is part of the compile)."""

    chunk_tokens: jax.Array  # int32 [C]: the chunk's token ids (C may be 0: no chunk region)
    chunk_start: jax.Array  # int32 []: position of chunk_tokens[0]
    chunk_len: jax.Array  # int32 []: real chunk tokens (>= 1 when C > 0), padding after them
    chunk_table: jax.Array  # int32 [W]: the chunk's sequence page table, DUMMY_PAGE-padded
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


jax.tree_util.register_dataclass(
    RaggedBatch, data_fields=[f.name for f in dataclasses.fields(RaggedBatch)], meta_fields=[])


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


def num_chunk_tokens(batch: RaggedBatch) -> int:
    return batch.chunk_tokens.shape[0]


def step_tokens(batch: RaggedBatch, prev_out=None):
    """Token ids of all C + B rows, row tokens with row_src >= 0 read from prev_out."""
    rows = jnp.asarray(batch.row_tokens, jnp.int32)
    if prev_out is not None:
        fed_back = jnp.take(prev_out, batch.row_src, mode="clip").astype(jnp.int32)
        rows = jnp.where(batch.row_src >= 0, fed_back, rows)
    return jnp.concatenate([jnp.asarray(batch.chunk_tokens, jnp.int32), rows])


def step_positions(batch: RaggedBatch):
    """Absolute positions of all C + B rows."""
    C = num_chunk_tokens(batch)
    chunk = batch.chunk_start + jnp.arange(C, dtype=jnp.int32)
    return jnp.concatenate([chunk, jnp.asarray(batch.row_positions, jnp.int32)])


def step_slots(batch: RaggedBatch, page_size: int):
    """Flat cache slots (page * S + offset) where each of the C + B rows writes its K/V;
    chunk padding goes to the dummy page (rows carry their own dummy tables)."""
    C = num_chunk_tokens(batch)
    chunk_positions = batch.chunk_start + jnp.arange(C, dtype=jnp.int32)
    chunk_pages = jnp.take(batch.chunk_table, chunk_positions // page_size, mode="clip")
    chunk_pages = jnp.where(jnp.arange(C) < batch.chunk_len, chunk_pages, DUMMY_PAGE)
    positions = jnp.asarray(batch.row_positions, jnp.int32)
    row_pages = jnp.take_along_axis(batch.row_tables, (positions // page_size)[:, None],
                                    axis=1)[:, 0]
    pages = jnp.concatenate([chunk_pages, row_pages])
    return pages * page_size + step_positions(batch) % page_size


def sampled_rows(x, batch: RaggedBatch):
    """Of the step's final residual x [C + B, H], the 1 + B rows that are sampled: the
    chunk's last real token (a zero row when C == 0, never used), then every row token."""
    C = num_chunk_tokens(batch)
    if C:
        last = jnp.take(x[:C], batch.chunk_len - 1, axis=0, mode="clip")
    else:
        last = jnp.zeros(x.shape[1:], x.dtype)
    return jnp.concatenate([last[None], x[C:]])


def attention(batch: RaggedBatch, scale: float):
    """The step's attention op, `attend(q, k_cache, v_cache)`: the chunk causally over its
    sequence, each row token over keys 0..its position (kernels.ragged_attention)."""
    return functools.partial(
        ragged_attention.ragged_paged_attention, chunk_table=batch.chunk_table,
        chunk_start=batch.chunk_start, row_tables=batch.row_tables,
        row_lengths=batch.row_positions + 1, scale=scale,
        num_chunk_tokens=num_chunk_tokens(batch))


def attention_inputs(batch: RaggedBatch, config, page_size: int):
    """What each attention layer of the step takes: (attend, the RoPE (cos, sin) tables over
    the first head_dim * partial_rotary_factor dims, the cache slot each row writes)."""
    rotary_dim = int(config.head_dim * config.partial_rotary_factor)
    inv_freq = rope_inverse_frequencies(rotary_dim, config.rope_theta, config.rope_scaling)
    return (attention(batch, config.head_dim ** -0.5),
            rope_tables(step_positions(batch), inv_freq), step_slots(batch, page_size))


# A family module's three steps from its `forward(params, kv, batch, tokens, config, page_size)
# -> (final residual [C + B, H], kv)` and `logits(params, x, config) -> f32 logits`.

def run_ragged(forward, logits, params, kv, batch: RaggedBatch, prev_out, config,
               page_size: int):
    """The f32 logits of the 1 + B sampled rows (see llama.ragged) and the caches."""
    x, kv = forward(params, kv, batch, step_tokens(batch, prev_out), config, page_size)
    return sampled_logits(x, batch, functools.partial(logits, params, config=config)), kv


def run_prefill(forward, logits, params, kv, batch: RaggedBatch, num_tokens, config,
                page_size: int):
    """A chunk-only batch: the f32 logits of its last real token and the caches."""
    x, kv = forward(params, kv, batch, step_tokens(batch), config, page_size)
    return logits(params, jnp.take(x, num_tokens - 1, axis=0), config), kv


def run_decode(forward, logits, params, kv, batch: RaggedBatch, config, page_size: int):
    """A rows-only batch: f32 logits [B, V] and the caches."""
    x, kv = forward(params, kv, batch, step_tokens(batch), config, page_size)
    return logits(params, x, config), kv


def sampled_logits(x, batch: RaggedBatch, head):
    """`head` (final residual rows -> f32 logits) over the 1 + B sampled rows of x [C + B, H].
    Without a chunk its row would be a wasted LM-head row (on XLA CPU a 2-row product costs
    nearly twice a 1-row one), so it gets zero logits without the product."""
    if num_chunk_tokens(batch) == 0:
        logits = head(x)
        return jnp.concatenate([jnp.zeros_like(logits[:1]), logits])
    return head(sampled_rows(x, batch))
