"""Media intake of one HTTP worker: acquire, digest, decode + preprocess on a bounded pool,
cache, and check the request's vision budgets.

`MediaIntake.prepare(parts)` turns a conversation's MediaParts (prompt order) into a
`MediaBatch`: one leased `PreparedMedia` per part and the request-level counters the
request log reports. Acquisition (data URI decode, HTTP fetch) runs on the calling HTTP
thread; each cache miss is one decode -> resize -> patch task on the worker pool
(--media-preprocess-threads), so a request's items are prepared in parallel and no more
than that many run at once in the worker. The batch's leases keep its payloads live until
`release()` (the request's end); a failure releases what was already leased.

Preparation gate: builds hold their arrays before the live account sees them, so at most
`--media-live-mib` / MAX_REQUEST_PAYLOAD_BYTES requests (at least one) prepare at a time;
the others wait, until their admission deadline (then request_queue_timeout).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ninfer_jax.errors import MediaBudgetExceeded, NinferError, QueueTimeout
from ninfer_jax.serve.media import decode, preprocess, sources
from ninfer_jax.serve.media.cache import Lease, PayloadCache
from ninfer_jax.serve.media.preprocess import VisionProcessing
from ninfer_jax.text.conversation import MediaPart
from ninfer_jax.text.media_prompt import MediaLayout

MIB = 1 << 20
MAX_POOL_THREADS = 16  # --media-preprocess-threads 0: at most this many
# The vision runtime's envelope per request (spec: 32,768 merged tokens, 131,072 patches).
MAX_VISION_TOKENS = 32768
MAX_RAW_PATCHES = 131072
MAX_DECODED_PIXELS = 1 << 28  # one item's decoded pixels (all sampled frames of a video)
# The most prepared bytes one request can hold: the patch envelope in f32 rows of 1,536.
MAX_REQUEST_PAYLOAD_BYTES = MAX_RAW_PATCHES * 1536 * 4


@dataclasses.dataclass(frozen=True)
class PreparedMedia:
    """One prepared media item: immutable, shared by every request that shows these bytes."""

    kind: str  # "image" | "video"
    digest: str  # SHA-256 hex of the acquired bytes
    pixel_values: np.ndarray  # [num_patches, C*temporal_patch*patch*patch] float32, read-only
    grid_thw: tuple[int, int, int]
    timestamps: tuple[float, ...]  # video: seconds of each temporal group
    merge_size: int

    @property
    def nbytes(self) -> int:
        return self.pixel_values.nbytes

    @property
    def num_patches(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w

    def layout(self) -> MediaLayout:
        t, h, w = self.grid_thw
        return MediaLayout(self.kind, t, h * w // self.merge_size ** 2, self.timestamps)


@dataclasses.dataclass
class MediaBatch:
    items: list[PreparedMedia]
    leases: list[Lease]
    source_bytes: int = 0
    wall_s: float = 0.0  # acquisition + preparation, as the request waited for it
    work_s: float = 0.0  # summed preprocessing time of this request's own builds

    @property
    def outcomes(self) -> dict[str, int]:
        counts = {"hit": 0, "miss": 0, "joined": 0}
        for lease in self.leases:
            counts[lease.outcome] += 1
        return counts

    @property
    def num_tokens(self) -> int:
        return sum(item.layout().num_tokens for item in self.items)

    def release(self) -> None:
        for lease in self.leases:
            lease.release()


def pool_threads(configured: int) -> int:
    return configured or max(1, min(MAX_POOL_THREADS, os.cpu_count() or 1))


class MediaIntake:
    def __init__(self, processing: VisionProcessing, *, cache_mib: int, live_mib: int,
                 threads: int, max_source_bytes: int,
                 fetch_timeout_s: float = sources.FETCH_TIMEOUT_S):
        self.processing = processing
        self.cache = PayloadCache(cache_mib * MIB, live_mib * MIB)
        self.limits = sources.SourceLimits(max_source_bytes, fetch_timeout_s)
        self.threads = pool_threads(threads)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="media")
        self.num_gates = max(1, live_mib * MIB // MAX_REQUEST_PAYLOAD_BYTES)
        self._gate = threading.BoundedSemaphore(self.num_gates)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def prepare(self, parts: list[MediaPart], deadline: float | None = None) -> MediaBatch:
        """`deadline` (monotonic): the latest time to start preparing (None: wait)."""
        started = time.monotonic()
        timeout = None if deadline is None else max(0.0, deadline - started)
        if not self._gate.acquire(timeout=timeout):
            raise QueueTimeout("The request waited past its admission deadline for media "
                               "preparation.")
        try:
            return self._prepare(parts, started)
        finally:
            self._gate.release()

    def _prepare(self, parts: list[MediaPart], started: float) -> MediaBatch:
        batch = MediaBatch([], [])
        try:
            blobs = [sources.acquire(part, self.limits) for part in parts]
            batch.source_bytes = sum(len(blob) for blob in blobs)
            work: list[float] = []
            pending = []
            for part, blob in zip(parts, blobs):
                key = (hashlib.sha256(blob).hexdigest(), part.kind)
                pending.append(self.cache.begin(key, lambda p=part, b=blob, k=key: (
                    self._pool.submit(self._build, p, b, k[0], work))))
            failure = None
            for finish in pending:  # every build is waited for, so none outlives a failure
                try:
                    lease = finish()
                except Exception as exc:
                    failure = failure or exc
                    continue
                batch.leases.append(lease)
                batch.items.append(lease.payload)
            if failure is not None:
                raise failure
            batch.work_s = sum(work)
            _check_envelope(batch)
        except BaseException:
            batch.release()
            raise
        batch.wall_s = time.monotonic() - started
        return batch

    def _build(self, part: MediaPart, blob: bytes, digest: str, work: list) -> PreparedMedia:
        started = time.monotonic()
        try:
            return _with_param(part, lambda: self._prepare_one(part.kind, blob, digest))
        finally:
            work.append(time.monotonic() - started)

    def _prepare_one(self, kind: str, blob: bytes, digest: str) -> PreparedMedia:
        p = self.processing
        if kind == "image":
            patches = preprocess.preprocess_image(
                decode.decode_image(blob, max_pixels=MAX_DECODED_PIXELS), p)
            timestamps = ()
        else:
            video = decode.decode_video(blob, p, max_pixels=MAX_DECODED_PIXELS)
            patches = preprocess.preprocess_video(video.frames, p)
            timestamps = preprocess.group_timestamps(video.indices, video.fps, p)
        patches.pixel_values.setflags(write=False)
        return PreparedMedia(kind, digest, patches.pixel_values, patches.grid_thw, timestamps,
                             p.merge_size)


def _with_param(part: MediaPart, work):
    """Errors raised while preparing a part name its field."""
    try:
        return work()
    except NinferError as exc:
        if exc.param is None:
            exc.param = part.param
            exc.message = f"'{part.param}': {exc.message}"
            exc.args = (exc.message,)
        raise


def _check_envelope(batch: MediaBatch) -> None:
    patches = sum(item.num_patches for item in batch.items)
    tokens = batch.num_tokens
    if tokens > MAX_VISION_TOKENS or patches > MAX_RAW_PATCHES:
        raise MediaBudgetExceeded(
            f"the request's media need {tokens} vision tokens ({patches} patches); the vision "
            f"runtime takes at most {MAX_VISION_TOKENS} tokens ({MAX_RAW_PATCHES} patches) "
            "per request")


def from_config(config, metadata: dict) -> MediaIntake:
    """The worker's intake from ServeConfig (--media-*, --max-request-mib caps one item's
    source bytes) and the artifact's processor settings."""
    return MediaIntake(VisionProcessing.from_metadata(metadata),
                       cache_mib=config.media_cache_mib, live_mib=config.media_live_mib,
                       threads=config.media_preprocess_threads,
                       max_source_bytes=config.max_request_mib * MIB)
