"""Would reserving the host tier's pinned memory at start-up remove its slow first fill?

    python benchmarks/pinned_reserve_probe.py [--mib 8192] [--page-bytes 2359296] [--json]

Run 31b: the first time the host tier fills, evicting is slow (XLA allocates pinned host
memory as the tier grows); later fills reuse it. The host tier puts one row per page
(engine/page_store.py: `page_bytes` of uint8, 2,359,296 for Qwen3-8B) into `pinned_host`
memory. Each case runs in a fresh process (a fresh allocator):
  plain     fill: --mib of rows put device -> pinned host, waited; refill: the rows
            deleted, then the same again (what later rounds of run 31b saw)
  reserved  reserve: one --mib buffer placed in pinned host memory and deleted first;
            then fill and refill as above
If `reserved`'s fill is near the refills and its reserve costs less than the first fill
saved, reserving at start-up (in the background) is worth building.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _case(reserve: bool, mib: int, page_bytes: int) -> dict:
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    count = (mib << 20) // page_bytes
    rows = [jnp.full((page_bytes,), index % 251, jnp.uint8) for index in range(count)]
    jax.block_until_ready(rows)
    record = {"case": "reserved" if reserve else "plain", "rows": count,
              "bytes": count * page_bytes}

    def timed(fn):
        started = time.perf_counter()
        jax.block_until_ready(fn())
        return round(time.perf_counter() - started, 3)

    if reserve:
        def reserved():
            big = jax.device_put(jnp.zeros((count * page_bytes,), jnp.uint8), pinned)
            big.block_until_ready()
            big.delete()
            return []
        record["reserve_s"] = timed(reserved)
    hosted: list = []

    def fill():
        hosted[:] = jax.device_put(rows, pinned)
        return hosted
    record["fill_s"] = timed(fill)
    for row in hosted:
        row.delete()
    record["refill_s"] = timed(fill)
    return record


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=8192)
    parser.add_argument("--page-bytes", type=int, default=2_359_296)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--case", choices=("plain", "reserved"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:  # the child: one case in this fresh process
        print(json.dumps(_case(args.case == "reserved", args.mib, args.page_bytes)))
        return []
    records = []
    for case in ("plain", "reserved"):
        done = subprocess.run([sys.executable, __file__, "--case", case, "--mib",
                               str(args.mib), "--page-bytes", str(args.page_bytes)],
                              capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        record = json.loads(lines[-1]) if done.returncode == 0 and lines else {
            "case": case, "failed": done.returncode, "stderr": done.stderr[-2000:]}
        records.append(record)
        print(json.dumps(record) if args.json else
              " ".join(f"{key}={value}" for key, value in record.items()), flush=True)
    return records


if __name__ == "__main__":
    main()
