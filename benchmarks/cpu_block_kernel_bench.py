"""The CPU block kernel's layouts against each other and against the dequantized XLA product.

    .venv/bin/python benchmarks/cpu_block_kernel_bench.py [--rows 1,8,64] [--json]

For the default model's shapes (q4_1 qkv 576 x 960, gate/up 576 x 3072, down 1536 x 576 and
the q8_0 head 576 x 49152), per row count: the best of 5 timed loops of one jitted product
with the row layout ({fmt: blocks}), the load's interleaved layout (cpu.interleave) and, at
the largest row count, reference.matmul (dequantize + XLA). The weights stay L3-warm between
calls; `--stream` adds the DRAM figure: 40 distinct 576 x 3072 q4_1 weights one after another
at one row, in GB/s of weight bytes (what a decode step streams).
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.kernels.quant_matmul import cpu, formats, reference

SHAPES = [("q4_1", 576, 960), ("q4_1", 576, 3072), ("q4_1", 1536, 576), ("q8_0", 576, 49152)]


def best_us(fn, *args, calls: int) -> float:
    fn(*args).block_until_ready()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        out.block_until_ready()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def stream_gbs(count: int = 40) -> dict:
    rng = np.random.default_rng(1)
    base = formats.quantize(rng.standard_normal((576, 3072)).astype(np.float32), "q4_1")["q4_1"]
    x = jnp.asarray(rng.standard_normal((1, 576)), jnp.float32)
    out = {}
    for layout in ("rows", "interleaved"):
        leaves = [{"q4_1": jnp.asarray(base.copy())} for _ in range(count)]
        if layout == "interleaved":
            leaves = [cpu.interleave(leaf) for leaf in leaves]

        def chain(x, leaves):
            return sum(cpu.matmul(x, leaf)[0, :8].sum() for leaf in leaves)

        run = jax.jit(chain)
        seconds = best_us(run, x, leaves, calls=1) / 1e6
        out[layout] = formats.stored_bytes(leaves[0]) * count / seconds / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,8,64")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(0)
    for fmt, K, N in SHAPES:
        leaf = {fmt: jnp.asarray(formats.quantize(
            rng.standard_normal((K, N)).astype(np.float32), fmt)[fmt])}
        interleaved = cpu.interleave(leaf)
        product = jax.jit(lambda x, w: cpu.matmul(x, w))
        dequantized = jax.jit(lambda x, w: reference.matmul(x, w))
        for M in rows:
            x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
            calls = 30 if M * N > 400_000 else 300
            record = {"format": fmt, "K": K, "N": N, "rows": M,
                      "row_layout_us": best_us(product, x, leaf, calls=calls),
                      "interleaved_us": best_us(product, x, interleaved, calls=calls)}
            if M == max(rows):
                record["dequantize_xla_us"] = best_us(dequantized, x, leaf, calls=5)
            print(json.dumps(record) if args.json else
                  "  ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in record.items()), flush=True)
    if args.stream:
        figures = stream_gbs()
        print(json.dumps({"stream_gb_s": figures}) if args.json else f"DRAM stream {figures}")


if __name__ == "__main__":
    main()
