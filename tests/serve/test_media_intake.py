"""Media sources (data URIs, HTTP fetch from a local server), decoding (Pillow, PyAV), the
prepared-payload cache (LRU, live account, single-flight) and the intake's envelope."""
import base64
import hashlib
import io
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import av
import numpy as np
import pytest
from PIL import Image

from media_samples import file_server
from ninfer_jax.errors import (InvalidMedia, MediaBudgetExceeded, MediaFetchFailed,
                               MediaFetchTimeout, QueueTimeout)
from ninfer_jax.serve.media import cache as cache_mod
from ninfer_jax.serve.media import decode, sources
from ninfer_jax.serve.media.intake import MediaIntake
from ninfer_jax.serve.media.preprocess import VisionProcessing
from ninfer_jax.text.conversation import MediaPart

LIMITS = sources.SourceLimits(max_bytes=1 << 20, timeout_s=2.0)


def png(height=40, width=60, seed=0, mode="RGB") -> bytes:
    channels = {"RGB": 3, "RGBA": 4}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode).save(buffer, "PNG")
    return buffer.getvalue()


def mp4(num_frames=10, rate=4, width=64, height=48) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for n in range(num_frames):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), n * 20, np.uint8),
                                               format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def data_uri(blob: bytes, mime="image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(blob).decode()}"


def part(url, kind="image"):
    return MediaPart(kind, url, "messages[0].content[0].image_url.url", 0)


@pytest.fixture(scope="module")
def media_server():
    server = file_server({"/image.png": png(), "/slow.png": png(),
                          "/big.bin": b"x" * (LIMITS.max_bytes + 10)})
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


# ----------------------------------------------------------------------------- sources

def test_data_uri_base64_and_percent_encoded():
    blob = png()
    assert sources.acquire(part(data_uri(blob)), LIMITS) == blob
    assert sources.acquire(part("data:,a%20b"), LIMITS) == b"a b"


@pytest.mark.parametrize("url,fragment", [
    ("data:image/png;base64,@@@", "base64"),
    ("data:image/png;base64", "','"),
    ("data:video/mp4;base64,AAAA", "image/*"),
    ("ftp://example.com/x.png", "scheme 'ftp'"),
    ("just-a-name.png", "no scheme"),
    ("http:///nohost.png", "without a host"),
    ("data:image/png;base64,", "no bytes"),
])
def test_malformed_sources_are_invalid_media(url, fragment):
    with pytest.raises(InvalidMedia) as caught:
        sources.acquire(part(url), LIMITS)
    assert caught.value.param == "messages[0].content[0].image_url.url"
    assert caught.value.code == "invalid_media" and fragment in caught.value.message


def test_fetch_from_local_server(media_server):
    assert sources.acquire(part(f"{media_server}/image.png"), LIMITS) == png()


def test_fetch_failures_have_their_codes(media_server):
    with pytest.raises(MediaFetchFailed) as failed:
        sources.acquire(part(f"{media_server}/missing.png"), LIMITS)
    assert failed.value.status == 502 and "404" in failed.value.message
    with pytest.raises(MediaFetchTimeout) as slow:
        sources.acquire(part(f"{media_server}/slow.png"),
                        sources.SourceLimits(max_bytes=1 << 20, timeout_s=0.2))
    assert slow.value.status == 504 and slow.value.anthropic_type == "timeout_error"
    with pytest.raises(MediaBudgetExceeded):
        sources.acquire(part(f"{media_server}/big.bin"), LIMITS)
    with pytest.raises(MediaFetchFailed):  # nothing listens there
        sources.acquire(part("http://127.0.0.1:9/x.png"), LIMITS)


# ----------------------------------------------------------------------------- decoding

def test_decode_image_composites_alpha_over_white():
    rgba = np.zeros((4, 4, 4), np.uint8)  # fully transparent black
    buffer = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buffer, "PNG")
    rgb = decode.decode_image(buffer.getvalue(), max_pixels=100)
    assert rgb.shape == (4, 4, 3) and (rgb == 255).all()


