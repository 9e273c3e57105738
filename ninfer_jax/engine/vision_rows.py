"""VisionRows: the runner's vision side (--vision): encodes a prompt's media with the tower and
builds the MediaRows (model/multimodal.py) of every step that needs them.

Threading: engine thread only (the runner calls it from `launch`). An encode runs on the
device between the steps launched before and after it; the host waits for both the earlier
steps and the encode, so the encode's time is its own (the request log's vision time).
Memory: the features of a sequence live from its first chunk with media to the chunk that
passes its last placeholder (then nothing reads them), at most `max_sequences` at a time (a
prefill cancelled half way leaves its entry behind until it is pushed out).
Shapes: the tower compiles per patch-row bucket (powers of two from `smallest_patches` up to
the largest call); `warm(every_bucket=True)` compiles them all before the server is ready,
else only the smallest (the rest on first use). The per-chunk gather of feature rows compiles
per (feature bucket, chunk bucket) on first use (a small gather).
Memory: the tower's attention is dense over one call's rows (segment-masked to each frame),
so a request's frames (an image is one, a video t) are packed into calls of at most
`ENCODE_PATCHES` patch rows (a larger frame alone): frames never attend to each other, so
the features equal one joint encode, and the scores stay bounded whatever the request holds.
Shape letters: C chunk tokens, N = C + B step rows, M feature rows, O text hidden, S deepstack.
"""
from __future__ import annotations

import collections
import concurrent.futures
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
# Patch rows per tower call: 16 heads' f32 scores over 8,192 rows are 4.3 GB. It is also
# the largest frame the engine takes (about 1,448 x 1,448 pixels): the processors' own limit
# (4,096 x 4,096, 65,536 patches) would need 275 GB of scores in one call.
ENCODE_PATCHES = MAX_FRAME_PATCHES = 8192


def encode_scratch_bytes(config: VisionConfig) -> int:
    """Device memory one tower call may take beyond the weights: the f32 attention scores of
    its largest call and their softmax (kept free of the KV pool, serve/kv_sizing.py)."""
    return 2 * config.num_heads * ENCODE_PATCHES ** 2 * 4


@dataclasses.dataclass(frozen=True)
class _Part:
    """One tower call's output: feature rows [first, first + num) of the PromptMedia."""

    embeds: jax.Array  # [M, O], padding rows after the num real ones
    deepstack: jax.Array  # [S, M, O]
    first: int
    num: int


@dataclasses.dataclass(frozen=True)
class _Encoded:
    parts: tuple[_Part, ...]
    base: int  # the first feature row encoded (items before it lie in reused KV)
    media: PromptMedia  # whose items these are (a seq_id may come again from a new engine)


