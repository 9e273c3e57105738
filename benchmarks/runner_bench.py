"""Prefill and decode speed of JaxRunner on a real artifact (default: the embedded SmolLM2).

    python benchmarks/runner_bench.py [ARTIFACT] [--batches 1,8] [--context 200]
        [--prompt 256] [--steps 64] [--max-context N] [--keep-quantized] [--stable-buffers]
        [--no-fuse] [--json] [--profile DIR] [--modes pipelined,sync]
        [--kv-dtype auto|bf16|fp8|int8|k8v4|nvfp4] [--decode-split-tokens N]
        [--merge-min-splits N]
        [--verify 1,3,7,15] [--mtp K] [--mtp-acceptance TOKENS]
        [--tensor-parallel N [--expert-parallel]] [--weights int8|fp8|int4|nvfp4|...]

Goes through the same path as the engine: padded ragged steps with on-device sampling
(greedy), decode pipelined as the engine's step loop runs it (step n+1 launched before step
n is collected, each row fed the token the previous step sampled on the device), so the
figures include host-side input building and the one device->host copy per step: the bare
step's ceiling for the live server. `sync` figures wait for every step before the next.
Compilation is excluded: the runner warms up first (set JAX_COMPILATION_CACHE_DIR to reuse
executables across runs). --json prints one JSON object per measurement. --profile DIR also
traces each batch's pipelined decode once more under jax.profiler and prints where the
device's time went per step (benchmarks/trace_summary.py; each kernel with the source lines
of the step's HLO it came from). --decode-split-tokens and
--merge-min-splits set the paged decode kernel's split and merge thresholds for A/B runs.

Speculation: --verify K,... builds the runner as `--spec` does (rows for every batch x
(K + 1); on hybrid models the verify rows chain their recurrent state) and times, per batch
B and K, a verify step (B sequences of K + 1 rows at consecutive positions, synchronous, as
the scheduler runs rounds) against the plain decode step of B rows on the same runner.
--mtp K loads the artifact's MTP head and makes every step draft K tokens with it (the
verify and decode figures then include the drafting); --mtp-acceptance N also generates N
greedy tokens of one stream through the scheduler with --spec mtp and reports how many
drafts were accepted (random weights: meaningless, but it proves the head runs).

--weights FORMAT quantizes a float artifact's projections at load, as `ninfer serve --weights`
does (engine/weight_pipeline.py), so one bf16 artifact made on the device gives the bf16 and
the quantized figures (with NINFER_W8A8 as the server reads it).

--tensor-parallel N splits the model over N devices; with --expert-parallel a MoE model's
routed experts are split by expert index instead of replicated (the A/B of issue 20's
"expert parallelism where it beats tensor parallelism": run both on the same artifact).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
import types

import numpy as np

from ninfer_jax.artifact import load_artifact
from ninfer_jax.artifact.default_model import ensure_default_artifact
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner import JaxRunner, fit_bucket, kv_dtype_for
from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec, StepPlan
from ninfer_jax.kernels import quant_matmul
from ninfer_jax.kernels.paged_attention import kernel as attention_kernel
from ninfer_jax.kernels.paged_attention import tuning as attention_tuning

GREEDY = SampleSpec(SamplingParams(temperature=0.0), 0)


def load(path, weights: str | None, **kwargs):
    """The artifact at `path` with its weights, the float projections quantized to `weights`
    while they are placed (None: as stored), as `ninfer serve --weights` loads them."""
    if weights is None:
        return load_artifact(path, **kwargs)
    from ninfer_jax.engine import weight_pipeline
    from ninfer_jax.serve.engine_setup import check_weights

    described = load_artifact(path, weights=False)
    try:  # what `ninfer serve --weights` refuses, refused alike
        check_weights(types.SimpleNamespace(weights=weights, tensor_parallel=1),
                      described.weight_formats, described.config)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    options = weight_pipeline.PipelineOptions(quantize=weights)
    return load_artifact(path, weights=True, **kwargs,
                         placement=weight_pipeline.placement(described.config, options=options))


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
                                       GREEDY if last else None,
                                       state_slot=1 if runner.has_state else 0))
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

    sampled = []

    def collect(handle):
        sampled.append(runner.collect(handle).row_tokens)

    def run(first, count):
        if not pipelined:
            for step in range(first, first + count):
                collect(launch(plan(step, False)))
            return
        in_flight = launch(plan(first, False))
        for step in range(first + 1, first + count):
            launched = launch(plan(step, True))
            collect(in_flight)
            in_flight = launched
        collect(in_flight)
    run(0, 2)
    launch_seconds.clear()
    sampled.clear()
    started = time.perf_counter()
    run(0, steps)
    rate = batch * steps / (time.perf_counter() - started)
    launch_ms = 1e3 * float(np.median(launch_seconds))
    # The timed steps' tokens: two arms that only schedule the same arithmetic differently
    # (XLA flags such as PDL) must sample the same ones.
    digest = hashlib.sha256(np.concatenate(sampled).astype(np.int32).tobytes()).hexdigest()[:16]
    if trace_dir is not None:
        import jax

        with jax.profiler.trace(trace_dir):
            run(0, steps)
    return rate, launch_ms, digest


def decode_hlo(runner, batch: int) -> str | None:
    """The optimized HLO of the executable a greedy decode step of `batch` rows runs (its
    greedy variant where the runner has one), for trace_summary's source attribution."""
    shape = (0, fit_bucket(runner.row_buckets, batch, "rows"))
    return runner.step_hlo(shape, "greedy") or runner.step_hlo(shape)


