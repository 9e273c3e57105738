"""Media through the real engine path: a tiny random Qwen3-VL-shaped model (MRoPE text body,
a tower with deepstack taps; sharpened, tests/vision_models.py, so that its text depends on
the image) served by the JaxRunner with vision on, driven by the scheduler.

The greedy text of prompts holding images and a two-frame video, prefilled in chunks of 16
that cut through the media spans and decoded with the MRoPE offset, must equal a one-shot
reference: the tower over all items at once (no buckets) and the multimodal prefill over the
whole sequence, argmax, one call per generated token. Then prefix reuse: a repeated media
prompt reuses its pages (and skips the encode) with the same text, while a different image of
the same size shares only the pages before its first placeholder. Batched media and text
streams equal each stream alone. One runner (one set of compiled shapes) serves the module.
"""
from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params, random_vision_params
from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.engine import Engine
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import (
    GenerationRequest, MediaInput, RequestHandle, SamplingParams,
)
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.step_loop import StepLoop
from ninfer_jax.engine.vision_rows import MAX_FRAME_PATCHES
from ninfer_jax.errors import MediaBudgetExceeded
from ninfer_jax.model import llama, multimodal
from ninfer_jax.model.vision import grid, mrope, tower
from vision_models import sharpen

VOCAB, PAGE, CONTEXT, LANES, CHUNK = 512, 4, 128, 4, 16
IMAGE, VIDEO, START, END = 500, 501, 502, 503  # placeholder and delimiter ids of this test
GREEDY = SamplingParams(temperature=0.0)
MAX_TOKENS = 6
IMAGE_GRID, VIDEO_GRID = (1, 4, 6), (2, 4, 4)  # 6 image tokens; 2 frames of 4 tokens


@pytest.fixture(scope="module", autouse=True)
def _full_precision():
    with jax.default_matmul_precision("highest"):  # no TF32 rounding when run on a GPU
        yield


@pytest.fixture(scope="module")
def model():
    preset = PRESETS["qwen3-vl-tiny"]
    config = dataclasses.replace(preset.config, vocab_size=VOCAB,
                                 max_position_embeddings=CONTEXT)
    vision = dataclasses.replace(preset.vision, image_token_id=IMAGE, video_token_id=VIDEO,
                                 vision_start_token_id=START, vision_end_token_id=END)
    params = sharpen(random_params(config, seed=5, dtype="f32"))
    params["vision"] = random_vision_params(vision, seed=6, dtype="f32")
    artifact = types.SimpleNamespace(config=config, params=params, vision_config=vision)
    runner = JaxRunner(artifact, num_pages=96, page_size=PAGE, max_batch=LANES,
                       max_context=CONTEXT, prefill_chunk=CHUNK, step_shapes="essential",
                       dtype=jnp.float32, vision=True)
    runner.warmup()
    return types.SimpleNamespace(runner=runner, config=config, vision=vision, params=params)


def pixels(grid_thw, seed, vision):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((grid.num_patches([grid_thw]), vision.patch_dim)).astype(
        np.float32)


def media_request(name, *, image_seed=1, video=True, salt=0, vision, max_tokens=MAX_TOKENS):
    """text, an image, text, (a two-frame video with a timestamp before each frame,) text."""
    rng = np.random.default_rng(100 + salt)
    text = lambda n: rng.integers(1, 400, n).tolist()  # noqa: E731
    ids, items = text(9), []

    def place(kind, grid_thw, seed, runs):
        spans = []
        for length in runs:
            ids.extend(text(2) if kind == "video" else [])
            ids.append(START)
            spans.append((len(ids), length))
            ids.extend([IMAGE if kind == "image" else VIDEO] * length)
            ids.append(END)
        items.append(MediaInput(kind, f"{kind}-{seed}", grid_thw, tuple(spans),
                                pixels(grid_thw, seed, vision)))

    place("image", IMAGE_GRID, image_seed, [6])
    ids.extend(text(5))
    if video:
        place("video", VIDEO_GRID, 7, [4, 4])
    ids.extend(text(4))
    return GenerationRequest(name, ids, GREEDY, max_tokens, media=tuple(items))


