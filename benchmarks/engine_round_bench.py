"""Where one engine round goes on a real device: `ninfer serve`'s engine (built from the
serve flags exactly as the server builds it), N greedy streams decoding, driven round by
round on this thread as the engine thread drives them (no HTTP, no event relay).

    python3 benchmarks/engine_round_bench.py ARTIFACT [--rows 64,256] [--prompt 256]
        [--rounds 100] [--serve-args "--max-concurrency 256 --max-context 4096
        --step-shapes essential"] [--profile]

Per level: every stream's prompt is prefilled first, the level's decode shape is compiled
(if the serve flags did not) and every executable is run once, then `--rounds` steady
decode rounds are timed: tokens per second, milliseconds per round, and the engine's own
host phases per round (/metrics' ninfer_host_work_seconds_total: planning + launching,
reading the tokens back, committing; the device wait). With --profile the same number of rounds runs again under cProfile and
the functions with the most time of their own are printed: the launch's device calls show
as the C functions they are (an executable call, a transfer). benchmarks/host_bench.py is
the same loop over a device that answers at once; this one has the real runner and device.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shlex
import time

import numpy as np

from ninfer_jax.engine.request import GenerationRequest, RequestHandle, SamplingParams
from ninfer_jax.engine.runner import fit_bucket
from ninfer_jax.serve.engine_setup import build_engine
from ninfer_jax.serve.options import parse_serve_args

PHASES = ("program_submit", "program_post", "engine_commit_output")


def _rounds(engine, count: int) -> None:
    scheduler, loop = engine.scheduler, engine.loop
    for _ in range(count):
        scheduler.apply_controls()
        loop.advance()


def _phases(counters) -> dict:
    return {**{p: counters.host_work[p] for p in PHASES},
            "device_wait": counters.device_wait_seconds,
            "decode_tokens": counters.decode_tokens}


def level(engine, rows: int, *, prompt: int, rounds: int, profile: bool, seed: int) -> dict:
    scheduler, loop, runner = engine.scheduler, engine.loop, engine.runner
    rng = np.random.default_rng(seed)
    vocab = min(runner.vocab_size, 100_000)
    for i in range(rows):
        request = GenerationRequest(
            request_id=f"r{seed}-{i}", prompt_ids=rng.integers(100, vocab, prompt).tolist(),
            max_tokens=3 * rounds + 8, sampling=SamplingParams(temperature=0.0),
            ignore_eos=True)
        handle = RequestHandle(request)
        handle.forward(lambda _handle, _event: None)  # as the engine core's relay
        scheduler.add(handle)
    while scheduler.waiting or any(s.needs_prefill or not s.output_ids
                                   for s in scheduler.resident):
        scheduler.apply_controls()
        loop.advance()
    # The level's own decode shape compiled with its greedy variant (with --step-shapes
    # essential nothing else compiles beside the rounds) and everything compiled run once,
    # as before a load.
    decode_shape = (0, fit_bucket(runner.row_buckets, rows, "rows"))
    if decode_shape not in runner.compiled_shapes:
        runner.compile_shapes([decode_shape])
    while runner.prime_one():
        pass
    _rounds(engine, 5)
    loop.drain()
    before, started = _phases(scheduler.counters), time.perf_counter()
    _rounds(engine, rounds)
    loop.drain()
    elapsed = time.perf_counter() - started
    after = _phases(scheduler.counters)
    per_round = {k: round(1e3 * (after[k] - before[k]) / rounds, 3) for k in after
                 if k != "decode_tokens"}
    tokens = after["decode_tokens"] - before["decode_tokens"]
    result = {"rows": rows, "rounds": rounds, "ms_per_round": round(1e3 * elapsed / rounds, 3),
              "decode_tokens": tokens, "tok_per_s": round(tokens / elapsed, 1),
              "host_ms_per_round": per_round}
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        _rounds(engine, rounds)
        loop.drain()
        profiler.disable()
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(30)
    for seq in list(scheduler.resident) + list(scheduler.waiting):
        seq.handle.cancel()
    while scheduler.has_work() or loop.in_flight:
        scheduler.apply_controls()
        if not loop.advance():
            break
    return result


def warm_engine(artifact: str, serve_args: list[str]):
    """The engine `ninfer serve ARTIFACT SERVE_ARGS` builds, warmed up, its host tier's
    copies compiled in the background and run once (as it does while idle)."""
    engine = build_engine(parse_serve_args(artifact, serve_args))
    runner = engine.runner
    runner.warmup()
    runner.copies_compiled.wait()
    while runner.prime_one():
        pass
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--rows", default="64,256")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--serve-args", default="--max-concurrency 256 --max-context 4096 "
                        "--step-shapes essential")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    engine = warm_engine(args.artifact, shlex.split(args.serve_args))
    print(json.dumps({"built_and_warm_s": round(time.perf_counter() - started, 1),
                      "serve_args": args.serve_args}), flush=True)
    for seed, rows in enumerate(int(r) for r in args.rows.split(",")):
        print(json.dumps(level(engine, rows, prompt=args.prompt, rounds=args.rounds,
                               profile=args.profile, seed=seed)), flush=True)


if __name__ == "__main__":
    main()
