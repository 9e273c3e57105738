"""The text weights read, fused, cast and placed on one device as a pipeline.

Start-up used to run three stages one after another over the whole tree (H200, Qwen3-8B,
run 30: orbax restore 7.3 s, q|k|v and gate|up joined on the host 3.2 s, one device_put
5.3 s). Here the stored tree is cut in parts (weights_io.split_parts: the embedding and the
other top-level entries alone, then runs of layers of at least `part_bytes`) and each of
`workers` threads takes the next part through every stage:

    read      orbax restores only that part's arrays (weights_io.restore_part) to numpy
    quantize  (`quantize`: ninfer serve --weights) the float projections in that format
    cast      floats in the compute dtype, on the host (steps.cast_leaves, as before)
    put       one device_put of the part, waited for (so at most `workers` parts are on the
              host at once, and `workers` transfers are in flight); `via_pinned`: copied
              into pinned host memory first, then sent from there
    fuse      q|k|v and gate|up joined on the device (`device_fuse`, the default on an
              accelerator: fuse_layer on placed leaves, a jnp.concatenate per group; the
              parts are freed with their last reference); or on the host before the cast,
              as runner.place_params does (the default on the CPU)

so while one part is read another is cast and a third is sent: the whole takes about as
long as the slowest stage, not the sum. Tensorstore's reads (and the checksums' hashlib
beside them), numpy's copies and device_put release the GIL for their bulk work; orbax's own
Python (~20-40 ms a call) does not, hence parts of at least `part_bytes`. Every stage is the one the sequential
path runs (the same cast, the same fuse_layer; a join is exact on either side), so the tree
equals runner.place_params(load_artifact(...).params) leaf for leaf
(tests/engine/test_weight_pipeline.py).

Device memory: the placed tree plus, with device_fuse, the separate parts of at most
`workers` parts' layers while they are joined. Host memory: at most `workers` parts at once
(the sequential path held the whole numpy tree and its fused copy). An orbax without
PLACEHOLDER restores the tree in one part (one worker; nothing overlaps).

The first error (a part's read, a transfer) cancels the parts not yet started and is raised
once the running ones stop; a failed read is retried once as one whole restore
(`place_in_parts`). Threads: the caller's thread waits; the workers are this call's.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import threading
from typing import Any, Callable

import jax

from ninfer_jax.artifact import convert_common, weights_io
from ninfer_jax.errors import ArtifactError
from ninfer_jax.model import fused_projections, steps

log = logging.getLogger("ninfer_jax.engine.weight_pipeline")

# H200 figures decide these (benchmarks/startup_probe.py times the alternatives).
DEFAULT_WORKERS = 6
# A restore call costs ~20-40 ms of Python (orbax's tree handling) besides its reads: parts
# of at least this size keep that small (Qwen3-8B: a layer is 0.4 GB, so a layer a part).
DEFAULT_PART_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    workers: int = DEFAULT_WORKERS
    part_bytes: int = DEFAULT_PART_BYTES
    # False: joined on the host, before the cast; None: on the device unless the device is
    # the CPU (whose "device" memory is host memory: no host copy to save there)
    device_fuse: bool | None = None
    # each part copied into pinned host memory first (threads copy in parallel), then sent
    # from there (a DMA, no driver staging of pageable memory); off: one device_put from numpy
    via_pinned: bool = False
    # `ninfer serve --weights`: the float projection matrices quantized on the host as each
    # part is read, before the join (convert_common.quantize_projections, what `ninfer
    # convert --weights` stores), so no second artifact is needed
    quantize: str | None = None


def placement(config, dtype=None, *, fuse: bool = True,
              options: PipelineOptions = PipelineOptions()) -> Callable:
    """The `placement` for format.load_artifact: the text weights come back on the default
    device in `dtype` (None: runner.default_dtype(), asked once the first part is read, so
    the device runtime may still be starting while the reads begin), q|k|v and gate|up fused
    when `fuse` (dense families, as runner.place_params)."""
    return functools.partial(place_in_parts, config=config, dtype=dtype, fuse=fuse,
                             options=options)


def place_in_parts(structure: Any, read_part: Callable[[weights_io.Part], dict], *, config,
                   dtype=None, fuse: bool = True,
                   options: PipelineOptions = PipelineOptions()) -> dict:
    """The stored tree `structure` placed part by part (module docstring); `read_part`
    reads one weights_io.Part as numpy (its errors ArtifactErrors). Should a part's read
    fail, the whole tree is read once more in one part before the error stands: an orbax
    whose partial restore misbehaves then costs a slower start, not a refused one (a
    damaged file fails again, and format.load_artifact names it by its checksum)."""
    whole = [weights_io.whole_part(structure)]
    if not weights_io.can_restore_parts():
        return _place(structure, whole, read_part, config, dtype, fuse, options)
    parts = weights_io.split_parts(structure, options.part_bytes)
    try:
        return _place(structure, parts, read_part, config, dtype, fuse, options)
    except ArtifactError as error:
        if len(parts) == 1:
            raise
        log.warning("reading the weights in parts failed (%s); reading them whole", error)
        return _place(structure, whole, read_part, config, dtype, fuse, options)


def _place(structure, parts, read_part, config, dtype, fuse, options) -> dict:
    leaves = fused_projections.fused_leaves(config) if fuse else None
    device = _OnDevice(dtype, options.device_fuse)

    def load(part: weights_io.Part) -> dict:
        host = read_part(part)
        if options.quantize:
            host = convert_common.quantize_projections(host, options.quantize)
        compute_dtype, device_fuse = device.get()
        if leaves and not device_fuse and "layers" in host:
            host["layers"] = [fused_projections.fuse_layer(layer, 1, leaves)
                              for layer in host["layers"]]
        placed = _put(steps.cast_leaves(host, compute_dtype), options.via_pinned)
        jax.block_until_ready(placed)
        if leaves and device_fuse and "layers" in placed:
            # jnp.concatenate on the device; the parts go with their last reference
            placed["layers"] = [fused_projections.fuse_layer(layer, 1, leaves)
                                for layer in placed["layers"]]
        return placed

    workers = max(1, min(options.workers, len(parts)))
    with concurrent.futures.ThreadPoolExecutor(workers,
                                               thread_name_prefix="ninfer-load") as pool:
        futures = [pool.submit(load, part) for part in parts]
        concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        for future in futures:
            future.cancel()  # parts not started yet, after a failure (else all are done)
        failed = [future for future in futures if future.done() and not future.cancelled()
                  and future.exception() is not None]
        if failed:  # the first in part order (the others may have failed because of it)
            raise failed[0].exception()
    return _assemble(structure, parts, [future.result() for future in futures])


def _assemble(structure: Any, parts: list[weights_io.Part], loaded: list[dict]) -> dict:
    """One tree in the stored tree's key order from the parts' trees."""
    tree: dict = {}
    layers: list = [None] * len(structure.get("layers", ()))
    for part, placed in zip(parts, loaded):
        for key in part.keys:
            tree[key] = placed[key]
        for index, layer in zip(part.layers, placed.get("layers", ())):
            layers[index] = layer
    return {key: (layers if key == "layers" else tree[key]) for key in structure}


def _put(host: dict, via_pinned: bool) -> dict:
    """A part's host tree on the default device, by one device_put or through pinned host
    memory (where the device has it: every JAX backend here, the CPU's emulated)."""
    if not via_pinned:
        return jax.device_put(host)
    device = jax.devices()[0]
    pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    hosted = jax.device_put(host, pinned)
    return jax.device_put(hosted, jax.sharding.SingleDeviceSharding(device,
                                                                     memory_kind="device"))


class _OnDevice:
    """(compute dtype, device_fuse) with their defaults decided by the first worker that
    needs them, once the device runtime is up (thread-safe)."""

    def __init__(self, dtype, device_fuse: bool | None):
        self._lock = threading.Lock()
        self._dtype, self._device_fuse = dtype, device_fuse

    def get(self) -> tuple:
        with self._lock:
            if self._dtype is None:
                from ninfer_jax.engine.runner import default_dtype

                self._dtype = default_dtype()
            if self._device_fuse is None:
                self._device_fuse = jax.default_backend() != "cpu"
            return self._dtype, self._device_fuse
