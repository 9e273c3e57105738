"""One device call that measures the 8B server against its bare step.

    python3 benchmarks/gpu_serve_bench.py [--out DIR] [--stages A,B] [--presets qwen3-8b]
    .venv/bin/python benchmarks/gpu_serve_bench.py --smoke     # CPU check, tiny model

Stages, in this order, each under its own time cap, all inside --total seconds (a stalled
stage is killed and the next runs on what is left):
  install       the carried wheels (--wheels) into /tmp/site with the device README's command
  artifact      `ninfer init-random --preset P` into --work (local disk, not $OUT)
  step          benchmarks/runner_bench.py on it: the bare step, decode tok/s per batch
  cold          `ninfer serve` with an EMPTY compilation cache: process start -> /health ok
  warm          the same with the cache the cold start filled; this server stays up for:
  load          benchmarks/serve_bench.py per concurrency level, server/step ratios
  interference  serve_bench.py --interference: decoding streams, then one long prompt
Everything runs as a subprocess of this script (which needs only the standard library), so a
cap is a kill. Under --out ($OUT on the device): results.jsonl (one JSON object per
measurement, each with the exact command that produced it), stages.log (the output of the
install, artifact, step and load commands), server-cold.log and server-warm.log.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shlex
import shutil
import sys

from proclib import (REPO, Budget, Results, Server, dir_size, free_port, http_get,
                     parse_metrics, run_capped)

STAGES = ("install", "artifact", "step", "cold", "warm", "load", "interference")
# A load level or the interference run starts only with this much of --total left.
MIN_MEASURE_S = 30.0
# Start-up lines of the server log copied into its record (milestones and failures).
LOG_HIGHLIGHTS = r"(?i)compil|warm|KV pool|lanes|ready|listening|error|cannot|Traceback|weights read"
# Counters read from /metrics before and after each load level.
METRICS = ("ninfer_decode_rounds_total", "ninfer_decode_rows_total",
           "ninfer_prefill_units_total", "ninfer_device_wait_seconds_total",
           "ninfer_preemptions_total", "ninfer_generation_tokens_total",
           "ninfer_host_work_seconds_total:phase", "ninfer_step_launches_total:kind",
           "ninfer_step_launch_seconds_total:kind")

GPU_DEFAULTS = dict(
    presets="qwen3-8b", work="/tmp/gsb", total=560.0,
    serve_args="--max-concurrency 256 --max-context 4096 --http-threads 320",
    # The server's max context: the page table's width shapes the decode kernel's splits
    # (a 512-token table made the step look twice as fast as the server at 64 rows, run 41).
    runner_args="--batches 1,8,64,256 --context 384 --prompt 256 --steps 32 --max-context 4096 "
                "--json",
    levels="1,8,64,256", prompt_tokens=256, max_tokens=256, min_requests=4,
    interference=63, long_prompt=4000, interference_max_tokens=2048,
    caps="install=60,artifact=150,step=150,cold=200,compiled=150,warm=120,level=90,"
         "interference=90")
SMOKE_DEFAULTS = dict(
    presets="qwen3-tiny", work="/tmp/gsb-smoke", total=400.0,
    serve_args="--max-concurrency 4 --max-context 512 --http-threads 16 --prefill-chunk 256",
    runner_args="--batches 1,2 --context 48 --prompt 32 --steps 4 --json",
    levels="1,2", prompt_tokens=32, max_tokens=8, min_requests=2,
    interference=3, long_prompt=300, interference_max_tokens=200,
    caps="install=60,artifact=60,step=120,cold=120,compiled=60,warm=90,level=60,"
         "interference=60")


def parse_runner_output(text: str) -> dict:
    """Decode tok/s per batch (and prefill tok/s) from runner_bench's output: JSON lines with
    a batch-like and a rate-like field, or the text lines `decode batch B ...: R tok/s`."""
    decode, prefill, records = {}, None, []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            records.append(obj)
            if obj.get("mode") == "sync":
                continue  # the ceiling is the pipelined step, as the engine runs it
            kind = str(next((obj[k] for k in ("kind", "op", "phase") if k in obj), "decode"))
            batch = next((obj[k] for k in ("batch", "rows", "num_rows") if k in obj), None)
            rate = next((obj[k] for k in ("decode_tok_s", "tok_s", "tokens_per_s",
                                          "tok_per_s") if k in obj), None)
            if "prefill" in kind and rate is not None:
                prefill = float(rate)
            elif batch is not None and rate is not None:
                decode[int(batch)] = float(rate)
            if obj.get("prefill_tok_s") is not None:
                prefill = float(obj["prefill_tok_s"])
            continue
        match = re.search(r"decode batch (\d+)\D.*?([\d.]+) tok/s", line)
        if match:
            decode[int(match.group(1))] = float(match.group(2))
        match = re.search(r"prefill (\d+) tokens: ([\d.]+) tok/s", line)
        if match:
            prefill = float(match.group(2))
    return {"decode_tok_s": decode, "prefill_tok_s": prefill, "json_records": records}


class Bench:
    """The stages of one call; each method records its own measurements."""

    def __init__(self, args):
        self.args, self.py = args, sys.executable
        self.results = Results(os.path.join(args.out, "results.jsonl"))
        self.budget = Budget(args.total, args.reserve)
        self.caps = {k: float(v) for k, v in (p.split("=") for p in args.caps.split(","))}
        self.stages_log = os.path.join(args.out, "stages.log")
        self.site = None  # /tmp/site once the wheels are installed

    def env(self, cache_dir: str | None = None) -> dict:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (REPO, self.site, os.environ.get("PYTHONPATH")) if p)
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        if cache_dir:
            env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
        return env

    def capped(self, stage: str, cap_key: str | None = None,
               least_s: float = 0.0) -> float | None:
        """The stage's cap within what is left of --total; None (and a skipped record) when
        less than `least_s` is left: a load level cut after a few seconds measures nothing
        (run 44's 64 level got 6 s and was killed)."""
        cap = self.budget.cap(self.caps[cap_key or stage])
        if cap is None or cap < least_s:
            left = "no time" if cap is None else f"only {cap:.0f} s"
            self.results.add(stage, "", skipped=f"{left} left in --total")
            return None
        return cap

    def capped_seconds(self, cap_key: str) -> float:
        """A cap for a wait inside a stage (0 when no time is left)."""
        return self.budget.cap(self.caps[cap_key]) or 0.0

    def install(self) -> None:
        wheels = sorted(glob.glob(os.path.join(self.args.wheels, "*.whl")))
        command = [self.py, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                   "--no-compile", "--no-cache-dir", "--upgrade", "--target", "/tmp/site",
                   *wheels]
        if not wheels:
            self.results.add("install", command, skipped=f"no wheels in {self.args.wheels}")
            return
        cap = self.capped("install")
        if cap is None:
            return
        run = run_capped(command, cap, self.stages_log, self.env())
        if run["rc"] == 0:
            self.site = "/tmp/site"
        self.results.add("install", command, rc=run["rc"], seconds=run["seconds"],
                         timed_out=run["timed_out"],
                         wheels=[os.path.basename(w) for w in wheels])

    def artifact(self, preset: str, path: str) -> bool:
        command = [self.py, "-m", "ninfer_jax.cli.main", "init-random", "--preset", preset,
                   path, "--force"]
        if os.path.exists(os.path.join(path, "metadata.json")) and not self.args.fresh:
            self.results.add("artifact", command, preset=preset, reused=path)
            return True
        cap = self.capped("artifact")
        if cap is None:
            return False
        run = run_capped(command, cap, self.stages_log, self.env())
        self.results.add("artifact", command, preset=preset, rc=run["rc"],
                         seconds=run["seconds"], timed_out=run["timed_out"],
                         gib=round(dir_size(path)["mib"] / 1024, 2))
        return run["rc"] == 0

    def step(self, preset: str, path: str) -> dict:
        cache = os.path.join(self.args.work, f"jax-cache-step-{preset}")
        command = [self.py, "benchmarks/runner_bench.py", path,
                   *shlex.split(self.args.runner_args)]
        cap = self.capped("step")
        if cap is None:
            return {}
        run = run_capped(command, cap, self.stages_log, self.env(cache))
        parsed = parse_runner_output(run["stdout"])
        self.results.add("step", command, preset=preset, rc=run["rc"], seconds=run["seconds"],
                         timed_out=run["timed_out"], decode_tok_s=parsed["decode_tok_s"],
                         prefill_tok_s=parsed["prefill_tok_s"],
                         runner_json=parsed["json_records"],
                         stdout_tail=run["stdout"][-2000:])
        return parsed["decode_tok_s"]

    def serve(self, stage: str, preset: str, path: str, cache: str) -> Server | None:
        """Start a server and time it to /health ok; the caller stops it. `stage` is cold,
        warm or start (a first start that is not the cold measurement)."""
        port = free_port()
        command = [self.py, "-m", "ninfer_jax.cli.main", "serve", path, "--host", "127.0.0.1",
                   "--port", str(port), *shlex.split(self.args.serve_args)]
        cap = self.capped(stage, "cold" if stage == "cold" else "warm")
        if cap is None:
            return None
        before = dir_size(cache)
        server = Server(command, self.env(cache), os.path.join(self.args.out,
                                                               f"server-{stage}.log"),
                        f"http://127.0.0.1:{port}")
        timeline = server.start_and_wait(cap)
        self.results.add(stage, command, preset=preset, cache_before=before, **timeline,
                         log=server.log_lines(LOG_HIGHLIGHTS))
        if timeline["ready_s"] is None:
            server.stop(grace_s=0)  # a worker still loading ignores SIGTERM
            return None
        return server

    def load(self, preset: str, server: Server, step: dict,
             all_compiled: bool | None = None) -> None:
        for concurrency in (int(c) for c in self.args.levels.split(",")):
            per_client = max(1, math.ceil(self.args.min_requests / concurrency))
            command = self.serve_bench(server, "--concurrency", str(concurrency),
                                       "--requests-per-client", str(per_client),
                                       "--max-tokens", str(self.args.max_tokens))
            record = self.serve_bench_run("load", "level", command, server, preset)
            if record is None:
                continue
            bare = step.get(concurrency)
            rate, engine_rate = record.get("decode_tok_s"), record.get("server_decode_tok_s")
            full = record.get("full_decode_tok_s")
            self.results.add("load", command, preset=preset, **record,
                             all_shapes_compiled=all_compiled, step_decode_tok_s=bare,
                             server_over_step=rate / bare if rate and bare else None,
                             full_over_step=full / bare if full and bare else None,
                             engine_over_step=engine_rate / bare if engine_rate and bare
                             else None)

    def interference(self, preset: str, server: Server) -> None:
        command = self.serve_bench(server, "--interference", str(self.args.interference),
                                   "--long-prompt", str(self.args.long_prompt),
                                   "--max-tokens", str(self.args.interference_max_tokens))
        record = self.serve_bench_run("interference", "interference", command, server,
                                      preset)
        if record is not None:
            self.results.add("interference", command, preset=preset, **record)

    def serve_bench(self, server: Server, *extra: str) -> list[str]:
        return [self.py, "benchmarks/serve_bench.py", "--url", server.url, "--api",
                "completions", "--prompt-tokens", str(self.args.prompt_tokens), "--json",
                *extra]

    def serve_bench_run(self, stage: str, cap_key: str, command: list[str], server: Server,
                        preset: str) -> dict | None:
        """Run one serve_bench command; its JSON record plus the /metrics counter deltas."""
        cap = self.capped(stage, cap_key, least_s=MIN_MEASURE_S)
        if cap is None:
            return None
        before = parse_metrics(http_get(server.url + "/metrics")[1], METRICS)
        run = run_capped(command, cap, self.stages_log, self.env())
        after = parse_metrics(http_get(server.url + "/metrics")[1], METRICS)
        lines = [json.loads(x) for x in run["stdout"].splitlines() if x.startswith("{")]
        if run["rc"] != 0 or not lines:
            self.results.add(stage, command, preset=preset, rc=run["rc"],
                             seconds=run["seconds"], timed_out=run["timed_out"], failed=True,
                             server_alive=server.proc.poll() is None)
            return None
        return {**lines[-1], "seconds": run["seconds"],
                "metrics_delta": {k: after[k] - before.get(k, 0.0) for k in after}}


def run_preset(bench: Bench, preset: str) -> None:
    args, stages = bench.args, set(args_stages(bench.args))
    path = args.artifact or os.path.join(args.work, f"{preset}.ninfer")
    if "artifact" in stages and not args.artifact and not bench.artifact(preset, path):
        return
    if not os.path.exists(os.path.join(path, "metadata.json")):
        bench.results.add("artifact", "", preset=preset, skipped=f"no artifact at {path}")
        return
    step = bench.step(preset, path) if "step" in stages else {}
    cache = os.path.join(args.work, f"jax-cache-serve-{preset}")
    shutil.rmtree(cache, ignore_errors=True)  # the cold start's cache must be empty
    if "cold" in stages:
        server = bench.serve("cold", preset, path, cache)
        if server is not None:
            # Let the background compiles finish so the restart finds every shape cached.
            compiled = server.wait_compiled(bench.capped_seconds("compiled"))
            bench.results.add("cold", "", preset=preset, **compiled, stop_s=server.stop(),
                              cache_after=dir_size(cache))
    if not stages & {"warm", "load", "interference"}:
        return
    # Without a cold start before it (--stages), this start has an empty cache too.
    label = "warm" if dir_size(cache)["files"] else "start"
    server = bench.serve(label, preset, path, cache)
    if server is None:
        return
    try:
        compiled = server.wait_compiled(bench.capped_seconds("compiled"))
        bench.results.add(label, "", preset=preset, **compiled)
        if "load" in stages:
            # Levels measured while shapes still compile run on the nearest compiled bucket
            # beside the compiler (run 30): their records say so.
            bench.load(preset, server, step, all_compiled=compiled.get("all_compiled"))
        if "interference" in stages:
            bench.interference(preset, server)
    finally:
        bench.results.add(label, "", preset=preset, stop_s=server.stop())


def print_summary(rows: list[dict]) -> None:
    print("\nstage         preset        figure")
    for row in rows:
        stage, preset = row["stage"], row.get("preset", "")
        if "skipped" in row or row.get("failed") or row.get("timed_out"):
            figure = row.get("skipped") or f"FAILED rc={row.get('rc')} " \
                f"timed_out={row.get('timed_out')}"
        elif stage in ("cold", "warm", "start") and "ready_s" in row:
            figure = (f"listening {row['listening_s']} s, /health ok {row['ready_s']} s"
                      if row["ready_s"] is not None else
                      f"NOT READY: exited rc={row['exit_rc']}; see server-{stage}.log")
        elif stage == "step":
            figure = f"decode tok/s {row['decode_tok_s']}, prefill {row['prefill_tok_s']}"
        elif stage == "load":
            figure = (f"C={row['concurrency']}: decode {_fmt(row['decode_tok_s'])} tok/s "
                      f"(engine {_fmt(row.get('server_decode_tok_s'))}), "
                      f"per request {_fmt(row['request_tok_s_p50'])}, TTFT p50 "
                      f"{_fmt(row['ttft_p50_s'], 3)} s, ITL p50/p99/max "
                      f"{_fmt(row['itl_p50_s'], 3)}/{_fmt(row['itl_p99_s'], 3)}/"
                      f"{_fmt(row['itl_max_s'], 3)} s, server/step "
                      f"{_fmt(row['server_over_step'], 2)}; all streams decoding "
                      f"{_fmt(row.get('full_decode_tok_s'))} tok/s for "
                      f"{_fmt(row.get('full_window_s'), 2)} s "
                      f"({_fmt(row.get('full_over_step'), 2)} of the step), end to end "
                      f"{_fmt(row.get('output_tok_s'))}")
            if row.get("all_shapes_compiled") is False:
                figure += " [shapes still compiling: not a steady-state figure]"
        elif stage == "interference":
            figure = (f"long TTFT {_fmt(row['long_ttft_s'], 3)} s, stream gap max "
                      f"{_fmt(row['stream_gap_max_during_s'], 3)} s (before "
                      f"{_fmt(row['stream_gap_max_before_s'], 3)} s)")
        else:
            continue
        print(f"{stage:<13} {preset:<13} {figure}")


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="CPU check: a tiny model, small levels (defaults below change)")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/gsb-out"))
    parser.add_argument("--work", help="local disk for artifacts and compilation caches")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--presets", help="init-random presets, run one after another")
    parser.add_argument("--artifact", default=None, help="use this artifact, no init-random")
    parser.add_argument("--fresh", action="store_true", help="rebuild an existing artifact")
    parser.add_argument("--wheels", default=os.path.join(REPO, ".whl"))
    parser.add_argument("--total", type=float, help="seconds for the whole call")
    parser.add_argument("--reserve", type=float, default=15.0,
                        help="seconds kept back at the end (stopping the server, the summary)")
    parser.add_argument("--caps", help="per-stage caps in seconds, stage=s,...; 'level' caps "
                                       "each load level")
    parser.add_argument("--serve-args", help="flags after `ninfer serve ART --port P`")
    parser.add_argument("--runner-args", help="flags after `runner_bench.py ART`")
    parser.add_argument("--levels", help="load concurrency levels, comma separated")
    parser.add_argument("--prompt-tokens", type=int)
    parser.add_argument("--max-tokens", type=int, help="output tokens per load request")
    parser.add_argument("--min-requests", type=int, help="requests per level at least")
    parser.add_argument("--interference", type=int, help="decoding streams")
    parser.add_argument("--long-prompt", type=int, help="the late prompt's tokens")
    parser.add_argument("--interference-max-tokens", type=int,
                        help="the decoding streams' max_tokens (long enough to outlast it)")
    args = parser.parse_args(argv)
    for key, value in (SMOKE_DEFAULTS if args.smoke else GPU_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    unknown = set(args_stages(args)) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; choose from {', '.join(STAGES)}")
    return args


def args_stages(args) -> list[str]:
    return [s for s in args.stages.split(",") if s]


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    bench = Bench(args)
    print(f"gpu_serve_bench: stages {args.stages}, presets {args.presets}, "
          f"total {args.total:.0f} s, out {args.out}", flush=True)
    if "install" in args_stages(args):
        bench.install()
    for preset in args.presets.split(","):
        run_preset(bench, preset)
    print_summary(bench.results.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
