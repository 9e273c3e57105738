"""Does putting page rows into pinned host memory stall the host the first time?

The live 8B server has one 1.4-2.1 s step launch per load level as the level turns to decode
(runs 41, 42, 44), with every shape compiled and primed. One suspect is the host tier's
write-through (engine/page_store.py): a save puts one row per page (2.25 MiB for the 8B
shape) into `pinned_host` memory, and the first puts of a burst may have to pin fresh host
memory (cudaHostAlloc) on the calling thread, which is the engine thread.

    python3 benchmarks/pinned_probe.py [--page-mib 2.25] [--bursts 16,64,256] [--json]

XLA grows its pinned host pool by regions (each at least the request and the region before
it, never given back); XLA_PJRT_GPU_HOST_MEMORY_PREALLOCATE=true with
XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB=N pins N GiB when the client starts instead: run it both
ways (the first record says how long the client took to start, and under which settings).

For each burst size: `--repeats` puts of that many rows, each kept (as the host tier keeps
its rows), then all dropped and `--repeats` more: the seconds of the put call itself
(dispatch: what the engine thread waits) and until the rows are ready. Needs a GPU with the
pinned_host memory kind.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding


def put_burst(rows, host) -> tuple[float, float, list]:
    started = time.perf_counter()
    out = jax.device_put(rows, host)
    dispatched = time.perf_counter()
    jax.block_until_ready(out)
    return dispatched - started, time.perf_counter() - started, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page-mib", type=float, default=2.25)
    parser.add_argument("--bursts", default="16,64,256")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    device = jax.devices()[0]
    jax.block_until_ready(jnp.zeros(1))
    record = {"client_start_s": round(time.perf_counter() - started, 2), "device": str(device),
              **{name: os.environ.get(name) for name in (
                  "XLA_PJRT_GPU_HOST_MEMORY_PREALLOCATE", "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB")}}
    print(json.dumps(record) if args.json else record, flush=True)
    host = SingleDeviceSharding(device, memory_kind="pinned_host")
    size = int(args.page_mib * 2**20)
    for burst in (int(b) for b in args.bursts.split(",")):
        rows = [jnp.full(size, i % 251, jnp.uint8) for i in range(burst)]
        jax.block_until_ready(rows)
        kept = []
        for phase in ("grow", "reuse"):
            for repeat in range(args.repeats):
                dispatch, total, out = put_burst(rows, host)
                kept.append(out)
                record = {"burst_pages": burst, "mib": round(burst * size / 2**20, 1),
                          "phase": phase, "repeat": repeat,
                          "dispatch_ms": round(1e3 * dispatch, 2),
                          "total_ms": round(1e3 * total, 2)}
                print(json.dumps(record) if args.json else record, flush=True)
            if phase == "grow":
                kept.clear()  # every row dropped: the next puts may reuse their memory


if __name__ == "__main__":
    main()