def text_request(name, length=23, salt=50):
    ids = np.random.default_rng(salt).integers(1, 400, length).tolist()
    return GenerationRequest(name, ids, GREEDY, MAX_TOKENS)


def generate(runner, requests, *, together=True, reuse=True, num_pages=None, stats=None):
    """(cache_n, output ids, counters) per request, run through a fresh scheduler on `runner`
    (a pool of `num_pages`, default the runner's); `stats` gets the scheduler's counters."""
    config = EngineConfig(max_concurrency=LANES, prefill_chunk=CHUNK, max_context=CONTEXT,
                          prefix_reuse=reuse)
    scheduler = Scheduler(config, PagePool(num_pages or runner.num_pages), page_size=PAGE,
                          max_batch=runner.max_batch)
    loop = StepLoop(scheduler, runner)
    handles = []
    for request in requests:
        handles.append(RequestHandle(dataclasses.replace(request)))
        scheduler.add(handles[-1])
        if not together:
            _run(scheduler, loop)
    _run(scheduler, loop)
    if stats is not None:
        stats.append(scheduler.counters)
    results = []
    for handle in handles:
        events = []
        while (event := handle.next_event(timeout=0)) is not None:
            events.append(event)
        assert events[-1].reason == "length", events[-1]
        results.append((events[0].cache_n, list(events[-1].output_ids), events[-1].counters))
    return results


def _run(scheduler, loop) -> None:
    for _ in range(10_000):
        scheduler.apply_controls()
        if not loop.advance() and not scheduler.has_work():
            loop.drain()
            return
    raise AssertionError("the scheduler did not finish")


def reference_output(model, request) -> list[int]:
    """Greedy tokens from whole-sequence forwards: every item encoded in one pass, the
    prompt's MRoPE positions from mrope.rope_positions, one prefill call per token."""
    vision, config = model.vision, model.config
    images = [m for m in request.media if m.kind == "image"]
    videos = [m for m in request.media if m.kind == "video"]
    ordered = images + videos  # the order their placeholder runs take features in
    all_pixels = np.concatenate([m.pixel_values for m in ordered])
    embeds, deepstack = tower.encode(model.params["vision"], grid.vision_inputs(
        all_pixels, [m.grid_thw for m in ordered], vision), config=vision)
    tokens = list(request.prompt_ids)
    types_ = mrope.token_types(tokens, vision)
    positions, delta = mrope.rope_positions(types_, [m.grid_thw for m in images],
                                            [m.grid_thw for m in videos], vision)
    length = len(tokens) + MAX_TOKENS
    is_media = jnp.asarray(np.pad(types_ != mrope.TEXT, (0, MAX_TOKENS)))
    rows = multimodal.place(is_media, embeds)
    taps = jax.vmap(lambda f: multimodal.place(is_media, f))(deepstack)
    tail = np.arange(len(tokens), length) + delta
    rope = np.concatenate([positions, np.broadcast_to(tail, (3, MAX_TOKENS))], axis=1)
    media = multimodal.MediaRows(jnp.asarray(rope, jnp.int32), rows, is_media, taps)
    text_params = {k: v for k, v in model.params.items() if k != "vision"}
    shape = llama.cache_shapes(config, num_pages=length // PAGE + 2, page_size=PAGE,
                               num_state_slots=0, dtype=jnp.float32, kv_dtype=jnp.float32)
    table = np.arange(1, length // PAGE + 2, dtype=np.int32)
    out = []
    for _ in range(MAX_TOKENS):
        padded = np.zeros(length, np.int32)
        padded[:len(tokens)] = tokens
        kv = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape)
        logits, _ = PREFILL(text_params, kv, padded, np.int32(0), np.int32(len(tokens)),
                            table, media=media, config=config, page_size=PAGE)
        tokens.append(int(jnp.argmax(logits)))
        out.append(tokens[-1])
    return out


PREFILL = jax.jit(llama.prefill, static_argnames=("config", "page_size"))


