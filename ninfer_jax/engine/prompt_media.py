"""What the engine derives once from a prompt's media (GenerationRequest.media): `PromptMedia`.

Built by the scheduler when a request with media arrives (host numpy, no device work) and
carried by its sequence:
  - the three-axis MRoPE positions of the prompt and the delta that decode rows add
    (model/vision/mrope.py's layout, here from the items' spans: a placeholder run's length
    fixes the merged grid, so the engine needs no vision config);
  - per prompt position, the row of the request's concatenated vision features that replaces
    the token's embedding (-1 on text);
  - the prefix-cache marks: each placeholder position's key is (token id, media digest,
    index within the item), so two images with the same grid (hence the same pad tokens)
    never share a cached page, and a hit implies the same media at the same positions.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ninfer_jax.engine.request import MediaInput


@dataclasses.dataclass(frozen=True, eq=False)
class PromptMedia:
    items: tuple[MediaInput, ...]
    rope_positions: np.ndarray  # int32 [3, T]: the prompt's (temporal, row, column) positions
    rope_delta: int  # positions from T on are position + delta on all three axes
    feature_row: np.ndarray  # int32 [T]: row of the concatenated item features, -1 on text
    item_rows: tuple[int, ...]  # first feature row of each item (then its tokens in order)
    item_ends: tuple[int, ...]  # prompt offset just past each item's last placeholder
    marks: dict  # prompt position -> its prefix-cache key entry (placeholders only)

    @property
    def end(self) -> int:
        """Prompt offset past the last placeholder: later chunks need no vision features."""
        return max(self.item_ends)

    def chunk_positions(self, start: int, num: int) -> np.ndarray:
        """int32 [3, num]: the MRoPE positions of tokens [start, start + num) (past the prompt
        a token sits at position + delta on every axis)."""
        T = self.rope_positions.shape[1]
        inside = self.rope_positions[:, start:min(start + num, T)]
        beyond = np.arange(max(start, T), start + num, dtype=np.int32) + self.rope_delta
        return np.concatenate([inside, np.broadcast_to(beyond, (3, beyond.size))], axis=1)


def build(items: tuple[MediaInput, ...], num_prompt: int,
          prompt_ids=None) -> PromptMedia:
    """PromptMedia of a prompt of `num_prompt` tokens whose media are `items` (spans in prompt
    order). ValueError when spans overlap, leave the prompt or disagree with their grids."""
    runs = []  # (offset, length, merged rows, merged columns, item, index within item)
    for index, item in enumerate(items):
        t, h, w = item.grid_thw
        within = 0
        for offset, length in _frame_runs(item):
            merge = math.isqrt(h * w // max(length, 1))
            if length < 1 or merge * merge * length != h * w or h % merge or w % merge:
                raise ValueError(f"a run of {length} placeholders does not fit the grid "
                                 f"{item.grid_thw}")
            runs.append((offset, length, h // merge, w // merge, index, within))
            within += length
    runs.sort()
    positions = np.zeros((3, num_prompt), np.int32)
    feature_row = np.full(num_prompt, -1, np.int32)
    item_rows = np.cumsum([0] + [item.num_tokens for item in items])[:-1]
    item_ends = [0] * len(items)
    marks = {}
    cursor = current = 0
    for offset, length, rows, cols, index, within in runs:
        if offset < cursor or offset + length > num_prompt:
            raise ValueError("media placeholder runs overlap or leave the prompt")
        positions[:, cursor:offset] = np.arange(current, current + offset - cursor)
        current += offset - cursor
        row, col = np.divmod(np.arange(length), cols)
        span = slice(offset, offset + length)
        positions[0, span], positions[1, span], positions[2, span] = current, current + row, \
            current + col
        feature_row[span] = item_rows[index] + within + np.arange(length)
        digest = items[index].digest
        for k in range(length):
            token = None if prompt_ids is None else int(prompt_ids[offset + k])
            marks[offset + k] = (token, digest, within + k)
        item_ends[index] = max(item_ends[index], offset + length)
        current += max(rows, cols)
        cursor = offset + length
    positions[:, cursor:] = np.arange(current, current + num_prompt - cursor)
    delta = int(positions.max()) + 1 - num_prompt if num_prompt else 0
    return PromptMedia(items=tuple(items), rope_positions=positions, rope_delta=delta,
                       feature_row=feature_row, item_rows=tuple(int(r) for r in item_rows),
                       item_ends=tuple(item_ends), marks=marks)


def _frame_runs(item: MediaInput) -> list[tuple[int, int]]:
    """The item's placeholder runs, one per frame (MRoPE restarts the grid at each): a video
    written as one bare run (Qwen2-VL templates) is cut into its t frames."""
    t = item.grid_thw[0] if item.kind == "video" else 1
    if len(item.spans) == t:
        return list(item.spans)
    if len(item.spans) == 1 and item.spans[0][1] % t == 0:
        offset, length = item.spans[0]
        step = length // t
        return [(offset + i * step, step) for i in range(t)]
    raise ValueError(f"{item.kind} has {len(item.spans)} placeholder runs; its grid "
                     f"{item.grid_thw} needs {t}")


class MediaKeyedTokens:
    """A sequence's tokens as the prefix cache keys them: slices are lists whose placeholder
    entries are the PromptMedia marks, so a page holding media keys on its digests too.
    Only `len` and slicing are supported (all the prefix cache uses)."""

    def __init__(self, tokens: list[int], marks: dict):
        self.tokens, self.marks = tokens, marks

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: slice) -> list:
        start, stop, _ = index.indices(len(self.tokens))
        values = self.tokens[index]
        for position in range(start, stop):
            mark = self.marks.get(position)
            if mark is not None:
                values[position - start] = mark
        return values
