"""Host <-> device copy cost by transfer size on a GPU with pinned host memory: N rows of
ROW bytes moved as N arrays (one per row) or as one [N, ROW] array. Prints JSON lines.

    python3 benchmarks/host_copy_bench.py --rows 256 --row-mib 2.25
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp


def timed(fn, repeat=5):
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--row-mib", type=float, default=2.25)
    args = parser.parse_args()
    device = jax.devices()[0]
    host = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    dev = jax.sharding.SingleDeviceSharding(device)
    width = int(args.row_mib * (1 << 20))
    batch = jnp.ones((args.rows, width), jnp.uint8)
    rows = [batch[i] for i in range(args.rows)]
    total = args.rows * width
    host_rows = jax.block_until_ready(jax.device_put(rows, host))
    host_batch = jax.block_until_ready(jax.device_put(batch, host))
    for name, fn in (("d2h rows", lambda: jax.device_put(rows, host)),
                     ("h2d rows", lambda: jax.device_put(host_rows, dev)),
                     ("d2h batch", lambda: jax.device_put(batch, host)),
                     ("h2d batch", lambda: jax.device_put(host_batch, dev))):
        seconds = timed(fn)
        print(json.dumps({"copy": name, "rows": args.rows, "row_bytes": width,
                          "seconds": round(seconds, 5),
                          "gb_per_s": round(total / seconds / 1e9, 2)}), flush=True)


if __name__ == "__main__":
    main()
