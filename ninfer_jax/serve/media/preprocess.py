"""Qwen VL preprocessing: decoded RGB pixels -> `pixel_values` rows and `grid_thw`.

The same numbers transformers' Qwen2-VL image processor (PIL backend) and Qwen3-VL video
processor produce, in the same patch order: resize so both sides are multiples of
patch_size * merge_size with the pixel count inside [min_pixels, max_pixels] (aspect kept),
rescale by 1/255 (computed in f64, stored f32), normalise by mean/std, then cut into
patch x patch tiles grouped merge x merge, each row holding C * temporal_patch * patch *
patch values (channel outermost). An image repeats its one frame temporal_patch times; a
video pads its frame count to a multiple of temporal_patch with its last frame.
Row order: (t, h / merge, w / merge, merge_h, merge_w). Pure numpy + Pillow; thread-safe.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from PIL import Image

from ninfer_jax.errors import InvalidMedia

MAX_ASPECT_RATIO = 200  # the processors refuse anything more elongated


@dataclasses.dataclass(frozen=True)
class VisionProcessing:
    """The processor settings (Qwen3-VL / Qwen3.5 defaults); an artifact's vision
    component may carry its own under metadata["vision"]["processor"]."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_min_pixels: int = 65536  # preprocessor_config size.shortest_edge
    image_max_pixels: int = 16777216  # size.longest_edge
    video_min_pixels: int = 4096
    video_max_pixels: int = 25165824
    fps: float = 2.0  # frames sampled per second of video
    min_frames: int = 4
    max_frames: int = 768

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def row_size(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size ** 2

    @classmethod
    def from_metadata(cls, metadata: dict) -> "VisionProcessing":
        settings = ((metadata.get("vision") or {}).get("processor")) or {}
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()
                  if k in known}
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class Patches:
    pixel_values: np.ndarray  # [t*h*w, C*temporal_patch*patch*patch] float32
    grid_thw: tuple[int, int, int]  # in patches: temporal groups, rows, columns


def _check_aspect(height: int, width: int) -> None:
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise InvalidMedia(f"the image's aspect ratio {width}x{height} is more elongated than "
                           f"{MAX_ASPECT_RATIO}:1")


def image_size(height: int, width: int, p: VisionProcessing) -> tuple[int, int]:
    """Qwen2-VL's smart_resize: the (height, width) an image is resized to."""
    _check_aspect(height, width)
    factor = p.factor
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > p.image_max_pixels:
        beta = math.sqrt(height * width / p.image_max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < p.image_min_pixels:
        beta = math.sqrt(p.image_min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def video_size(num_frames: int, height: int, width: int,
               p: VisionProcessing) -> tuple[int, int]:
    """Qwen3-VL's video smart_resize (the pixel bounds count every sampled frame)."""
    factor, temporal = p.factor, p.temporal_patch_size
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    _check_aspect(height, width)
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(num_frames / temporal) * temporal
    if t_bar * h_bar * w_bar > p.video_max_pixels:
        beta = math.sqrt(num_frames * height * width / p.video_max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < p.video_min_pixels:
        beta = math.sqrt(p.video_min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def sample_indices(total_frames: int, video_fps: float | None, p: VisionProcessing) -> np.ndarray:
    """Qwen3-VL's frame sampling: `fps` frames per second within [min, max] frames (never
    more than the video has), spread evenly over the whole video."""
    video_fps = video_fps or 24.0
    count = int(total_frames / video_fps * p.fps)
    count = min(max(count, p.min_frames), p.max_frames, total_frames)
    return np.linspace(0, total_frames - 1, count).round().astype(int)


def _normalised(rgb: np.ndarray, height: int, width: int, p: VisionProcessing) -> np.ndarray:
    """One uint8 [H, W, 3] frame resized (PIL bicubic), rescaled and normalised: [3, h, w]."""
    resized = np.asarray(Image.fromarray(rgb).resize((width, height), Image.Resampling.BICUBIC))
    scaled = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.array(p.image_mean, dtype=np.float32)
    std = np.array(p.image_std, dtype=np.float32)
    return ((scaled - mean) / std).transpose(2, 0, 1)


def _patchify(frames: np.ndarray, p: VisionProcessing) -> Patches:
    """[T, C, H, W] float32 (T a multiple of temporal_patch) -> rows in processor order."""
    num_frames, channels, height, width = frames.shape
    m, ps, tp = p.merge_size, p.patch_size, p.temporal_patch_size
    grid_t, grid_h, grid_w = num_frames // tp, height // ps, width // ps
    tiles = frames.reshape(grid_t, tp, channels, grid_h // m, m, ps, grid_w // m, m, ps)
    tiles = tiles.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    rows = np.ascontiguousarray(tiles).reshape(grid_t * grid_h * grid_w,
                                               channels * tp * ps * ps)
    return Patches(rows, (grid_t, grid_h, grid_w))


def preprocess_image(rgb: np.ndarray, p: VisionProcessing) -> Patches:
    """uint8 [H, W, 3] -> one temporal group of patches (the frame repeated)."""
    height, width = image_size(rgb.shape[0], rgb.shape[1], p)
    frame = _normalised(rgb, height, width, p)
    return _patchify(np.repeat(frame[None], p.temporal_patch_size, axis=0), p)


def preprocess_video(frames: np.ndarray, p: VisionProcessing) -> Patches:
    """uint8 [T, H, W, 3] sampled frames -> patches, T padded with the last frame."""
    num_frames = frames.shape[0]
    height, width = video_size(num_frames, frames.shape[1], frames.shape[2], p)
    stack = np.stack([_normalised(frame, height, width, p) for frame in frames])
    if pad := -num_frames % p.temporal_patch_size:
        stack = np.concatenate([stack, np.repeat(stack[-1:], pad, axis=0)])
    return _patchify(stack, p)


def group_timestamps(indices: np.ndarray, video_fps: float | None,
                     p: VisionProcessing) -> tuple[float, ...]:
    """Seconds of each temporal group (the mean time of its first and last frame), as
    Qwen3-VL's processor writes them into the prompt."""
    video_fps = video_fps or 24.0
    frames = [int(i) for i in indices]
    tp = p.temporal_patch_size
    frames += [frames[-1]] * (-len(frames) % tp)
    times = [i / video_fps for i in frames]
    return tuple((times[g] + times[g + tp - 1]) / 2 for g in range(0, len(times), tp))
