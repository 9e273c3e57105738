"""Media bytes -> RGB pixels: images with Pillow, videos with PyAV (FFmpeg).

Images are converted to RGB as transformers does (alpha composited over white). A video is
sampled as Qwen3-VL's processor samples it (preprocess.sample_indices: `fps` frames per
second of the stream, within [min_frames, max_frames]) and only those frames are kept.
Every failure is `InvalidMedia` naming the request field; a picture or video larger than
`max_pixels` decoded pixels is `MediaBudgetExceeded` before its pixels are decoded.
"""
from __future__ import annotations

import dataclasses
import io
import warnings

import numpy as np
from PIL import Image

from ninfer_jax.errors import InvalidMedia, MediaBudgetExceeded
from ninfer_jax.serve.media.preprocess import VisionProcessing, sample_indices


@dataclasses.dataclass(frozen=True)
class DecodedVideo:
    frames: np.ndarray  # [T, H, W, 3] uint8, the sampled frames
    indices: np.ndarray  # [T] frame numbers in the stream
    fps: float | None  # the stream's average frame rate


def decode_image(data: bytes, *, max_pixels: int) -> np.ndarray:
    """uint8 [H, W, 3]."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise MediaBudgetExceeded(f"the image has {width}x{height} pixels, more than "
                                          f"the {max_pixels} a media item may decode to")
            image.load()
    except MediaBudgetExceeded:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as exc:
        raise InvalidMedia(f"the image could not be decoded ({exc})") from None
    if width < 1 or height < 1:
        raise InvalidMedia("the image is empty")
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return np.asarray(image.convert("RGB"))


def decode_video(data: bytes, processing: VisionProcessing, *, max_pixels: int) -> DecodedVideo:
    import av  # imported on first use: text-only servers never load FFmpeg

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise InvalidMedia("the video has no video stream")
            stream = container.streams.video[0]
            fps = float(stream.average_rate) if stream.average_rate else None
            frames, indices = _sampled_frames(container, stream, fps, processing, max_pixels)
    except (InvalidMedia, MediaBudgetExceeded):
        raise
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise InvalidMedia(f"the video could not be decoded ({exc})") from None
    return DecodedVideo(np.stack(frames), indices, fps)


def _sampled_frames(container, stream, fps, processing, max_pixels):
    """The sampled frames, decoding no further than the last one. A stream that does not
    state its frame count is decoded whole (bounded by `max_pixels` per kept frame set)."""
    total = stream.frames or 0
    wanted = sample_indices(total, fps, processing) if total > 0 else None
    keep = set(int(i) for i in wanted) if wanted is not None else None
    frames: dict[int, np.ndarray] = {}
    for number, frame in enumerate(container.decode(stream)):
        if keep is None or number in keep:
            frames[number] = frame.to_ndarray(format="rgb24")
            height, width = frames[number].shape[:2]
            if len(frames) * height * width > max_pixels:
                raise MediaBudgetExceeded(
                    f"the video's sampled frames ({width}x{height} pixels each) decode to "
                    f"more than the {max_pixels} pixels a media item may have")
        if wanted is not None and number >= wanted[-1]:
            break
    if not frames:
        raise InvalidMedia("the video has no frames")
    if wanted is None:
        wanted = sample_indices(len(frames), fps, processing)
    wanted = np.array([i for i in wanted if int(i) in frames])
    return [frames[int(i)] for i in wanted], wanted