def test_greedy_media_text_equals_the_one_shot_forward(model):
    request = media_request("a", vision=model.vision)
    (cache_n, output, counters), = generate(model.runner, [request], reuse=False)
    assert output == reference_output(model, request)
    assert counters["vision_items"] == 2 and counters["vision_seconds"] > 0
    other = media_request("b", image_seed=2, vision=model.vision)
    (_, other_output, _), = generate(model.runner, [other], reuse=False)
    assert other_output != output  # the image decides the text: it is not ignored


def test_prefix_reuse_needs_the_same_media(model):
    runner = model.runner
    first = media_request("a", vision=model.vision)
    same = media_request("a2", vision=model.vision)
    other = media_request("b", image_seed=2, vision=model.vision)
    alone = [generate(runner, [r], reuse=False)[0][1] for r in (first, other)]
    encoded = runner.vision.items_encoded
    results = generate(runner, [first, same, other], together=False)
    (first_n, first_out, _), (same_n, same_out, same), (other_n, other_out, _) = results
    image_start = first.media[0].spans[0][0]
    assert first_n == 0 and same_n == (len(first.prompt_ids) - 1) // PAGE * PAGE
    assert same_out == first_out == alone[0]
    # The repeat encodes nothing: both its items lie in the reused pages.
    assert runner.vision.items_encoded == encoded + 4 and same["vision_items"] == 0
    # The other image has the same grid, hence the same pad tokens: only the pages before
    # its first placeholder may come from the cache.
    assert other_n == image_start // PAGE * PAGE
    assert other_out == alone[1]


def test_batched_media_and_text_streams_equal_each_alone(model):
    requests = [media_request("a", vision=model.vision),
                media_request("b", image_seed=3, video=False, salt=1, vision=model.vision),
                text_request("t")]
    alone = [generate(model.runner, [r], reuse=False)[0][1] for r in requests]
    together = generate(model.runner, requests, reuse=False)
    assert [out for _, out, _ in together] == alone


def test_pauses_replay_media_prompts_without_changing_text(model):
    """A pool too small for three media prompts decoding at once: paused sequences come back
    by replay, whose chunks (past the prompt too) re-encode the items they hold."""
    requests = [media_request(f"p{i}", image_seed=40 + i, salt=i, vision=model.vision,
                              max_tokens=24) for i in range(3)]
    alone = [generate(model.runner, [r], reuse=False)[0][1] for r in requests]
    encoded, stats = model.runner.vision.items_encoded, []
    squeezed = generate(model.runner, requests, reuse=False, num_pages=26, stats=stats)
    assert stats[0].preemptions > 0 and stats[0].replayed_tokens > 0
    assert model.runner.vision.items_encoded > encoded + 6  # the replays encoded again
    assert [out for _, out, _ in squeezed] == alone


def test_frames_in_separate_tower_calls_give_the_same_text(model):
    """With a 16-patch call budget the image (24 patches) and each video frame (16) encode
    in calls of their own, and chunks gather across them: the text is unchanged."""
    request = media_request("a", vision=model.vision)
    joint = generate(model.runner, [request], reuse=False)[0][1]
    vision = model.runner.vision
    vision.encode_patches, default = 16, vision.encode_patches
    try:
        split = generate(model.runner, [request], reuse=False)[0][1]
    finally:
        vision.encode_patches = default
    assert split == joint


def test_frames_over_the_tower_limit_are_refused_at_submit(model):
    """A frame past MAX_FRAME_PATCHES would need the dense attention's scores of more than
    the device holds: media_budget_exceeded, before anything runs."""
    engine = Engine(model.runner, EngineConfig(max_concurrency=LANES, max_context=CONTEXT))
    request = media_request("big", video=False, vision=model.vision)
    side = int(MAX_FRAME_PATCHES ** 0.5) + 2  # even, so the merge still divides it
    huge = dataclasses.replace(request.media[0], grid_thw=(1, side, side))
    with pytest.raises(MediaBudgetExceeded, match="patches per frame"):
        engine.submit(dataclasses.replace(request, media=(huge,)))
