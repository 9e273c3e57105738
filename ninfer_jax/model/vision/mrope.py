"""Three-axis (temporal, row, column) rotary positions of a prompt with media spans (MRoPE).

Text tokens advance all three axes together. A media span (the placeholder tokens of one
image, or of one video frame: Qwen3-VL splits a video's t temporal patches into t spans, each
delimited and preceded by its timestamp text) starts at the current position p: its tokens sit
at (p, p + row, p + column) over the merged grid, and the text after it resumes at
p + max(rows, columns). After the prompt every position is the text position plus `delta`
(max position + 1 - prompt length) on all three axes, which is what decode rows use.
Host numpy only; the engine computes this once per prompt.
"""
from __future__ import annotations

import itertools

import numpy as np

from ninfer_jax.model.vision.config import VisionConfig

TEXT, IMAGE, VIDEO = 0, 1, 2  # token types


def token_types(tokens, config: VisionConfig) -> np.ndarray:
    """int8 [T]: IMAGE / VIDEO for the placeholder ids, TEXT for everything else."""
    tokens = np.asarray(tokens)
    types = np.zeros(tokens.shape, np.int8)
    types[tokens == config.image_token_id] = IMAGE
    types[tokens == config.video_token_id] = VIDEO
    return types


def rope_positions(types: np.ndarray, image_grids, video_grids,
                   config: VisionConfig) -> tuple[np.ndarray, int]:
    """(positions int32 [3, T], delta): each run of IMAGE tokens takes the next image grid, each
    run of VIDEO tokens the next frame of the next video. A run whose length is not its grid's
    token count is an error (the prompt and the media disagree)."""
    merge = config.spatial_merge_size
    spans = {IMAGE: iter([(h, w) for _, h, w in image_grids]),
             VIDEO: iter([(h, w) for t, h, w in video_grids for _ in range(t)])}
    pieces, current = [], 0
    for kind, run in itertools.groupby(np.asarray(types).tolist()):
        length = len(list(run))
        if kind == TEXT:
            pieces.append(np.broadcast_to(np.arange(current, current + length), (3, length)))
            current += length
            continue
        h, w = next(spans[kind], (None, None))
        if h is None or (h // merge) * (w // merge) != length:
            raise ValueError(f"a run of {length} {'image' if kind == IMAGE else 'video'} "
                             "placeholder tokens does not match the next media grid")
        rows, cols = np.meshgrid(np.arange(h // merge), np.arange(w // merge), indexing="ij")
        pieces.append(np.stack([np.full(length, current), current + rows.ravel(),
                                current + cols.ravel()]))
        current += max(h, w) // merge
    if any(next(remaining, None) is not None for remaining in spans.values()):
        raise ValueError("more media grids than placeholder runs in the prompt")
    positions = np.concatenate(pieces, axis=1).astype(np.int32) if pieces else \
        np.zeros((3, 0), np.int32)
    delta = int(positions.max()) + 1 - positions.shape[1] if pieces else 0
    return positions, delta


def frequency_axes(sections: tuple[int, ...], num_frequencies: int) -> np.ndarray:
    """int32 [D/2]: the axis whose position turns each rotary frequency, interleaved as
    Qwen3-VL does: frequency j follows the row if j % 3 == 1 and j < 3 * sections[1], the
    column if j % 3 == 2 and j < 3 * sections[2], else the temporal axis."""
    if len(sections) != 3 or sum(sections) != num_frequencies:
        raise ValueError(f"mrope_section {sections} must be three counts summing to "
                         f"{num_frequencies}")
    j = np.arange(num_frequencies)
    axes = np.zeros(num_frequencies, np.int32)
    axes[(j % 3 == 1) & (j < 3 * sections[1])] = 1
    axes[(j % 3 == 2) & (j < 3 * sections[2])] = 2
    return axes
