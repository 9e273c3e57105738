"""Where a server's weight loading goes: each phase of the load timed alone, then the whole
load as the server did it before (one stage after another) against the pipelined load it
does now (engine/weight_pipeline.py).

    python benchmarks/startup_probe.py ARTIFACT [--json] [--workers 4,6,8]
        [--part-mib 0,256] [--phases ...]

Phases (`--phases` picks some; all by default), in this order, on one artifact (issue 10's
restart target is 20 s for the 8B shape):
  verify        the checksums alone (artifact/checksums.py, files hashed in parallel)
  restore       the orbax restore to numpy (weights_io.restore_weights via load_artifact)
  restore_parts the pipeline's reads alone: weights_io.restore_part of every part (the
                first --part-mib) on N threads, N = each --workers value; the pipeline can
                be no faster than this
  host_fuse     q|k|v and gate|up joined on the host (fused_projections.fuse_projections)
  device_put    the fused tree cast and placed by one device_put (steps.cast_params), waited
  put_threads   the same leaves placed by N threads, a device_put per leaf (N = each
                --workers value): are several transfers in flight faster than one call?
  put_pinned    the same leaves copied into pinned host memory first (8 threads), then to
                the device: the two hops timed apart (GPU only)
  device_fuse   the stored tree placed as is, then joined on the device
  sequential    the whole load as build_engine did it before: load_artifact (checksums beside
                the restore) then runner.place_params, waited
  pipelined     load_artifact with weight_pipeline's placement (checksums beside it), waited,
                once per --workers x --part-mib (device fuse), plus once joined on the
                host (`host_fuse` in its record) and once sent through pinned host memory
                (`via_pinned`), both with the first --workers and --part-mib; each
                record says whether its tree is bit-identical to the sequential one
                (`identical`)
Each figure is wall seconds with bytes: the artifact's stored (compressed) bytes for the
phases that read it, the placed bytes for put_threads and put_pinned. The page cache is warm
after the first phase (as on a restart, the case the target is about).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import time

import jax
import jax.numpy as jnp

from ninfer_jax.artifact import checksums, weights_io
from ninfer_jax.artifact.format import load_artifact, read_metadata
from ninfer_jax.engine import weight_pipeline
from ninfer_jax.engine.runner import default_dtype, place_params
from ninfer_jax.model import fused_projections, steps

PHASES = ("verify", "restore", "restore_parts", "host_fuse", "device_put", "put_threads", "put_pinned",
          "device_fuse", "sequential", "pipelined")


def _timed(fn):
    started = time.perf_counter()
    value = fn()
    jax.block_until_ready(jax.tree.leaves(value)) if value is not None else None
    return value, time.perf_counter() - started


def _ints(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item]


def _identical(a, b) -> bool:
    """Every leaf of two placed trees equal bit for bit (compared on the device)."""
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False

    def same(x, y):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
        cast = (lambda v: v) if jnp.issubdtype(x.dtype, jnp.integer) else (
            lambda v: jax.lax.bitcast_convert_type(v, bits))
        return bool(jnp.array_equal(cast(x), cast(y)))
    return all(same(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _put_threads(leaves, workers: int):
    def put(leaf):
        return jax.device_put(leaf).block_until_ready()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(put, leaves))


def _pinned_hops(leaves):
    """(seconds numpy -> pinned host, seconds pinned host -> device), or None without a
    pinned_host memory kind."""
    device = jax.devices()[0]
    try:
        pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
        jax.device_put(jnp.zeros(8), pinned).block_until_ready()
    except Exception:  # noqa: BLE001 (a backend without the memory kind)
        return None
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        hosted, first = _timed(lambda: list(pool.map(
            lambda leaf: jax.device_put(leaf, pinned), leaves)))
    placed, second = _timed(lambda: jax.device_put(
        hosted, jax.sharding.SingleDeviceSharding(device)))
    del placed, hosted
    return first, second


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", type=_ints,
                        default=[weight_pipeline.DEFAULT_WORKERS],
                        help="pipeline threads to time, comma separated")
    parser.add_argument("--part-mib", type=_ints,
                        default=[weight_pipeline.DEFAULT_PART_BYTES >> 20],
                        help="least MiB of layers per restore call to time, comma separated "
                             "(0: a layer a call)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma separated, of {', '.join(PHASES)}")
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))
    if phases - set(PHASES):
        parser.error(f"unknown phases {sorted(phases - set(PHASES))}")
    path = pathlib.Path(args.artifact)
    records = []

    def emit(phase, seconds, nbytes, **extra):
        record = {"phase": phase, "s": round(seconds, 3), "bytes": nbytes,
                  "gb_per_s": round(nbytes / seconds / 1e9, 2) if seconds else None, **extra}
        records.append(record)
        print(json.dumps(record) if args.json else
              f"{phase:12s} {seconds:7.2f} s  {nbytes / 1e9:6.2f} GB  "
              + " ".join(f"{key}={value}" for key, value in extra.items()), flush=True)

    metadata = read_metadata(path / "metadata.json")
    stored = sum(p.stat().st_size for p in (path / "weights").rglob("*") if p.is_file())
    dtype = default_dtype()
    # the page cache warm before anything is timed (verify reads every byte)
    _, seconds = _timed(lambda: checksums.verify_in_background(
        path, metadata.get("checksums"), path)())
    if "verify" in phases:
        emit("verify", seconds, stored)
    artifact, seconds = _timed(lambda: load_artifact(path, weights=True, verify=False))
    if "restore" in phases:
        emit("restore", seconds, stored)
    config, params = artifact.config, artifact.params
    if "restore_parts" in phases:
        directory = path / "weights"
        structure = weights_io.stored_tree(directory)
        parts = weights_io.split_parts(structure, args.part_mib[0] << 20)
        for workers in args.workers:
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                _, seconds = _timed(lambda: list(pool.map(
                    lambda part: weights_io.restore_part(directory, structure, part), parts)))
            emit("restore_parts", seconds, stored, threads=workers, parts=len(parts))
    fused, seconds = _timed(lambda: fused_projections.fuse_projections(params, config))
    if "host_fuse" in phases:
        emit("host_fuse", seconds, stored)
    if "device_put" in phases:
        placed, seconds = _timed(lambda: steps.cast_params(fused, dtype))
        emit("device_put", seconds, stored)
        del placed
    host = steps._map_plain_weights(lambda leaf: leaf if leaf.dtype == dtype or not
                                    jnp.issubdtype(leaf.dtype, jnp.floating)
                                    else leaf.astype(dtype), fused)
    leaves = jax.tree.leaves(host)
    nbytes = sum(leaf.nbytes for leaf in leaves)
    if "put_threads" in phases:
        for workers in args.workers:
            placed, seconds = _timed(lambda: _put_threads(leaves, workers))
            emit("put_threads", seconds, nbytes, threads=workers)
            del placed
    if "put_pinned" in phases:
        hops = _pinned_hops(leaves)
        if hops is not None:
            emit("put_pinned", sum(hops), nbytes, to_pinned_s=round(hops[0], 3),
                 pinned_to_device_s=round(hops[1], 3))
    del host, leaves, fused

    if "device_fuse" in phases:
        def device_fuse():
            raw = steps.cast_params(params, dtype)
            return {**raw, "layers": [fused_projections.fuse_layer(layer)
                                      for layer in raw["layers"]]}
        placed, seconds = _timed(device_fuse)
        emit("device_fuse", seconds, stored)
        del placed
    del artifact, params

    sequential = None
    if {"sequential", "pipelined"} & phases:
        def old_load():
            loaded = load_artifact(path, weights=True)
            return place_params(loaded.params, loaded.config, dtype)
        sequential, seconds = _timed(old_load)
        if "sequential" in phases:
            emit("sequential", seconds, stored)
    if "pipelined" in phases:
        variants = [weight_pipeline.PipelineOptions(workers=workers, part_bytes=mib << 20,
                                                    device_fuse=True)
                    for workers in args.workers for mib in args.part_mib]
        first = dict(workers=args.workers[0], part_bytes=args.part_mib[0] << 20)
        variants += [weight_pipeline.PipelineOptions(**first, device_fuse=False),
                     weight_pipeline.PipelineOptions(**first, device_fuse=True, via_pinned=True)]
        for options in variants:
            placement = weight_pipeline.placement(config, dtype, options=options)
            loaded, seconds = _timed(lambda: load_artifact(path, weights=True,
                                                           placement=placement).params)
            emit("pipelined", seconds, stored, workers=options.workers,
                 part_mib=options.part_bytes >> 20,
                 host_fuse=options.device_fuse is False, via_pinned=options.via_pinned,
                 identical=_identical(sequential, loaded))
            del loaded
    return records


if __name__ == "__main__":
    jnp.zeros(1).block_until_ready()  # the runtime's start is not a phase
    main()