def test_decode_image_refusals():
    with pytest.raises(InvalidMedia):
        decode.decode_image(b"not an image", max_pixels=1 << 20)
    with pytest.raises(InvalidMedia):
        decode.decode_image(png()[:60], max_pixels=1 << 20)  # truncated
    with pytest.raises(MediaBudgetExceeded):
        decode.decode_image(png(40, 60), max_pixels=40 * 60 - 1)


def test_decode_video_samples_like_qwen3_vl():
    video = decode.decode_video(mp4(num_frames=10, rate=4), VisionProcessing(),
                                max_pixels=1 << 24)
    # 10 frames at 4 fps = 2.5 s -> 2 fps gives 5, within [4, 768]
    assert video.fps == 4.0 and video.indices.tolist() == [0, 2, 4, 7, 9]
    assert video.frames.shape == (5, 48, 64, 3)
    assert abs(int(video.frames[3].mean()) - 7 * 20) <= 3  # the frame sampled is frame 7
    with pytest.raises(InvalidMedia):
        decode.decode_video(b"\x00" * 100, VisionProcessing(), max_pixels=1 << 24)
    with pytest.raises(MediaBudgetExceeded):
        decode.decode_video(mp4(), VisionProcessing(), max_pixels=48 * 64 * 3)


# ----------------------------------------------------------------------------- cache

class _Payload:
    def __init__(self, nbytes):
        self.nbytes = nbytes


def _ready(payload) -> Future:
    future = Future()
    future.set_result(payload)
    return future


def test_cache_hits_lru_and_live_account():
    cache = cache_mod.PayloadCache(cache_bytes=250, live_bytes=400)
    a = cache.lease(("a", "image"), lambda: _ready(_Payload(100)))
    b = cache.lease(("b", "image"), lambda: _ready(_Payload(100)))
    assert (a.outcome, b.outcome) == ("miss", "miss")
    again = cache.lease(("a", "image"), lambda: pytest.fail("a hit builds nothing"))
    assert again.outcome == "hit" and again.payload is a.payload
    c = cache.lease(("c", "image"), lambda: _ready(_Payload(100)))  # evicts b (LRU)
    assert cache.retained_bytes == 200 and cache.stats["evictions"] == 1
    # b was evicted while leased: still live until released
    assert cache.live_bytes_used == 300
    b.release()
    b.release()  # idempotent
    assert cache.live_bytes_used == 200
    with pytest.raises(MediaBudgetExceeded):  # 200 live, all leased: no room for 300
        cache.lease(("d", "image"), lambda: _ready(_Payload(300)))
    for lease in (a, again, c):
        lease.release()
    # evicts unleased entries, oldest first, until it fits: a goes, c stays
    d = cache.lease(("d", "image"), lambda: _ready(_Payload(300)))
    assert d.outcome == "miss" and cache.live_bytes_used == 400
    assert cache.retained_bytes == 100
    # Too big to retain (over --media-cache-mib): live while leased, gone after
    d.release()
    assert cache.live_bytes_used == 100


def test_cache_off_still_shares_live_payloads():
    cache = cache_mod.PayloadCache(cache_bytes=0, live_bytes=1000)
    first = cache.lease(("a", "image"), lambda: _ready(_Payload(100)))
    second = cache.lease(("a", "image"), lambda: pytest.fail("live payload is shared"))
    assert second.payload is first.payload and cache.live_bytes_used == 100
    first.release()
    second.release()
    assert cache.live_bytes_used == 0
    third = cache.lease(("a", "image"), lambda: _ready(_Payload(100)))
    assert third.outcome == "miss"


