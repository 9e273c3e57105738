"""Host-side metadata of one vision encode: everything the tower needs besides the pixels.

The input is the Qwen-VL processors' format: `pixel_values` rows of C*Tp*P*P values, one row per
patch, and one (t, h, w) patch grid per item (image or video). Within each of the t frames the
rows run in merge-block order (block row, block column, row in block, column in block), so
every spatial_merge_size**2 consecutive rows fold into one text token. From the grids alone
(numpy, no device work) come, per patch row:
    pos_index  int32 [N, 4]   the four taps into the learned G x G position grid ...
    pos_weight f32   [N, 4]   ... and their bilinear weights (align_corners resampling)
    rope_hw    int32 [N, 2]   the (row, column) the 2D rotary embedding uses
    segment    int32 [N]      attention segment: one per frame; padding rows share PAD_SEGMENT
Padding to a bucket of N rows appends rows that attend only among themselves; their merged
tokens sit after the real ones and are dropped by the caller.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from ninfer_jax.model.vision.config import VisionConfig

PAD_SEGMENT = -1  # the segment of padding rows: they never attend to a real patch


@dataclasses.dataclass(frozen=True)
class VisionInputs:
    """One encode's inputs (a pytree; its row count N is the compiled bucket)."""

    pixel_values: jax.Array  # [N, C*Tp*P*P], the processor's rows (zeros past the real ones)
    pos_index: jax.Array  # int32 [N, 4]
    pos_weight: jax.Array  # f32 [N, 4]
    rope_hw: jax.Array  # int32 [N, 2]
    segment: jax.Array  # int32 [N]


jax.tree_util.register_dataclass(
    VisionInputs, data_fields=[f.name for f in dataclasses.fields(VisionInputs)], meta_fields=[])


def num_patches(grids) -> int:
    return int(sum(t * h * w for t, h, w in grids))


def num_tokens(grid, config: VisionConfig) -> int:
    """Text-model tokens of one item: its patches folded merge x merge."""
    t, h, w = grid
    return t * h * w // config.merge_unit


def vision_inputs(pixel_values: np.ndarray, grids, config: VisionConfig,
                  num_rows: int | None = None) -> VisionInputs:
    """The tower's inputs for the items `grids` [(t, h, w), ...] whose rows are `pixel_values`,
    padded to `num_rows` (a multiple of merge**2 at least the real count; default: no padding)."""
    real = num_patches(grids)
    num_rows = real if num_rows is None else num_rows
    if pixel_values.shape != (real, config.patch_dim):
        raise ValueError(f"pixel_values has shape {pixel_values.shape}; the grids need "
                         f"({real}, {config.patch_dim})")
    if num_rows < real or num_rows % config.merge_unit:
        raise ValueError(f"num_rows {num_rows} must be a multiple of {config.merge_unit} "
                         f"and at least {real}")
    merge = config.spatial_merge_size
    for t, h, w in grids:
        if h % merge or w % merge:
            raise ValueError(f"grid ({t}, {h}, {w}) is not a multiple of the merge size {merge}")
    rows, cols, sizes, segments = [], [], [], []
    segment = 0
    for t, h, w in grids:
        row, col = _block_order(h, w, merge)
        for _ in range(t):
            rows.append(row)
            cols.append(col)
            sizes.append(np.broadcast_to([h, w], (h * w, 2)))
            segments.append(np.full(h * w, segment, np.int32))
            segment += 1
    pad = num_rows - real
    row = np.concatenate(rows + [np.zeros(pad, np.int64)])
    col = np.concatenate(cols + [np.zeros(pad, np.int64)])
    size = np.concatenate(sizes + [np.ones((pad, 2), np.int64)])
    pos_index, pos_weight = _bilinear_taps(row, col, size, math.isqrt(
        config.num_position_embeddings))
    padded = np.zeros((num_rows, config.patch_dim), pixel_values.dtype)
    padded[:real] = pixel_values
    return VisionInputs(
        pixel_values=padded, pos_index=pos_index, pos_weight=pos_weight,
        rope_hw=np.stack([row, col], axis=1).astype(np.int32),
        segment=np.concatenate(segments + [np.full(pad, PAD_SEGMENT, np.int32)]))


def _block_order(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of each patch of an h x w frame in the processors' merge-block order."""
    row, col = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    return (row.reshape(shape).transpose(0, 2, 1, 3).ravel(),
            col.reshape(shape).transpose(0, 2, 1, 3).ravel())


def _bilinear_taps(row, col, size, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Taps and weights resampling the side x side grid to each frame's (h, w) with corners
    aligned (frame edges map to grid edges); out-of-grid taps clamp to the border."""
    def axis(index, length):
        src = index * (side - 1) / np.maximum(length - 1, 1)
        floor = np.floor(src)
        frac = src - floor
        taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
        return taps, np.stack([1.0 - frac, frac], axis=1)

    h_taps, h_weights = axis(row.astype(np.float64), size[:, 0].astype(np.float64))
    w_taps, w_weights = axis(col.astype(np.float64), size[:, 1].astype(np.float64))
    index = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    weight = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)
    return index.astype(np.int32), weight.astype(np.float32)