def time_verify(runner, batch: int, drafts: int, context: int, steps: int) -> float:
    """Seconds per verify step of `batch` sequences x (drafts + 1) rows, synchronous."""
    rows_per_seq = drafts + 1
    pages_per_seq = math.ceil((context + rows_per_seq + 1) / runner.page_size)
    rows = tuple(
        DecodeRow(r, 100 + i, context + i,
                  np.arange(1 + r * pages_per_seq, 1 + (r + 1) * pages_per_seq, dtype=np.int32),
                  SampleSpec(GREEDY.params, i), **({"state_slot": 1 + r} if runner.has_state
                                                   else {}))
        for r in range(batch) for i in range(rows_per_seq))
    plan = StepPlan(chunk=None, rows=rows)
    runner.collect(runner.launch(plan))
    started = time.perf_counter()
    for _ in range(steps):
        runner.collect(runner.launch(plan))
    return (time.perf_counter() - started) / steps


def mtp_acceptance(runner, num_tokens: int, drafts: int) -> dict:
    """One greedy stream through the scheduler with --spec mtp: its speculative counters."""
    from ninfer_jax.engine.config import EngineConfig
    from ninfer_jax.engine.pages import PagePool
    from ninfer_jax.engine.request import GenerationRequest, RequestHandle
    from ninfer_jax.engine.scheduler import Scheduler
    from ninfer_jax.engine.speculation import SpeculativeConfig
    from ninfer_jax.engine.state_slots import StateSlotPool
    from ninfer_jax.engine.step_loop import StepLoop

    config = EngineConfig(max_concurrency=1, prefill_chunk=runner.chunk_buckets[-1],
                          max_context=runner.max_context, prefix_reuse=False,
                          speculative=SpeculativeConfig("mtp", drafts))
    scheduler = Scheduler(config, PagePool(runner.num_pages), page_size=runner.page_size,
                          max_batch=runner.max_batch,
                          slots=StateSlotPool(runner.state_slot_capacity))
    loop = StepLoop(scheduler, runner)
    prompt = (np.arange(64) % 1000 + 100).tolist()
    scheduler.add(RequestHandle(GenerationRequest("mtp", prompt, GREEDY.params, num_tokens)))
    started = time.perf_counter()
    while scheduler.has_work() or loop.in_flight:
        scheduler.apply_controls()
        loop.advance()
    counters = scheduler.counters
    return {"op": "mtp_acceptance", "draft_tokens": drafts, "tokens": num_tokens,
            "seconds": time.perf_counter() - started, "rounds": counters.spec_rounds,
            "drafted": counters.spec_draft_tokens, "accepted": counters.spec_accepted_tokens}


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
    parser.add_argument("--weights", default=None, metavar="FORMAT",
                        help="quantize the projections at load, as `ninfer serve --weights`")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--modes", default="pipelined,sync",
                        help="decode timing modes, comma separated (pipelined, sync)")
    parser.add_argument("--kv-dtype", default="auto",
                        help="KV page storage, as `ninfer serve --kv-dtype` (auto, bf16, fp8, "
                             "int8, k8v4, nvfp4, f32)")
    parser.add_argument("--decode-split-tokens", type=int, metavar="N",
                        help="A/B: the paged decode kernel's smallest context split "
                             "(kernels/paged_attention/tuning.py MIN_SPLIT_TOKENS)")
    parser.add_argument("--merge-min-splits", type=int, metavar="N",
                        help="A/B: splits from which the merge kernel replaces the XLA merge "
                             "(kernels/paged_attention/kernel.py MERGE_KERNEL_MIN_SPLITS)")
    parser.add_argument("--verify", default="", metavar="K,...",
                        help="also time verify steps of K drafts per sequence at each batch")
    parser.add_argument("--mtp", type=int, default=0, metavar="K",
                        help="every step drafts K tokens with the artifact's MTP head")
    parser.add_argument("--mtp-acceptance", type=int, default=0, metavar="TOKENS",
                        help="with --mtp: generate TOKENS greedy tokens with --spec mtp and "
                             "report the drafts accepted")
    parser.add_argument("--profile", metavar="DIR",
                        help="trace each batch's pipelined decode under DIR/batchN and print "
                             "the device time per step by kernel")
    args = parser.parse_args()
    if args.decode_split_tokens is not None:
        attention_tuning.MIN_SPLIT_TOKENS = args.decode_split_tokens
    if args.merge_min_splits is not None:
        attention_kernel.MERGE_KERNEL_MIN_SPLITS = args.merge_min_splits
    artifact = load(args.artifact or ensure_default_artifact(), args.weights, mtp=args.mtp > 0)
    batches = [int(b) for b in args.batches.split(",")]
    verify = [int(k) for k in args.verify.split(",") if k]
    speculative = bool(verify) or args.mtp > 0
    needed = max(args.context + args.steps + max(verify, default=0) + 1, args.prompt,
                 64 + args.mtp_acceptance + args.mtp + 1)
    max_context = args.max_context or 2 ** math.ceil(math.log2(needed))
    # Pages for what the rows hold, not for a full table each: a 4k table (the server's) at
    # 256 rows would otherwise ask for 151 GB of 8B pages.
    held = min(max_context, 2 ** math.ceil(math.log2(needed)))
    pages = max(batches) * math.ceil(held / 16) + 2
    max_rows = max(batches) * (1 + max(verify + [args.mtp]))
    runner = JaxRunner(artifact, num_pages=pages, max_batch=max_rows, max_context=max_context,
                       prefill_chunk=args.prefill_chunk,
                       expand_quantized=False if args.keep_quantized else None,
                       stable_buffers=args.stable_buffers,
                       fuse_projections=False if args.no_fuse else None,
                       kv_dtype=kv_dtype_for(args.kv_dtype),
                       tensor_parallel=args.tensor_parallel,
                       expert_parallel=args.expert_parallel, speculative=speculative,
                       mtp_drafts=args.mtp, state_slot_capacity=max(batches))
    # Exactly the shapes measured (no warm-up of the serving set, no background compiles
    # competing with the timed steps); each is run once before it is timed.
    prefill_chunk = runner.chunk_buckets[-1]
    row_counts = {b * (1 + k) for b in batches for k in [0, *verify]}
    if args.mtp_acceptance:
        row_counts |= set(range(1, 2 + args.mtp))
    runner.compile_shapes(sorted({(0, fit_bucket(runner.row_buckets, n, "rows"))
                                  for n in row_counts})
                          + [(prefill_chunk, runner.row_buckets[0])])
    records = []
    prefill_rate = time_prefill(runner, args.prompt)
    records.append({"op": "prefill", "prompt": args.prompt, "tok_per_s": prefill_rate})
    for batch in batches:
        for mode in args.modes.split(","):
            trace_dir = (f"{args.profile}/batch{batch}"
                         if args.profile and mode == "pipelined" else None)
            rate, launch_ms, digest = time_decode(runner, batch, args.context, args.steps,
                                                  pipelined=mode == "pipelined",
                                                  trace_dir=trace_dir)
            # launch_ms: the host's time inside runner.launch (packing and dispatch)
            records.append({"op": "decode", "mode": mode, "batch": batch,
                            "context": args.context, "tok_per_s": rate,
                            "ms_per_step": batch / rate * 1e3, "launch_ms": launch_ms,
                            "tokens_digest": digest})
            if trace_dir is not None:
                from trace_summary import annotate, sources_or_none, summarize

                sources = sources_or_none(decode_hlo(runner, batch))
                for summary in summarize(trace_dir, args.steps):
                    records.append({"op": "profile", "batch": batch,
                                    **annotate(summary, sources)})
    for batch in batches:
        plain = time_verify(runner, batch, 0, args.context, args.steps) if verify else None
        for drafts in verify:
            seconds = time_verify(runner, batch, drafts, args.context, args.steps)
            records.append({"op": "verify", "batch": batch, "draft_tokens": drafts,
                            "rows": batch * (drafts + 1), "ms_per_step": 1e3 * seconds,
                            "plain_ms_per_step": 1e3 * plain, "relative": seconds / plain})
    if args.mtp_acceptance:
        records.append(mtp_acceptance(runner, args.mtp_acceptance, args.mtp))
    header = {"artifact": artifact.name, "mtp_drafts": args.mtp, "dtype": np.dtype(runner.dtype).name,
              "row_buckets": runner.row_buckets, "chunk_buckets": runner.chunk_buckets,
              "max_context": max_context, "stable_buffers": runner.stable_buffers,
              "fused": "wqkv" in runner.params["layers"][0],
              "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "kv_dtype": runner.kv_dtype.name, "weights": args.weights or "as stored",
              "w8a8_min_rows": quant_matmul.w8a8_min_rows(),
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
        elif record["op"] == "verify":
            print(f"verify batch {record['batch']}, K {record['draft_tokens']} "
                  f"({record['rows']} rows): {record['ms_per_step']:.2f} ms/step, "
                  f"{record['relative']:.2f}x the plain step")
        elif record["op"] == "mtp_acceptance":
            print(f"mtp K {record['draft_tokens']}: {record['accepted']}/{record['drafted']} "
                  f"drafts accepted in {record['rounds']} rounds, {record['tokens']} tokens")
        elif record["op"] == "prefill":
            print(f"prefill {args.prompt} tokens: {record['tok_per_s']:.0f} tok/s")
        else:
            print(f"decode batch {record['batch']} at context {args.context} "
                  f"({record['mode']}): {record['tok_per_s']:.1f} tok/s "
                  f"({record['ms_per_step']:.2f} ms/step, launch {record['launch_ms']:.2f} ms)")


if __name__ == "__main__":
    main()
