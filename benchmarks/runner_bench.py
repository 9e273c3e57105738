"""Prefill and decode speed of JaxRunner on a real artifact (default: the embedded SmolLM2).

    python benchmarks/runner_bench.py [ARTIFACT] [--batches 1,8] [--context 200]
        [--prompt 256] [--steps 64] [--max-context N] [--keep-quantized]

Goes through the same path as the server (runner.prefill / runner.decode with padding to
buckets and on-device sampling, greedy), so the figures include host-side input building and
the one device->host copy per step. Compilation is excluded: the runner warms up first (set
JAX_COMPILATION_CACHE_DIR to reuse executables across runs).
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

from ninfer_jax.artifact import load_artifact
from ninfer_jax.artifact.default_model import ensure_default_artifact
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec

GREEDY = SampleSpec(SamplingParams(temperature=0.0), 0)


def time_prefill(runner, prompt_len: int, repeats: int = 3) -> float:
    tokens = np.arange(prompt_len, dtype=np.int32) % 1000 + 100
    table = np.arange(1, 1 + math.ceil(prompt_len / runner.page_size), dtype=np.int32)
    chunk = runner.chunk_buckets[-1]

    def run():
        for start in range(0, prompt_len, chunk):
            piece = tokens[start:start + chunk]
            last = start + len(piece) == prompt_len
            runner.prefill(PrefillUnit(0, piece, start,
                                       table[:math.ceil((start + len(piece)) / runner.page_size)],
                                       GREEDY if last else None))
    run()
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    return prompt_len * repeats / (time.perf_counter() - started)


def time_decode(runner, batch: int, context: int, steps: int) -> float:
    pages_per_row = math.ceil((context + steps + 1) / runner.page_size)
    tables = [np.arange(1 + r * pages_per_row, 1 + (r + 1) * pages_per_row, dtype=np.int32)
              for r in range(batch)]

    def rows(step):
        position = context + step
        return [DecodeRow(r, 100 + r, position, tables[r][:position // runner.page_size + 1],
                          SampleSpec(GREEDY.params, step)) for r in range(batch)]
    runner.decode(rows(0))
    started = time.perf_counter()
    for step in range(steps):
        runner.decode(rows(step))
    return batch * steps / (time.perf_counter() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", nargs="?")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--prefill-chunk", type=int, default=256)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=None,
                        help="the runner's context (page-table width); default: the next power "
                             "of two above what the run needs")
    parser.add_argument("--keep-quantized", action="store_true",
                        help="off the GPU, dequantize quantized weights in every step instead "
                             "of once at load (the runner's default before 2026-11-29)")
    args = parser.parse_args()
    artifact = load_artifact(args.artifact or ensure_default_artifact())
    batches = [int(b) for b in args.batches.split(",")]
    max_context = args.max_context or 2 ** math.ceil(
        math.log2(max(args.context + args.steps + 1, args.prompt)))
    pages = max(batches) * math.ceil(max_context / 16) + 2
    runner = JaxRunner(artifact, num_pages=pages, max_batch=max(batches), max_context=max_context,
                       prefill_chunk=args.prefill_chunk,
                       expand_quantized=False if args.keep_quantized else None)
    runner.warmup()
    print(f"{artifact.name}: dtype {np.dtype(runner.dtype).name}, buckets "
          f"chunks {runner.chunk_buckets} widths {runner.width_buckets}")
    print(f"prefill {args.prompt} tokens: {time_prefill(runner, args.prompt):.0f} tok/s")
    for batch in batches:
        rate = time_decode(runner, batch, args.context, args.steps)
        print(f"decode batch {batch} at context {args.context}: {rate:.1f} tok/s "
              f"({batch / rate * 1e3:.1f} ms/step)")


if __name__ == "__main__":
    main()
