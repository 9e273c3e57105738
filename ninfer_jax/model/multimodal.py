"""What a step with media adds to the text model's inputs: the rows of one pytree, `MediaRows`.

A prompt with images or video runs through the same ragged step as text (model/ragged_batch.py;
llama.py and hybrid.py take `media=MediaRows`) with three changes, all carried here for the step's C chunk + B row tokens:
  - the chunk's placeholder rows take the vision tower's embeddings instead of token embeddings;
  - every row gets three-axis MRoPE positions (model/vision/mrope.py): rows after a prompt's
    media sit at their position + the prompt's delta on all axes, text-only rows at their
    position;
  - the deepstack features (Qwen3-VL) are added to the chunk rows' residual after each of the
    first S decoder layers (zeros on text rows, so only media rows change).
KV-cache slots and attention lengths still come from the plain positions: MRoPE only changes
the rotation. Shape letters: C chunk tokens, N = C + B step rows, H hidden, S deepstack layers.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class MediaRows:
    rope_positions: jax.Array  # int32 [3, N]: (temporal, row, column) position of every row
    embeds: jax.Array  # [C, H]: vision embeddings of the chunk's media rows (ignored elsewhere)
    is_media: jax.Array  # bool [C]: which chunk rows are media placeholders
    deepstack: jax.Array  # [S, C, H]: added after decoder layer s (zeros on text rows)


jax.tree_util.register_dataclass(
    MediaRows, data_fields=[f.name for f in dataclasses.fields(MediaRows)], meta_fields=[])


def place(is_media, features):
    """Spread features [M, ...] of the media rows, in order, over rows [T] where is_media
    (zeros elsewhere): how a prompt's encoded items become per-row embeddings."""
    index = jnp.clip(jnp.cumsum(is_media) - 1, 0, max(features.shape[0] - 1, 0))
    rows = jnp.take(features, index, axis=0)
    mask = is_media.reshape(is_media.shape + (1,) * (features.ndim - 1))
    return jnp.where(mask, rows, jnp.zeros_like(rows))


def chunk_embeddings(x, media: MediaRows):
    """Step rows x [N, H] with the chunk's media rows replaced by their vision embeddings."""
    C = media.is_media.shape[0]
    chunk = jnp.where(media.is_media[:, None], media.embeds.astype(x.dtype), x[:C])
    return jnp.concatenate([chunk, x[C:]])


def deepstack_rows(media: MediaRows, num_rows: int):
    """The deepstack features padded from the C chunk rows to all N step rows: [S, N, H]."""
    S, C, H = media.deepstack.shape
    return jnp.concatenate([media.deepstack, jnp.zeros((S, num_rows - C, H),
                                                       media.deepstack.dtype)], axis=1)
