"""Prefill and decode speed of JaxRunner on a real artifact (default: the embedded SmolLM2).

    python benchmarks/runner_bench.py [ARTIFACT] [--batches 1,8] [--context 200]
        [--prompt 256] [--steps 64] [--max-context N] [--keep-quantized] [--stable-buffers]
        [--no-fuse] [--json] [--profile DIR] [--modes pipelined,sync]
        [--kv-dtype auto|bf16|fp8|int8] [--decode-split-tokens N] [--merge-min-splits N]
        [--tensor-parallel N [--expert-parallel]]

Goes through the same path as the engine: padded ragged steps with on-device sampling
(greedy), decode pipelined as the engine's step loop runs it (step n+1 launched before step
n is collected, each row fed the token the previous step sampled on the device), so the
figures include host-side input building and the one device->host copy per step: the bare
step's ceiling for the live server. `sync` figures wait for every step before the next.
Compilation is excluded: the runner warms up first (set JAX_COMPILATION_CACHE_DIR to reuse
executables across runs). --json prints one JSON object per measurement. --profile DIR also
traces each batch's pipelined decode once more under jax.profiler and prints where the
device's time went per step (benchmarks/trace_summary.py). --decode-split-tokens and
--merge-min-splits set the paged decode kernel's split and merge thresholds for A/B runs.
--tensor-parallel N splits the model over N devices; with --expert-parallel a MoE model's
routed experts are split by expert index instead of replicated (the A/B of issue 20's
"expert parallelism where it beats tensor parallelism": run both on the same artifact).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np

from ninfer_jax.artifact import load_artifact
from ninfer_jax.artifact.default_model import ensure_default_artifact
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner import JaxRunner, fit_bucket, kv_dtype_for
from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec, StepPlan
from ninfer_jax.kernels.paged_attention import kernel as attention_kernel
from ninfer_jax.kernels.paged_attention import tuning as attention_tuning

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


def time_decode(runner, batch: int, context: int, steps: int, *, pipelined: bool,
                trace_dir: str | None = None) -> float:
    pages_per_row = math.ceil((context + steps + 2) / runner.page_size)
    tables = [np.arange(1 + r * pages_per_row, 1 + (r + 1) * pages_per_row, dtype=np.int32)
              for r in range(batch)]

    def plan(step, fed_back):
        position = context + step
        return StepPlan(chunk=None, rows=tuple(
            DecodeRow(r, 100 + r, position, tables[r][:position // runner.page_size + 1],
                      SampleSpec(GREEDY.params, step), from_previous=r if fed_back else None,
                      **({"state_slot": 1 + r} if runner.has_state else {}))
            for r in range(batch)))

    launch_seconds = []

    def launch(step_plan):
        started = time.perf_counter()
        handle = runner.launch(step_plan)
        launch_seconds.append(time.perf_counter() - started)
        return handle

    def run(first, count):
        if not pipelined:
            for step in range(first, first + count):
                runner.collect(launch(plan(step, False)))
            return
        in_flight = launch(plan(first, False))
        for step in range(first + 1, first + count):
            launched = launch(plan(step, True))
            runner.collect(in_flight)
            in_flight = launched
        runner.collect(in_flight)
    run(0, 2)
    launch_seconds.clear()
    started = time.perf_counter()
    run(0, steps)
    rate = batch * steps / (time.perf_counter() - started)
    launch_ms = 1e3 * float(np.median(launch_seconds))
    if trace_dir is not None:
        import jax

        with jax.profiler.trace(trace_dir):
            run(0, steps)
    return rate, launch_ms


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
    parser.add_argument("--stable-buffers", action="store_true",
                        help="the runner's stable-buffer launch (inputs and prev_out keep their "
                             "device addresses, so XLA need not update its CUDA graph)")
    parser.add_argument("--no-fuse", action="store_true",
                        help="keep q/k/v and gate/up as separate products (the runner joins "
                             "them at load by default: model/fused_projections.py)")
    parser.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                        help="split the model over N devices (model/tensor_parallel.py)")
    parser.add_argument("--expert-parallel", action="store_true",
                        help="with --tensor-parallel N: a MoE model's routed experts split by "
                             "expert index over the N devices instead of replicated")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--modes", default="pipelined,sync",
                        help="decode timing modes, comma separated (pipelined, sync)")
    parser.add_argument("--kv-dtype", default="auto",
                        help="KV page storage, as `ninfer serve --kv-dtype` (auto, bf16, fp8, "
                             "int8, f32)")
    parser.add_argument("--decode-split-tokens", type=int, metavar="N",
                        help="A/B: the paged decode kernel's smallest context split "
                             "(kernels/paged_attention/tuning.py MIN_SPLIT_TOKENS)")
    parser.add_argument("--merge-min-splits", type=int, metavar="N",
                        help="A/B: splits from which the merge kernel replaces the XLA merge "
                             "(kernels/paged_attention/kernel.py MERGE_KERNEL_MIN_SPLITS)")
    parser.add_argument("--profile", metavar="DIR",
                        help="trace each batch's pipelined decode under DIR/batchN and print "
                             "the device time per step by kernel")
    args = parser.parse_args()
    if args.decode_split_tokens is not None:
        attention_tuning.MIN_SPLIT_TOKENS = args.decode_split_tokens
    if args.merge_min_splits is not None:
        attention_kernel.MERGE_KERNEL_MIN_SPLITS = args.merge_min_splits
    artifact = load_artifact(args.artifact or ensure_default_artifact())
    batches = [int(b) for b in args.batches.split(",")]
    max_context = args.max_context or 2 ** math.ceil(
        math.log2(max(args.context + args.steps + 1, args.prompt)))
    pages = max(batches) * math.ceil(max_context / 16) + 2
    runner = JaxRunner(artifact, num_pages=pages, max_batch=max(batches), max_context=max_context,
                       prefill_chunk=args.prefill_chunk,
                       expand_quantized=False if args.keep_quantized else None,
                       stable_buffers=args.stable_buffers,
                       fuse_projections=False if args.no_fuse else None,
                       kv_dtype=kv_dtype_for(args.kv_dtype),
                       tensor_parallel=args.tensor_parallel,
                       expert_parallel=args.expert_parallel)
    # Exactly the shapes measured (no warm-up of the serving set, no background compiles
    # competing with the timed steps); each is run once before it is timed.
    prefill_chunk = runner.chunk_buckets[-1]
    runner.compile_shapes([(0, fit_bucket(runner.row_buckets, b, "rows")) for b in batches]
                          + [(prefill_chunk, runner.row_buckets[0])])
    records = []
    prefill_rate = time_prefill(runner, args.prompt)
    records.append({"op": "prefill", "prompt": args.prompt, "tok_per_s": prefill_rate})
    for batch in batches:
        for mode in args.modes.split(","):
            trace_dir = (f"{args.profile}/batch{batch}"
                         if args.profile and mode == "pipelined" else None)
            rate, launch_ms = time_decode(runner, batch, args.context, args.steps,
                                          pipelined=mode == "pipelined", trace_dir=trace_dir)
            # launch_ms: the host's time inside runner.launch (packing and dispatch)
            records.append({"op": "decode", "mode": mode, "batch": batch,
                            "context": args.context, "tok_per_s": rate,
                            "ms_per_step": batch / rate * 1e3, "launch_ms": launch_ms})
            if trace_dir is not None:
                from trace_summary import summarize

                for summary in summarize(trace_dir, args.steps):
                    records.append({"op": "profile", "batch": batch, **summary})
    header = {"artifact": artifact.name, "dtype": np.dtype(runner.dtype).name,
              "row_buckets": runner.row_buckets, "chunk_buckets": runner.chunk_buckets,
              "max_context": max_context, "stable_buffers": runner.stable_buffers,
              "fused": "wqkv" in runner.params["layers"][0],
              "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "kv_dtype": runner.kv_dtype.name,
              "tensor_parallel": runner.tensor_parallel,
              "expert_parallel": runner.expert_parallel,
              "decode_split_tokens": attention_tuning.MIN_SPLIT_TOKENS,
              "merge_min_splits": attention_kernel.MERGE_KERNEL_MIN_SPLITS}
    if args.json:
        for record in records:
            print(json.dumps({**header, **record}), flush=True)
        return
    print(f"{artifact.name}: dtype {header['dtype']}, rows {runner.row_buckets}, "
          f"chunks {runner.chunk_buckets}, tensor parallel {runner.tensor_parallel}"
          f"{' (experts split)' if runner.expert_parallel else ''}")
    for record in records:
        if record["op"] == "profile":
            print(json.dumps(record))
        elif record["op"] == "prefill":
            print(f"prefill {args.prompt} tokens: {record['tok_per_s']:.0f} tok/s")
        else:
            print(f"decode batch {record['batch']} at context {args.context} "
                  f"({record['mode']}): {record['tok_per_s']:.1f} tok/s "
                  f"({record['ms_per_step']:.2f} ms/step, launch {record['launch_ms']:.2f} ms)")


if __name__ == "__main__":
    main()
