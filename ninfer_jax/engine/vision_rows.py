"""VisionRows: the runner's vision side (--vision): encodes a prompt's media with the tower and
builds the MediaRows (model/multimodal.py) of every step that needs them.

Threading: engine thread only (the runner calls it from `launch`). An encode runs on the
device between the steps launched before and after it; the host waits for both the earlier
steps and the encode, so the encode's time is its own (the request log's vision time).
Memory: the features of a sequence live from its first chunk with media to the chunk that
passes its last placeholder (then nothing reads them), at most `max_sequences` at a time (a
prefill cancelled half way leaves its entry behind until it is pushed out).
Shapes: the tower compiles per patch-row bucket (powers of two from `smallest_patches`);
the per-chunk gather of feature rows compiles per (feature bucket, chunk bucket).
Shape letters: C chunk tokens, N = C + B step rows, M feature rows, O text hidden, S deepstack.
"""
from __future__ import annotations

import collections
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.engine.prompt_media import PromptMedia
from ninfer_jax.model.multimodal import MediaRows
from ninfer_jax.model.vision import grid, tower
from ninfer_jax.model.vision.config import VisionConfig

SMALLEST_PATCHES = 256


@dataclasses.dataclass(frozen=True)
class _Encoded:
    embeds: jax.Array  # [M, O] features from PromptMedia feature row `base` on, padding after
    deepstack: jax.Array  # [S, M, O]
    base: int  # the PromptMedia feature row of embeds[0]
    media: PromptMedia  # whose items these are (a seq_id may come again from a new engine)


