"""Qwen VL preprocessing against transformers' own processors (Qwen2-VL image processor,
PIL backend; Qwen3-VL video processor pieces: its resize rule, frame sampling, patch order,
timestamps), at tiny sizes so the grid runs in well under a second."""
import importlib
import types

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

from ninfer_jax.errors import InvalidMedia
from ninfer_jax.serve.media import preprocess as pp

# The module itself (the package's lazy attribute is a stand-in without torchvision, which
# only its decoding and resizing need; the pieces compared here are plain torch/Python).
hf_video = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl")

SMALL = pp.VisionProcessing(image_min_pixels=32 * 32 * 4, image_max_pixels=32 * 32 * 64,
                            video_min_pixels=32 * 32 * 2, video_max_pixels=32 * 32 * 48)


@pytest.fixture(scope="module")
def hf_images():
    return Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
        image_std=[0.5] * 3, min_pixels=SMALL.image_min_pixels,
        max_pixels=SMALL.image_max_pixels)


@pytest.mark.parametrize("height,width", [(37, 91), (300, 200), (64, 64), (500, 40), (17, 23),
                                          (1000, 1000)])
def test_image_matches_transformers_exactly(hf_images, height, width):
    rgb = np.random.default_rng(height * width).integers(0, 256, (height, width, 3), np.uint8)
    ours = pp.preprocess_image(rgb, SMALL)
    ref = hf_images(images=Image.fromarray(rgb), return_tensors="np")
    assert list(ours.grid_thw) == ref["image_grid_thw"][0].tolist()
    assert ours.pixel_values.dtype == np.float32
    np.testing.assert_array_equal(ours.pixel_values, ref["pixel_values"])


def test_image_clip_statistics(hf_images):
    # Qwen2-VL's own mean/std (CLIP) also follow the processor exactly.
    clip = pp.VisionProcessing(patch_size=14, image_mean=(0.48145466, 0.4578275, 0.40821073),
                               image_std=(0.26862954, 0.26130258, 0.27577711),
                               image_min_pixels=28 * 28 * 4, image_max_pixels=28 * 28 * 40)
    reference = Qwen2VLImageProcessorPil(min_pixels=clip.image_min_pixels,
                                         max_pixels=clip.image_max_pixels)
    rgb = np.random.default_rng(3).integers(0, 256, (150, 97, 3), np.uint8)
    ours = pp.preprocess_image(rgb, clip)
    ref = reference(images=Image.fromarray(rgb), return_tensors="np")
    assert list(ours.grid_thw) == ref["image_grid_thw"][0].tolist()
    np.testing.assert_array_equal(ours.pixel_values, ref["pixel_values"])


@pytest.mark.parametrize("frames,height,width", [(4, 48, 64), (7, 30, 90), (16, 200, 120),
                                                 (2, 10, 300)])
def test_video_resize_rule_matches(frames, height, width):
    expected = hf_video.smart_resize(frames, height, width, temporal_factor=2, factor=32,
                                     min_pixels=SMALL.video_min_pixels,
                                     max_pixels=SMALL.video_max_pixels)
    assert pp.video_size(frames, height, width, SMALL) == expected


@pytest.mark.parametrize("total,fps", [(10, 4.0), (300, 30.0), (3, 24.0), (5000, 25.0),
                                       (48, None)])
def test_frame_sampling_matches(total, fps):
    fake_self = types.SimpleNamespace(fps=2, min_frames=4, max_frames=768)
    metadata = types.SimpleNamespace(total_num_frames=total, fps=fps)
    expected = hf_video.Qwen3VLVideoProcessor.sample_frames(fake_self, metadata)
    np.testing.assert_array_equal(pp.sample_indices(total, fps, pp.VisionProcessing()),
                                  expected)


@pytest.mark.parametrize("indices", [[0, 3, 6, 9, 12], [0, 10, 20, 30], [5]])
def test_timestamps_match(indices):
    expected = Qwen3VLProcessor._calculate_timestamps(None, list(indices), 4.0, 2)
    got = pp.group_timestamps(np.array(indices), 4.0, pp.VisionProcessing())
    assert got == pytest.approx(expected, abs=0)


@pytest.mark.parametrize("frames", [3, 4])
def test_video_patches_match_transformers(frames):
    """Frames already at the resized size (the resize is the identity in both): our
    normalisation, temporal padding and patch order against the video processor's patchify
    over its own rescale/normalise (fused in f32: equal within 1e-6)."""
    rng = np.random.default_rng(frames)
    video = rng.integers(0, 256, (frames, 64, 96, 3), np.uint8)
    processing = pp.VisionProcessing(video_min_pixels=1, video_max_pixels=1 << 30)
    assert pp.video_size(frames, 64, 96, processing) == (64, 96)
    ours = pp.preprocess_video(video, processing)
    tensor = torch.from_numpy(video).permute(0, 3, 1, 2)[None].float()
    normalised = (tensor * (1 / 255) - 0.5) / 0.5
    rows, t, h, w = hf_video.Qwen3VLVideoProcessor.patchify(
        None, normalised, patch_size=16, merge_size=2, temporal_patch_size=2)
    assert ours.grid_thw == (t, h, w) == ((frames + 1) // 2, 4, 6)
    np.testing.assert_allclose(ours.pixel_values, rows[0].numpy(), rtol=0, atol=1e-6)


def test_elongated_image_is_invalid_media():
    with pytest.raises(InvalidMedia):
        pp.preprocess_image(np.zeros((1, 300, 3), np.uint8), SMALL)


def test_processor_settings_from_metadata():
    p = pp.VisionProcessing.from_metadata(
        {"vision": {"processor": {"patch_size": 14, "image_mean": [0.1, 0.2, 0.3]}}})
    assert p.patch_size == 14 and p.image_mean == (0.1, 0.2, 0.3) and p.merge_size == 2
    assert pp.VisionProcessing.from_metadata({}) == pp.VisionProcessing()
