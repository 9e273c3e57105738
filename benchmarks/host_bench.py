"""Host work per engine round without a device: the scheduler, the runner's packing and the
engine's bookkeeping for N decoding streams, as the engine thread runs them.

The runner here is JaxRunner's host half (plans padded to a compiled shape and packed into
the two step buffers exactly as `JaxRunner.launch` does) over a device that answers at once,
so the figure is the host's own cost per step: on the H200 the device step of an 8B model is
4.9 ms at 1 row and 16 ms at 256, and the host must stay below that to keep it busy.

    PYTHONPATH=. .venv/bin/python benchmarks/host_bench.py --rows 1,8,64,256 [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import numpy as np

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import GenerationRequest, RequestHandle, SamplingParams
from ninfer_jax.engine.runner import JaxRunner, fit_bucket, row_buckets
from ninfer_jax.engine.runner_api import StepResult
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.step_loop import StepLoop
from ninfer_jax.model import packed_inputs


class HostOnlyRunner:
    """JaxRunner's launch-side host work (shape choice, `_host_batch`, packing) with an
    instant device whose samples are a fixed token."""

    def __init__(self, *, num_pages, page_size, max_batch, max_context, vocab_size):
        self.page_size, self.num_pages, self.max_batch = page_size, num_pages, max_batch
        self.max_context = max_context
        self.width = -(-max_context // page_size)
        self.chunk_segments = 1  # one chunk per step: out holds it at 0, row i at 1 + i
        self.row_buckets = row_buckets(max_batch, 2)
        self._packer = packed_inputs.HostPacker()
        self.vocab_size = vocab_size
        self.has_state = False  # a dense model: no state slots
        self.num_drafts, self.dflash = 0, None  # no speculation
        self.has_slots = False  # nor slots (a DFlash drafter would give dense models some)

    def warmup(self):
        pass

    def compile_progress(self):
        return 1, 1

    def launch(self, plan):
        rows = fit_bucket(self.row_buckets, max(1, len(plan.rows)), "rows")
        chunk = len(plan.chunk.tokens) if plan.chunk is not None else 0
        layout = packed_inputs.PackedLayout(chunk=chunk, rows=rows, width=self.width)
        specs = [plan.chunk.sample if plan.chunk is not None else None] + \
            [row.sample for row in plan.rows]
        batch = JaxRunner._host_batch(self, plan.chunks, plan.rows, chunk, rows)
        self._packer.pack(layout, batch, specs)
        return plan

    def wait(self, plan):
        pass

    def collect(self, plan):
        return StepResult(chunk_token=7 if plan.chunk is not None and plan.chunk.sample
                          else None, row_tokens=np.full(len(plan.rows), 5, np.int32))


def run(num_rows: int, *, prompt: int, steps: int, profile: bool) -> dict:
    page_size, max_context = 16, 4096
    num_pages = num_rows * (max_context // page_size) + 1
    runner = HostOnlyRunner(num_pages=num_pages, page_size=page_size, max_batch=num_rows,
                            max_context=max_context, vocab_size=151_936)
    config = EngineConfig(max_concurrency=num_rows, max_context=max_context,
                          kv_capacity=(num_pages - 1) * page_size)
    scheduler = Scheduler(config, PagePool(num_pages), page_size=page_size,
                          max_batch=num_rows, eos_ids=())
    loop = StepLoop(scheduler, runner)
    rng = np.random.default_rng(0)
    handles, outbox = [], []
    for i in range(num_rows):
        request = GenerationRequest(
            request_id=f"r{i}", prompt_ids=rng.integers(0, 150_000, prompt).tolist(),
            max_tokens=max_context - prompt - 1, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
        handle = RequestHandle(request)
        handle.forward(lambda _handle, event: outbox.append(event))  # as the engine core does
        scheduler.add(handle)
        handles.append(handle)
    while any(s.needs_prefill or not s.output_ids for s in scheduler.resident) or \
            scheduler.waiting:  # prefill everything first
        scheduler.apply_controls()
        loop.advance()
    loop.drain()
    outbox.clear()  # what the core's sender would have taken
    profiler = cProfile.Profile() if profile else None
    started, cpu_started = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    for _ in range(steps):
        scheduler.apply_controls()
        loop.advance()
        outbox.clear()
    if profiler:
        profiler.disable()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    loop.drain()
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    # CPU time too: on a shared host the wall clock also counts other processes' turns
    return {"rows": num_rows, "host_ms_per_step": 1e3 * elapsed / steps,
            "host_cpu_ms_per_step": 1e3 * cpu / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,8,64,256")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    for rows in [int(r) for r in args.rows.split(",")]:
        print(json.dumps(run(rows, prompt=args.prompt, steps=args.steps,
                             profile=args.profile)), flush=True)


if __name__ == "__main__":
    main()
