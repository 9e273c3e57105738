"""How long each of the first runs of a compiled step takes, run by run.

    python benchmarks/prime_probe.py ARTIFACT [--shapes 0x64,256x32] [--runs 4] [--json]

The live server primes every executable before it reports ready (JaxRunner.prime_one: one run
on padding inputs) so no request pays an executable's first-run set-up. Runs 41-42 still saw
one-off launch stalls of 0.5-2 s the first time a level used a shape (a 64-row decode, a
256-token chunk beside 4 rows). Suspect: XLA's command buffer thunk runs its commands one by
one on the first execution (a warm-up) and records and instantiates the CUDA graph only on
the second, so a single priming run leaves the graph's construction to a request. This
times runs 1..N of each shape (every variant compiled: draws and greedy) back to back,
device work waited for after each; a second run far slower than the third would confirm it.
Run 42 (H100, Qwen3-8B shape) refuted it: runs 2-4 all take the steady time (0x64 10.8, 10.5,
10.5 ms; 256x32 15.9, 15.2, 14.7 ms), only the first is slow (0.04-0.38 s), and priming pays
that one. Also a per-shape step time on padding inputs (matmuls real, attention over one
dummy page).
"""
from __future__ import annotations

import argparse
import json
import time

import jax

from ninfer_jax.artifact import load_artifact
from ninfer_jax.artifact.default_model import ensure_default_artifact
from ninfer_jax.engine.runner import JaxRunner


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in item.split("x")) for item in text.split(",") if item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", nargs="?")
    parser.add_argument("--shapes", default="0x64,256x32", help="CHUNKxROWS,...")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--prefill-chunk", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    artifact = load_artifact(args.artifact or ensure_default_artifact())
    shapes = parse_shapes(args.shapes)
    # Pages for the padding runs only (they write the dummy page).
    runner = JaxRunner(artifact, num_pages=64, max_batch=args.max_batch,
                       max_context=args.max_context, prefill_chunk=args.prefill_chunk,
                       background_compile=False)
    started = time.perf_counter()
    runner.compile_shapes(shapes)
    compile_s = time.perf_counter() - started
    records = [{"op": "compile", "shapes": args.shapes, "seconds": compile_s,
                "backend": jax.default_backend()}]
    for shape in shapes:
        for variant in ("draws", "greedy"):
            executable = runner._variant_executables(variant).get(shape)
            if executable is None:
                continue
            seconds = []
            for _ in range(args.runs):
                started = time.perf_counter()
                runner._run_padding(executable, shape)
                jax.block_until_ready(runner.kv)
                seconds.append(time.perf_counter() - started)
            records.append({"op": "runs", "chunk": shape[0], "rows": shape[1],
                            "variant": variant, "seconds": seconds})
    for record in records:
        print(json.dumps(record) if args.json else record)


if __name__ == "__main__":
    main()
