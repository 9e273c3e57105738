"""What one call of a compiled step costs the host, by how many arrays it takes.

An 8B step takes ~400 weight arrays and donates and returns 72 KV arrays (36 layers x k, v);
this times the launch of a trivial executable with N plain inputs, and with N arrays donated
and returned, to tell whether the count of arrays is what the host pays for at every step.

    python benchmarks/dispatch_bench.py [--counts 1,72,400] [--json]
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np


def time_calls(count: int, donated: bool, calls: int = 200) -> float:
    """Median milliseconds the host spends in one launch (not waiting for the result)."""
    arrays = [jnp.ones((8, 128), jnp.bfloat16) for _ in range(count)]
    bump = jnp.ones((4,), jnp.float32)
    if donated:
        fn = jax.jit(lambda xs, y: [x + 1 for x in xs], donate_argnums=(0,))
    else:
        fn = jax.jit(lambda xs, y: y + 1)
    compiled = fn.lower(arrays, bump).compile()
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        out = compiled(arrays, bump)
        seconds.append(time.perf_counter() - started)
        if donated:
            arrays = out
        jax.block_until_ready(out)
    return 1e3 * float(np.median(seconds[calls // 4:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="1,72,400")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = str(jax.devices()[0])
    for count in (int(c) for c in args.counts.split(",")):
        record = {"op": "dispatch", "device": device, "arrays": count,
                  "plain_ms": time_calls(count, False), "donated_ms": time_calls(count, True)}
        print(json.dumps(record) if args.json else
              f"{count} arrays: plain {record['plain_ms']:.3f} ms, donated and returned "
              f"{record['donated_ms']:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