class VisionRows:
    def __init__(self, params, config: VisionConfig, *, hidden: int, dtype, max_patches: int,
                 max_sequences: int, wait_previous=lambda: None,
                 smallest_patches: int = SMALLEST_PATCHES):
        self.config, self.hidden, self.dtype = config, hidden, dtype
        self.params = params
        self.num_deepstack = len(config.deepstack_layers)
        smallest = min(smallest_patches, max_patches)
        sizes, size = [], smallest
        while size < max_patches:
            sizes.append(size)
            size *= 2
        unit = config.merge_unit
        self.buckets = tuple(-(-s // unit) * unit for s in sizes + [max_patches])
        self.max_sequences = max_sequences
        self._encode = jax.jit(tower.encode, static_argnames="config")
        self._gather = jax.jit(_gather)
        self._features: collections.OrderedDict[int, _Encoded] = collections.OrderedDict()
        self._zeros: dict[int, tuple] = {}
        # The host loses its one-step lead once per media request for that timing.
        self.wait_previous = wait_previous
        self.items_encoded = 0  # cumulative; items inside a reused prefix never count
        self.last_encode = (0, 0.0)  # (items, seconds) of the latest step_rows call

    # ------------------------------------------------------------------ compiling

    def warm(self) -> None:
        """Compile and run the smallest encode bucket (others compile on first use)."""
        self._run_encode(self._example(self.buckets[0]))

    def example_rows(self, chunk: int, rows: int) -> MediaRows:
        """A MediaRows of the step shape (chunk, rows) for lowering and padding runs."""
        embeds, is_media, deepstack = self._empty(chunk)
        return MediaRows(rope_positions=jnp.zeros((3, chunk + rows), jnp.int32),
                         embeds=embeds, is_media=is_media, deepstack=deepstack)

    def _example(self, num_rows: int) -> grid.VisionInputs:
        side = self.config.spatial_merge_size
        grids = [(1, side, num_rows // side)]
        return grid.vision_inputs(np.zeros((num_rows, self.config.patch_dim), np.float32),
                                  grids, self.config)

    def _run_encode(self, inputs: grid.VisionInputs):
        return self._encode(self.params, inputs, config=self.config)

    # ------------------------------------------------------------------ steps

    def step_rows(self, unit, rows, chunk: int, num_rows: int) -> MediaRows:
        """The MediaRows of a step: the chunk's vision rows (encoding its items first when
        this sequence has none yet) and every row's MRoPE positions (padding rows at 0)."""
        self.last_encode = (0, 0.0)
        positions = np.zeros((3, chunk + num_rows), np.int32)
        if unit is not None:
            num = len(unit.tokens)
            media: PromptMedia | None = unit.media
            positions[:, :num] = (media.chunk_positions(unit.start, num) if media is not None
                                  else np.arange(unit.start, unit.start + num))
        if rows:
            positions[:, chunk:chunk + len(rows)] = [row.position + row.rope_delta
                                                     for row in rows]
        if unit is None or unit.media is None or unit.start >= unit.media.end:
            embeds, is_media, deepstack = self._empty(chunk)
        else:
            embeds, is_media, deepstack = self._chunk_features(unit, chunk)
        return MediaRows(rope_positions=positions, embeds=embeds, is_media=is_media,
                         deepstack=deepstack)

    def _chunk_features(self, unit, chunk: int):
        media: PromptMedia = unit.media
        num = len(unit.tokens)
        rows = np.full(num, -1, np.int32)  # a replay's chunk may run past the prompt
        inside = media.feature_row[unit.start:unit.start + num]
        rows[:len(inside)] = inside
        if not (rows >= 0).any():  # text before or between items: no features yet
            return self._empty(chunk)
        encoded = self._features.get(unit.seq_id)
        if encoded is None or encoded.media is not media or not _covers(encoded, media,
                                                                        unit.start):
            encoded = self._encode_from(media, unit.start)
            self._features[unit.seq_id] = encoded
            while len(self._features) > self.max_sequences:
                self._features.popitem(last=False)
        index = np.zeros(chunk, np.int32)
        is_media = np.zeros(chunk, bool)
        is_media[:num] = rows >= 0
        index[:num] = np.where(rows >= 0, rows - encoded.base, 0)
        if unit.start + num >= media.end:  # no later chunk reads them
            self._features.pop(unit.seq_id, None)
        embeds, deepstack = self._gather(encoded.embeds, encoded.deepstack, index, is_media)
        return embeds, is_media, deepstack

    def _encode_from(self, media: PromptMedia, start: int) -> _Encoded:
        """Encode the items that end after `start`: those before it are in the KV already
        (a prefix hit, or earlier chunks), so they are not encoded again."""
        needed = [i for i, end in enumerate(media.item_ends) if end > start]
        items = [media.items[i] for i in needed]
        self.items_encoded += len(items)
        grids = [tuple(item.grid_thw) for item in items]
        real = grid.num_patches(grids)
        bucket = next((b for b in self.buckets if b >= real), None)
        if bucket is None:
            raise ValueError(f"{real} patches exceed the largest vision bucket "
                             f"{self.buckets[-1]}")
        pixels = np.concatenate([np.asarray(item.pixel_values, np.float32) for item in items])
        inputs = grid.vision_inputs(pixels, grids, self.config, num_rows=bucket)
        self.wait_previous()
        started = time.perf_counter()
        embeds, deepstack = jax.block_until_ready(self._run_encode(inputs))
        self.last_encode = (len(items), time.perf_counter() - started)
        return _Encoded(embeds=embeds, deepstack=deepstack, base=media.item_rows[needed[0]],
                        media=media)

    def _empty(self, chunk: int):
        if chunk not in self._zeros:
            self._zeros[chunk] = (jnp.zeros((chunk, self.hidden), self.dtype),
                                  np.zeros(chunk, bool),
                                  jnp.zeros((self.num_deepstack, chunk, self.hidden),
                                            self.dtype))
        return self._zeros[chunk]


def _covers(encoded: _Encoded, media: PromptMedia, start: int) -> bool:
    """Whether the sequence's encoded items include every item ending after `start` (a
    sequence rolled back before its first encoded item needs a new encode)."""
    return all(row >= encoded.base for row, end in zip(media.item_rows, media.item_ends)
               if end > start)


def _gather(embeds, deepstack, index, is_media):
    """The chunk's feature rows [C, O] and deepstack rows [S, C, O], zeros on text rows."""
    mask = is_media[:, None]
    rows = jnp.where(mask, jnp.take(embeds, index, axis=0), 0)
    taps = jnp.where(mask[None], jnp.take(deepstack, index, axis=1), 0)
    return rows, taps
