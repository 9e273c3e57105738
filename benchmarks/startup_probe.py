"""Where a server's weight loading goes: each phase of build_engine's load, timed alone.

    python benchmarks/startup_probe.py ARTIFACT [--json]

Phases, in order, on one artifact (issue 10's restart target is 20 s for the 8B shape):
  verify        the checksums alone (artifact/checksums.py, files hashed in parallel)
  restore       the orbax restore to numpy (weights_io.restore_weights via load_artifact)
  host_fuse     q|k|v and gate|up joined on the host (fused_projections.fuse_projections)
  device_put    the fused tree cast and placed by one device_put (steps.cast_params), waited
  device_fuse   the alternative: the stored tree placed as is, then joined on the device
Each figure is wall seconds with the bytes it moved; the page cache is warm after the first
phase (as on a restart, the case the target is about).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp

from ninfer_jax.artifact import checksums
from ninfer_jax.artifact.format import load_artifact, read_metadata
from ninfer_jax.engine.runner import default_dtype
from ninfer_jax.model import fused_projections, steps


def _timed(fn):
    started = time.perf_counter()
    value = fn()
    jax.block_until_ready(jax.tree.leaves(value)) if value is not None else None
    return value, time.perf_counter() - started


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    path = pathlib.Path(args.artifact)
    records = []

    def emit(phase, seconds, nbytes):
        record = {"phase": phase, "s": round(seconds, 3), "bytes": nbytes,
                  "gb_per_s": round(nbytes / seconds / 1e9, 2) if seconds else None}
        records.append(record)
        print(json.dumps(record) if args.json else
              f"{phase:12s} {seconds:7.2f} s  {nbytes / 1e9:6.2f} GB", flush=True)

    metadata = read_metadata(path / "metadata.json")
    stored = sum(p.stat().st_size for p in (path / "weights").rglob("*") if p.is_file())
    _, seconds = _timed(lambda: checksums.verify_in_background(
        path, metadata.get("checksums"), path)())
    emit("verify", seconds, stored)
    artifact, seconds = _timed(lambda: load_artifact(path, weights=True, verify=False))
    emit("restore", seconds, stored)
    config, params = artifact.config, artifact.params
    fused, seconds = _timed(lambda: fused_projections.fuse_projections(params, config))
    emit("host_fuse", seconds, stored)
    dtype = default_dtype()
    placed, seconds = _timed(lambda: steps.cast_params(fused, dtype))
    emit("device_put", seconds, stored)
    del placed, fused

    def device_fuse():
        raw = steps.cast_params(params, dtype)
        join = jax.jit(fused_projections.fuse_layer, donate_argnums=0)
        return {**raw, "layers": [join(layer) for layer in raw["layers"]]}
    _, seconds = _timed(device_fuse)
    emit("device_fuse", seconds, stored)
    return records


if __name__ == "__main__":
    jnp.zeros(1).block_until_ready()  # the runtime's start is not a phase
    main()
