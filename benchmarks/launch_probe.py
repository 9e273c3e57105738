"""What the host pays inside one launch of the real step, by which inputs change between calls.

    python benchmarks/launch_probe.py ARTIFACT [--batches 1,64] [--calls 40] [--stable] [--json]

runner_bench's `launch_ms` (~2 ms per step on the H200 for the 8B shape) is far above what
dispatch_bench measures for the same number of arrays (~0.45 ms). One suspect is XLA's command
buffers: a CUDA graph records device addresses, and every buffer allocation whose address
changed since the previous run makes XLA update the graph nodes that read it. A step's packed
inputs and its `prev_out` are fresh buffers every call. This times the compiled step's call
(host time only, calls chained as the engine chains them) four ways:
  runner     JaxRunner.launch as the engine calls it (packing + numpy inputs)
  numpy      the executable called with numpy inputs (JAX transfers them)
  device     inputs put on the device beforehand, a fresh buffer per call
  reused     the same device input buffers every call (only prev_out/out move)
  fixed      as reused, and prev_out one fixed buffer too (nothing but `out` moves)
The four executable-level variants need the plain launch (the default: prev_out not donated);
with the runner's stable buffers (--stable) only `runner` is timed.
Set TF_CPP_VMODULE=command_buffer_thunk=3 TF_CPP_MIN_LOG_LEVEL=0 to see XLA's own lines
("Updated command buffer in N us; ... updated_allocs=K").
"""
from __future__ import annotations

import argparse
import json
import math
import time

import jax
import numpy as np

from ninfer_jax.artifact import load_artifact
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner import JaxRunner, fit_bucket
from ninfer_jax.engine.runner_api import DecodeRow, SampleSpec, StepPlan

GREEDY = SampleSpec(SamplingParams(temperature=0.0), 0)


def plan_for(runner, batch: int, position: int) -> StepPlan:
    pages = math.ceil((position + 2) / runner.page_size)
    return StepPlan(chunk=None, rows=tuple(
        DecodeRow(r, 100 + r, position, np.arange(1 + r * pages, 1 + (r + 1) * pages,
                                                  dtype=np.int32), GREEDY)
        for r in range(batch)))


def probe(runner, batch: int, calls: int) -> dict:
    plan = plan_for(runner, batch, 300)
    shape = runner._shape_for(0, batch)
    layout = runner._layout(*shape)
    specs = [None] + [row.sample for row in plan.rows]
    ints, floats = runner._packer.pack(layout, runner._host_batch((), plan.rows, *shape),
                                       specs)
    executable = (runner._greedy_executables.get(shape) if runner.greedy_variants else None) \
        or runner._executables[shape]
    fixed_prev = jax.device_put(runner._prev_out)
    results = {}

    def timed(name, call):
        seconds = []
        for i in range(calls + 3):
            started = time.perf_counter()
            call()
            if i >= 3:
                seconds.append(time.perf_counter() - started)
            if i % 2:
                runner._prev_out.block_until_ready()
        runner._prev_out.block_until_ready()
        results[name] = round(1e3 * float(np.median(seconds)), 4)

    def run(ints_in, floats_in, prev):
        out, runner.kv, runner.penalty_counts, runner.policy_table = executable(
            runner.params, runner.kv, prev, ints_in, floats_in, runner.penalty_counts,
            runner.policy_table)
        runner._prev_out = out

    timed("runner", lambda: runner.launch(plan))
    if runner.stable_buffers:
        return {"op": "launch_probe", "batch": batch, "shape": list(shape), "calls": calls,
                "stable_buffers": True, "launch_ms": results}
    timed("numpy", lambda: run(ints, floats, runner._prev_out))
    timed("device", lambda: run(jax.device_put(ints), jax.device_put(floats), runner._prev_out))
    ints_dev, floats_dev = jax.device_put(ints), jax.device_put(floats)
    timed("reused", lambda: run(ints_dev, floats_dev, runner._prev_out))
    timed("fixed", lambda: run(ints_dev, floats_dev, fixed_prev))
    return {"op": "launch_probe", "batch": batch, "shape": list(shape), "calls": calls,
            "stable_buffers": False, "launch_ms": results}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--stable", action="store_true",
                        help="the runner's stable-buffer launch (prev_out donated)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    artifact = load_artifact(args.artifact)
    max_batch = max(batches)
    runner = JaxRunner(artifact, num_pages=max_batch * 32 + 2, max_batch=max_batch,
                       max_context=512, prefill_chunk=256, background_compile=False,
                       stable_buffers=args.stable)
    runner.compile_shapes([(0, fit_bucket(runner.row_buckets, b, "rows")) for b in batches])
    for batch in batches:
        record = probe(runner, batch, args.calls)
        print(json.dumps(record) if args.json else record, flush=True)


if __name__ == "__main__":
    main()
