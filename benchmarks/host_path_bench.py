"""The live server's host path without a device: `ninfer serve`'s real launcher, gunicorn
HTTP worker(s), EngineClient and engine-core process, over an engine whose runner does the
JaxRunner's launch-side host work (shape choice, `_host_batch`, packing) and hands the step to
a fake device thread that sleeps for a modelled step time (the GIL released, as a GPU step
is) and answers with word-like token ids. serve_bench's streaming completions load is then
measured against the ideal rate the modelled device allows (rows / step time), with the
engine's per-round /metrics (program_submit, device wait, ...) and the CPU each process, and
each engine-core thread, spent.

    PYTHONPATH=. .venv/bin/python benchmarks/host_path_bench.py --concurrency 1 8 64 \
        [--step-ms 6.0 --row-ms 0.044 --chunk-token-ms 0.02] [--http-workers 1] [--json]

The default device model is run 40's H100 Qwen3-8B bare step (runner_bench: 6.1 ms at 1
row, 8.8 ms at 64); a chunk adds `--chunk-token-ms` per prompt token. `serve` (an internal
sub-command) is the server side: the launcher with `engine_setup.core_spec` replaced, so
nothing in ninfer_jax knows about this bench. The artifact only lends its tokenizer and
template (default: the embedded SmolLM2 artifact); no weights are read.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from proclib import REPO, http_get, parse_metrics  # noqa: E402

METRICS = ("ninfer_decode_rounds_total", "ninfer_decode_rows_total",
           "ninfer_prefill_units_total", "ninfer_device_wait_seconds_total",
           "ninfer_generation_tokens_total", "ninfer_host_work_seconds_total:phase")
DEFAULT_ARTIFACT = os.path.join(REPO, "artifacts", "smollm2-135m-instruct.ninfer")
WORD_IDS = (1000, 20000)  # output ids: ordinary BPE pieces of SmolLM2's vocabulary
PROBE_PERIOD_S = 0.25


@dataclasses.dataclass(frozen=True)
class DeviceModel:
    step_ms: float = 6.0  # a step's fixed cost (dispatch, weights read once)
    row_ms: float = 0.044  # per decode row
    chunk_token_ms: float = 0.02  # per prompt token of the step's chunk
    # The engine thread's cost of dispatching a step (JaxRunner's executable call on a GPU:
    # 3.1 ms a round at 1 row in run 40, planning included): `dispatch_ms` with the GIL
    # released (XLA's execute), `dispatch_hold_ms` holding it (argument processing).
    dispatch_ms: float = 0.0
    dispatch_hold_ms: float = 0.0
    # Long-lived objects a background compile leaves after warm-up's gc.freeze (full
    # collections walk them with the GIL held; the GC share figure shows what that costs).
    leftover_objects: int = 0

    def step_s(self, rows: int, chunk_tokens: int) -> float:
        return 1e-3 * (self.step_ms + self.row_ms * rows + self.chunk_token_ms * chunk_tokens)


# ---------------------------------------------------------------------------- core side


def timed_runner_class():
    """TimedRunner, defined on first use: only the core process imports the engine's runner
    modules (the driver needs none of them)."""
    from ninfer_jax.engine.fake import FakeRunner, _Launched
    from ninfer_jax.engine.runner import JaxRunner, fit_bucket, row_buckets
    from ninfer_jax.engine.runner_api import StepResult
    from ninfer_jax.model import packed_inputs

    class TimedRunner(FakeRunner):
        """FakeRunner's asynchronous dispatch with JaxRunner's host-side packing at launch
        and a device that only sleeps: no KV, no token formula (their Python loops would
        hold the GIL, which a GPU does not)."""

        def __init__(self, device: DeviceModel, *, num_pages, page_size, max_batch,
                     max_context, vocab_size, prefill_chunk):
            super().__init__(num_pages=1, page_size=page_size, max_batch=max_batch,
                             vocab_size=1, penalty_lanes=max_batch)
            self.num_pages, self.vocab_size, self.device = num_pages, vocab_size, device
            self.max_context = max_context
            self.width = -(-max_context // page_size)
            self.row_buckets = row_buckets(max_batch, 2)
            self.chunk_buckets = (prefill_chunk,)
            self.has_slots, self.num_drafts, self.dflash = False, 0, None
            self._packer = packed_inputs.HostPacker()
            self.busy_s = 0.0  # the fake device's sleeps, read by the probe

        def warmup(self):
            super().warmup()
            threading.Thread(target=self._compile_in_background, daemon=True,
                             name="bench-compile").start()

        def _compile_in_background(self):
            """What JaxRunner's background compiles leave on the heap after warm-up's
            gc.freeze: `leftover_objects` long-lived containers (traced jaxprs and the like;
            SmolLM2 on CPU: 257k for 5 shapes)."""
            time.sleep(0.2)
            self.leftovers = [[i, (i,)] for i in range(self.device.leftover_objects)]


        def launch(self, plan):
            unit, rows = plan.chunk, plan.rows
            num_rows = fit_bucket(self.row_buckets, max(1, len(rows)), "row count")
            chunk = fit_bucket(self.chunk_buckets, len(unit.tokens), "chunk") if unit else 0
            layout = packed_inputs.PackedLayout(chunk=chunk, rows=num_rows, width=self.width)
            specs = [unit.sample if unit is not None else None] + [r.sample for r in rows]
            self._packer.pack(layout, JaxRunner._host_batch(self, plan.chunks, rows, chunk, num_rows),
                              specs)
            if self.device.dispatch_hold_ms:
                until = time.perf_counter() + 1e-3 * self.device.dispatch_hold_ms
                while time.perf_counter() < until:
                    pass
            if self.device.dispatch_ms:
                time.sleep(1e-3 * self.device.dispatch_ms)
            return self._dispatch(_Launched(plan))

        def _run(self, plan):
            unit = plan.chunk
            seconds = self.device.step_s(len(plan.rows), len(unit.tokens) if unit else 0)
            time.sleep(seconds)
            self.busy_s += seconds
            low, high = WORD_IDS
            tokens = np.array([low + (r.seq_id * 7919 + r.position * 104729) % (high - low)
                               for r in plan.rows], np.int32)
            chunk_token = low + unit.seq_id % (high - low) if unit and unit.sample else None
            return StepResult(chunk_token=chunk_token, row_tokens=tokens)

    return TimedRunner


def timed_engine(config, device: DeviceModel, probe_path: str, switch_interval: float = 0):
    """The engine-core factory: an Engine over TimedRunner, configured from the serve
    options exactly as the real one (EngineConfig.from_serve_config). `switch_interval`
    (seconds, 0: the core's own) replaces the core's GIL switch interval."""
    if switch_interval:
        sys.setswitchinterval(switch_interval)
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.engine.config import EngineConfig
    from ninfer_jax.engine.engine import Engine

    artifact = load_artifact(config.artifact, weights=False)
    engine_config = EngineConfig.from_serve_config(config)
    page_size = 16
    runner = timed_runner_class()(
        device, num_pages=engine_config.num_pages(page_size), page_size=page_size,
        max_batch=engine_config.max_concurrency, max_context=engine_config.max_context,
        vocab_size=artifact.config.vocab_size, prefill_chunk=engine_config.prefill_chunk)
    threading.Thread(target=_probe_threads, args=(probe_path, runner), name="bench-probe",
                     daemon=True).start()
    engine = Engine(runner, engine_config, eos_ids=())
    if os.environ.get("HOST_PATH_PROFILE"):
        _profile_rounds(engine, os.environ["HOST_PATH_PROFILE"])
    return engine


def _profile_rounds(engine, path: str) -> None:
    """cProfile the engine thread's rounds, dumping the stats to `path` every 200 rounds
    (the core leaves with os._exit, so there is no dump at exit)."""
    import cProfile

    profiler, rounds, original = cProfile.Profile(), [0], engine._round

    def profiled_round():
        profiler.enable()
        try:
            return original()
        finally:
            profiler.disable()
            rounds[0] += 1
            if rounds[0] % 200 == 0:
                profiler.dump_stats(path)

    engine._round = profiled_round


def _probe_threads(path: str, runner) -> None:
    """Every PROBE_PERIOD_S: the CPU seconds of each thread of this process, by Python
    thread name (from /proc/self/task), and the device's busy seconds (`device_busy`),
    written atomically to `path` for the driver."""
    ticks = os.sysconf("SC_CLK_TCK")
    while True:
        names = {t.native_id: t.name for t in threading.enumerate()}
        from ninfer_jax.engine.step_loop import GC_CLOCK

        cpu: dict = {"device_busy": runner.busy_s, "gc": GC_CLOCK.seconds}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            name = names.get(int(tid), "other")
            name = "ninfer-core-recv" if name.startswith("ninfer-core-recv") else name
            cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
        with open(path + ".tmp", "w") as handle:
            json.dump(cpu, handle)
        os.replace(path + ".tmp", path)
        time.sleep(PROBE_PERIOD_S)


def serve(args) -> None:
    from ninfer_jax.engine.core_process import CoreSpec
    from ninfer_jax.serve import engine_setup, launcher
    from ninfer_jax.serve.config import ServeConfig

    device = device_model(args)

    def core_spec(config, base_env):
        return CoreSpec(factory=timed_engine, args=(config, device, args.probe,
                                                           args.switch_interval_ms / 1e3),
                        logging=launcher.logging_config(config.log_level))

    engine_setup.core_spec = core_spec  # the one hook: the launcher builds this core
    launcher.run_server(ServeConfig(
        artifact=args.artifact, host="127.0.0.1", port=args.port,
        max_concurrency=args.lanes, max_context=args.max_context, kv_capacity=args.kv_tokens,
        http_workers=args.http_workers, log_stats_interval_ms=args.log_stats_ms,
        response_store_max_records=0 if args.http_workers > 1 else 1000))


# ---------------------------------------------------------------------------- driver side


def device_model(args) -> DeviceModel:
    return DeviceModel(args.step_ms, args.row_ms, args.chunk_token_ms, args.dispatch_ms,
                       args.dispatch_hold_ms, args.leftover_objects)


def process_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


def process_table(launcher_pid: int) -> dict:
    """CPU seconds of the launcher, the core and each worker (by role)."""
    table = {"launcher": process_cpu(launcher_pid)}
    for pid in children(launcher_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        role = "core" if b"multiprocessing" in cmdline else "http_worker"
        table[role] = table.get(role, 0.0) + process_cpu(pid)
    return table


def read_probe(path: str) -> dict:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def rounds_of(metrics: dict) -> float:
    return metrics.get("ninfer_decode_rounds_total") or 1.0


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def measure_level(args, serve_bench, url: str, launcher_pid: int, concurrency: int) -> dict:
    device = device_model(args)
    level_args = serve_bench.parse_args([
        "--url", url, "--api", "completions", "--prompt-tokens", str(args.prompt_tokens),
        "--max-tokens", str(args.max_tokens), "--requests-per-client",
        str(args.requests_per_client)])
    level_args.headers = {}
    level_args.model = serve_bench.model_id(level_args)
    metrics_before = parse_metrics(http_get(url + "/metrics")[1], METRICS)
    cpu_before, probe_before = process_table(launcher_pid), read_probe(args.probe)
    client_before = time.process_time()
    record = serve_bench.run_level(level_args, concurrency)
    client_cpu = time.process_time() - client_before
    time.sleep(2 * PROBE_PERIOD_S)
    metrics = delta(parse_metrics(http_get(url + "/metrics")[1], METRICS), metrics_before)
    cpu = delta(process_table(launcher_pid), cpu_before)
    threads = delta(read_probe(args.probe), probe_before)
    busy = threads.pop("device_busy", 0.0)
    gc_s = threads.pop("gc", 0.0)
    host_s = sum(v for k, v in metrics.items() if k.startswith("ninfer_host_work"))
    host_s -= rounds_of(metrics) * 1e-3 * device.dispatch_ms  # modelled: not CPU
    rounds = metrics.get("ninfer_decode_rounds_total") or 1.0
    per_round = {key.split("=")[-1]: round(1e3 * value / rounds, 3) for key, value in
                 metrics.items() if key.startswith("ninfer_host_work")}
    per_round["device_wait"] = round(1e3 * metrics.get("ninfer_device_wait_seconds_total", 0)
                                     / rounds, 3)
    rows = metrics.get("ninfer_decode_rows_total", 0) / rounds
    ideal = concurrency / device.step_s(concurrency, 0)
    wall = record["wall_s"]
    return {
        "concurrency": concurrency, "http_workers": args.http_workers,
        "device": dataclasses.asdict(device),
        "decode_tok_s": record["decode_tok_s"], "output_tok_s": record["output_tok_s"],
        "ideal_tok_s": ideal, "live_over_ideal": (record["decode_tok_s"] or 0) / ideal,
        "ttft_p50_s": record["ttft_p50_s"], "ttft_p99_s": record["ttft_p99_s"],
        "itl_p50_s": record["itl_p50_s"], "itl_p99_s": record["itl_p99_s"],
        "itl_max_s": record["itl_max_s"], "num_errors": record["num_errors"],
        "device_busy": round(busy / wall, 3), "gc_share": round(gc_s / wall, 4),
        # the engine thread's host phases: wall seconds over its CPU seconds (above 1: it
        # waited for the GIL or a core while it should have worked)
        "engine_wall_over_cpu": round(host_s / threads["ninfer-engine"], 2)
        if threads.get("ninfer-engine") else None,
        "rounds": rounds, "rows_per_round": round(rows, 2), "ms_per_round": per_round,
        "round_ms": round(1e3 * wall / rounds, 3),
        "cpu_share": {k: round(v / wall, 3) for k, v in {**cpu, "client": client_cpu}.items()},
        "core_thread_share": {k: round(v / wall, 3) for k, v in sorted(threads.items())
                              if v > 0},
        "wall_s": wall,
    }


def start_server(args) -> subprocess.Popen:
    command = [sys.executable, os.path.abspath(__file__), "serve", "--port", str(args.port),
               "--artifact", args.artifact, "--lanes", str(args.lanes), "--max-context",
               str(args.max_context), "--kv-tokens", str(args.kv_tokens), "--http-workers", str(args.http_workers),
               "--step-ms", str(args.step_ms), "--row-ms", str(args.row_ms),
               "--chunk-token-ms", str(args.chunk_token_ms), "--dispatch-ms",
               str(args.dispatch_ms), "--dispatch-hold-ms", str(args.dispatch_hold_ms),
               "--switch-interval-ms", str(args.switch_interval_ms), "--probe", args.probe,
               "--leftover-objects", str(args.leftover_objects),
               "--log-stats-ms", str(args.log_stats_ms)]
    log = open(args.log, "a")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                              start_new_session=True,
                              env={**os.environ, "PYTHONPATH": REPO})
    log.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.poll() is None:
        if http_get(f"http://127.0.0.1:{args.port}/health")[0] == 200:
            return server
        time.sleep(0.25)
    stop_server(server)
    raise RuntimeError(f"the server did not come up; see {args.log}")


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.terminate()  # gunicorn's graceful stop: workers, then the core
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()


def drive(args) -> None:
    import serve_bench

    server = start_server(args)
    try:
        url = f"http://127.0.0.1:{args.port}"
        if args.leftover_objects:
            time.sleep(3)  # the "background compile" is over, as gpu_serve_bench waits for
        serve_bench.one_request(*_warm(serve_bench, url, args))
        for _ in range(args.repeat):
            for concurrency in args.concurrency:
                record = measure_level(args, serve_bench, url, server.pid, concurrency)
                if args.json:
                    print(json.dumps(record), flush=True)
                else:
                    print_record(record)
    finally:
        stop_server(server)


def _warm(serve_bench, url, args):
    import httpx

    level_args = serve_bench.parse_args(["--url", url, "--api", "completions",
                                         "--prompt-tokens", str(args.prompt_tokens)])
    level_args.headers = {}
    level_args.model = serve_bench.model_id(level_args)
    return (httpx.Client(base_url=url, timeout=60),
            *serve_bench.request_body(level_args, 0, args.prompt_tokens, 8))


def print_record(r: dict) -> None:
    phases = r["ms_per_round"]
    print(f"C={r['concurrency']:<4} workers={r['http_workers']} live {r['decode_tok_s'] or 0:8.0f} "
          f"tok/s, ideal {r['ideal_tok_s']:8.0f} ({100 * r['live_over_ideal']:.0f}%); "
          f"rows/round {r['rows_per_round']}, round {r['round_ms']} ms: submit "
          f"{phases.get('program_submit')} wait {phases.get('device_wait')} post "
          f"{phases.get('program_post')} commit {phases.get('engine_commit_output')} ms; "
          f"TTFT p99 {r['ttft_p99_s']:.3f} s, ITL max {r['itl_max_s']:.3f} s; device busy "
          f"{100 * r['device_busy']:.0f}%, GC {100 * r['gc_share']:.1f}% of the time, engine "
          f"host wall/cpu {r['engine_wall_over_cpu']}")
    print(f"      CPU share {r['cpu_share']}; core threads {r['core_thread_share']}",
          flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=["drive", "serve"], default="drive")
    parser.add_argument("--port", type=int, default=8750)
    parser.add_argument("--artifact", default=DEFAULT_ARTIFACT)
    parser.add_argument("--lanes", type=int, default=256)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--kv-tokens", type=int, default=275248, help="run 40's H100 pool")
    parser.add_argument("--http-workers", type=int, default=1)
    parser.add_argument("--step-ms", type=float, default=DeviceModel.step_ms)
    parser.add_argument("--row-ms", type=float, default=DeviceModel.row_ms)
    parser.add_argument("--chunk-token-ms", type=float, default=DeviceModel.chunk_token_ms)
    parser.add_argument("--dispatch-ms", type=float, default=0.0)
    parser.add_argument("--dispatch-hold-ms", type=float, default=0.0)
    parser.add_argument("--switch-interval-ms", type=float, default=0.0,
                        help="the core's GIL switch interval (0: the core's own)")
    parser.add_argument("--leftover-objects", type=int, default=0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--requests-per-client", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="run the levels this often")
    parser.add_argument("--log-stats-ms", type=int, default=5000)
    parser.add_argument("--probe", default="/tmp/host_path_bench.threads.json")
    parser.add_argument("--log", default="/tmp/host_path_bench.server.log")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "serve":
        serve(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