def test_concurrent_identical_misses_build_once():
    cache = cache_mod.PayloadCache(cache_bytes=1000, live_bytes=1000)
    builds, gate = [], threading.Event()
    pool = ThreadPoolExecutor(4)

    def build():
        builds.append(1)
        return pool.submit(lambda: (gate.wait(5), _Payload(10))[1])

    with ThreadPoolExecutor(4) as callers:
        leases = [callers.submit(cache.lease, ("same", "image"), build) for _ in range(4)]
        time.sleep(0.1)
        gate.set()
        outcomes = sorted(lease.result().outcome for lease in leases)
    assert len(builds) == 1 and outcomes == ["joined", "joined", "joined", "miss"]
    assert len({id(lease.result().payload) for lease in leases}) == 1
    pool.shutdown()


def test_failed_build_reaches_every_waiter_and_is_not_cached():
    cache = cache_mod.PayloadCache(cache_bytes=1000, live_bytes=1000)
    future = Future()
    future.set_exception(InvalidMedia("bad bytes"))
    with pytest.raises(InvalidMedia):
        cache.lease(("x", "image"), lambda: future)
    assert cache.lease(("x", "image"), lambda: _ready(_Payload(1))).outcome == "miss"


# ----------------------------------------------------------------------------- intake

@pytest.fixture(scope="module")
def intake():
    service = MediaIntake(VisionProcessing(), cache_mib=64, live_mib=128, threads=2,
                          max_source_bytes=1 << 20)
    yield service
    service.close()


def test_intake_prepares_digests_and_reuses(intake):
    blob = png(seed=5)
    image = part(data_uri(blob))
    batch = intake.prepare([image, image])
    assert batch.outcomes == {"hit": 0, "miss": 1, "joined": 1}
    first = batch.items[0]
    assert first is batch.items[1] and not first.pixel_values.flags.writeable
    assert first.digest == hashlib.sha256(blob).hexdigest()
    # 40x60 -> at least 65536 pixels: 224 x 320 -> 14 x 20 patches -> 70 tokens each
    assert first.grid_thw == (1, 14, 20) and batch.num_tokens == 140
    assert first.pixel_values.shape == (280, 1536)
    again = intake.prepare([image])
    assert again.outcomes["hit"] == 1
    batch.release()
    again.release()


def test_intake_video_layout(intake):
    batch = intake.prepare([part(data_uri(mp4(), "video/mp4"), "video")])
    (item,) = batch.items
    assert item.kind == "video" and item.grid_thw[0] == 3  # 5 frames padded to 6
    layout = item.layout()
    assert layout.num_groups == 3 and layout.timestamps == pytest.approx((0.25, 1.375, 2.25))
    batch.release()


def test_intake_failure_names_the_field_and_releases(intake):
    good = part(data_uri(png(seed=9)))
    bad = MediaPart("image", data_uri(b"garbage"), "input[0].content[1].image_url", 0)
    live = intake.cache.live_bytes_used
    with pytest.raises(InvalidMedia) as caught:
        intake.prepare([good, bad])
    assert caught.value.param == "input[0].content[1].image_url"
    assert intake.cache.live_bytes_used <= live + 280 * 1536 * 4  # only the cached good one


def test_intake_live_budget_is_media_budget_exceeded():
    small = MediaIntake(VisionProcessing(), cache_mib=0, live_mib=1, threads=1,
                        max_source_bytes=1 << 20)
    with pytest.raises(MediaBudgetExceeded) as caught:
        small.prepare([part(data_uri(png()))])  # 280 x 1536 f32 rows: 1.6 MiB
    assert caught.value.code == "media_budget_exceeded"
    small.close()


def test_preparation_gate_waits_until_the_deadline():
    gated = MediaIntake(VisionProcessing(), cache_mib=0, live_mib=1, threads=1,
                        max_source_bytes=1 << 20)
    assert gated.num_gates == 1
    gated._gate.acquire()  # another request is preparing
    try:
        started = time.monotonic()
        with pytest.raises(QueueTimeout):
            gated.prepare([part(data_uri(png()))], deadline=started + 0.1)
        assert time.monotonic() - started >= 0.1
    finally:
        gated._gate.release()
        gated.close()