class VisionRows:
    def __init__(self, params, config: VisionConfig, *, hidden: int, dtype, max_sequences: int,
                 wait_previous=lambda: None, smallest_patches: int = SMALLEST_PATCHES,
                 encode_patches: int = ENCODE_PATCHES):
        self.config, self.hidden, self.dtype = config, hidden, dtype
        self.params = params
        self.num_deepstack = len(config.deepstack_layers)
        smallest = min(smallest_patches, encode_patches)
        sizes, size = [], smallest
        while size < encode_patches:
            sizes.append(size)
            size *= 2
        unit = config.merge_unit
        self.buckets = tuple(-(-s // unit) * unit for s in sizes + [encode_patches])
        self._compiled: dict[int, object] = {}  # bucket -> executable compiled at warm-up
        self.max_sequences = max_sequences
        self.encode_patches = encode_patches
        self._encode = jax.jit(tower.encode, static_argnames="config")
        self._gather = jax.jit(_gather)
        self._features: collections.OrderedDict[int, _Encoded] = collections.OrderedDict()
        self._zeros: dict[int, tuple] = {}
        # The host loses its one-step lead once per media request for that timing.
        self.wait_previous = wait_previous
        self.items_encoded = 0  # cumulative; items inside a reused prefix never count
        self.last_encode = (0, 0.0)  # (items, seconds) of the latest step_rows call

    # ------------------------------------------------------------------ compiling

    def warm(self, every_bucket: bool = True) -> None:
        """Compile the encode buckets (all, or only the smallest) in parallel, then run the
        smallest once."""
        buckets = self.buckets if every_bucket else self.buckets[:1]

        def compile_bucket(bucket):
            return bucket, self._encode.lower(self.params, self._example(bucket),
                                              config=self.config).compile()

        with concurrent.futures.ThreadPoolExecutor(min(4, len(buckets))) as pool:
            self._compiled.update(pool.map(compile_bucket, buckets))
        jax.block_until_ready(self._run_encode(self._example(self.buckets[0])))

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
        compiled = self._compiled.get(inputs.segment.shape[0])
        if compiled is not None:
            return compiled(self.params, inputs)
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
        # The feature row of each chunk row, -1 past the prompt (a replay's chunk may be).
        rows = np.full(chunk, -1, np.int32)
        prompt_rows = media.feature_row[unit.start:unit.start + num]
        rows[:len(prompt_rows)] = prompt_rows
        if not (rows >= 0).any():  # text before or between items: no features yet
            return self._empty(chunk)
        encoded = self._features.get(unit.seq_id)
        if encoded is None or encoded.media is not media or not _covers(encoded, media,
                                                                        unit.start):
            encoded = self._encode_from(media, unit.start)
            self._features[unit.seq_id] = encoded
            while len(self._features) > self.max_sequences:
                self._features.popitem(last=False)
        if unit.start + num >= media.end:  # no later chunk reads them
            self._features.pop(unit.seq_id, None)
        embeds, deepstack = self._gather_rows(encoded.parts, rows)
        return embeds, rows >= 0, deepstack

    def _gather_rows(self, parts, rows):
        """Feature rows `rows` [C] (-1: none) as ([C, O], [S, C, O]): the sum of each part's
        gather, zeros where a part does not hold the row."""
        embeds = deepstack = None
        for part in parts:
            held = (rows >= part.first) & (rows < part.first + part.num)
            if not held.any():
                continue
            got = self._gather(part.embeds, part.deepstack,
                               np.where(held, rows - part.first, 0), held)
            embeds, deepstack = got if embeds is None else (embeds + got[0],
                                                            deepstack + got[1])
        return embeds, deepstack

    def _encode_from(self, media: PromptMedia, start: int) -> _Encoded:
        """Encode the items that end after `start`: those before it are in the KV already
        (a prefix hit, or earlier chunks), so they are not encoded again."""
        needed = [i for i, end in enumerate(media.item_ends) if end > start]
        self.items_encoded += len(needed)
        calls = self._pack_frames(media, needed)
        self.wait_previous()
        started = time.perf_counter()
        parts = []
        for frames in calls:
            grids = [(1, h, w) for _, _, h, w in frames]
            real = grid.num_patches(grids)
            bucket = next((b for b in self.buckets if b >= real), None)
            if bucket is None:
                raise ValueError(f"{real} patches exceed the largest vision bucket "
                                 f"{self.buckets[-1]}")
            pixels = np.concatenate([rows for _, rows, _, _ in frames])
            embeds, deepstack = self._run_encode(
                grid.vision_inputs(pixels, grids, self.config, num_rows=bucket))
            parts.append(_Part(embeds, deepstack, first=frames[0][0],
                               num=real // self.config.merge_unit))
        jax.block_until_ready([(part.embeds, part.deepstack) for part in parts])
        self.last_encode = (len(needed), time.perf_counter() - started)
        return _Encoded(parts=tuple(parts), base=media.item_rows[needed[0]], media=media)

    def _pack_frames(self, media: PromptMedia, items) -> list[list[tuple]]:
        """The items' frames (first feature row, pixel rows, h, w), in feature order, packed
        into tower calls of at most encode_patches patch rows (a larger frame alone)."""
        calls, current, size = [], [], 0
        for index in items:
            item = media.items[index]
            t, h, w = item.grid_thw
            pixels = np.asarray(item.pixel_values, np.float32)
            for frame in range(t):
                if current and size + h * w > self.encode_patches:
                    calls.append(current)
                    current, size = [], 0
                first = media.item_rows[index] + frame * h * w // self.config.merge_unit
                current.append((first, pixels[frame * h * w:(frame + 1) * h * w], h, w))
                size += h * w
        return calls + [current]

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
