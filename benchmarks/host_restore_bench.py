"""Restoring a long cached prompt from the host tier against recomputing it, through the live
server (issue 13's GPU acceptance: a cached 32k-token prompt back from pinned host memory >= 5x
faster than its prefill).

    python3 benchmarks/host_restore_bench.py --preset qwen3-8b --out $OUT      # on the H200
    .venv/bin/python benchmarks/host_restore_bench.py --smoke                  # CPU check

One `ninfer serve` whose device pool holds one long prompt but not two. Per round, with fresh
random token ids A and B of --prompt-tokens each (Completions, a token-id prompt, max_tokens 1,
greedy, so a request's latency is its time to first token):
  cold      A on an empty cache: the whole prompt is prefilled
  device    A again: its pages are still on the device
  evict     B cold: B's pages push A's out of the pool, into the host tier
  host      A again: A's pages come back from the host tier (usage says how many tokens were
            reused; /metrics how many bytes moved each way)
The ratio cold / host is the figure, client-side and server-side (`server_ttft_s`: the ttft of
the server log's line for the request, without the HTTP round trip). Each phase also records
the /metrics deltas it caused: bytes moved each way, host tier use and its clean copies.
Standard library only (the server is a subprocess), so a stage cap is a kill; under --out:
results.jsonl (one JSON object per request and a summary, each with its command) and
server.log.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
import urllib.request

from proclib import REPO, Budget, Results, Server, free_port, http_get, parse_metrics, run_capped

METRICS = ("ninfer_context_transfer_bytes_total:direction", "ninfer_host_context_used_bytes",
           "ninfer_host_context_clean_bytes", "ninfer_prefill_tokens_total",
           "ninfer_prompt_tokens_cached_total")
DONE_LINE = re.compile(r" done .* ttft ([0-9.]+)s")
PROFILES = {
    "gpu": dict(preset="qwen3-8b", work="/tmp/hrb", prompt_tokens=32768, max_context=33792,
                kv_capacity=34816, host_context_mib=16384, prefill_chunk=2048, rounds=3,
                total=540.0, start_cap=300.0, step_shapes="all"),
    "smoke": dict(preset="qwen3-tiny", work="/tmp/hrb-smoke", prompt_tokens=1024,
                  max_context=1280, kv_capacity=1344, host_context_mib=256, prefill_chunk=256,
                  rounds=2, total=400.0, start_cap=240.0, step_shapes="essential"),
}


def complete(url: str, model: str, ids: list[int], timeout: float) -> dict:
    """One greedy one-token completion of a token-id prompt: seconds and the usage."""
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": 1,
                       "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        answer = json.loads(reply.read())
    usage = answer["usage"]
    return {"seconds": round(time.monotonic() - started, 4),
            "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)}


def server_ttft(log_path: str, offset: int, wait_s: float = 3.0) -> float | None:
    """The ttft of the last request-done line written to the server log past `offset` (one
    request at a time, so it is the one just answered; the line may trail the reply)."""
    deadline = time.monotonic() + wait_s
    while True:
        with open(log_path, encoding="utf-8", errors="replace") as log:
            log.seek(offset)
            found = DONE_LINE.findall(log.read())
        if found or time.monotonic() > deadline:
            return float(found[-1]) if found else None
        time.sleep(0.05)


def metrics(url: str) -> dict:
    return parse_metrics(http_get(url + "/metrics", timeout=10)[1], METRICS)


def delta(after: dict, before: dict) -> dict:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny CPU profile")
    parser.add_argument("--preset", help="init-random preset for the artifact")
    parser.add_argument("--artifact", help="use this artifact instead of init-random")
    parser.add_argument("--work", help="where init-random writes (local disk)")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/hrb-out"))
    parser.add_argument("--prompt-tokens", type=int)
    parser.add_argument("--max-context", type=int)
    parser.add_argument("--kv-capacity", type=int, help="device pool, tokens")
    parser.add_argument("--host-context-mib", type=int)
    parser.add_argument("--prefill-chunk", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--step-shapes", choices=("all", "essential"),
                        help="the server's --step-shapes (GPU: all, the default users get: "
                        "a restore's last short chunk runs at a small chunk shape)")
    parser.add_argument("--total", type=float, help="seconds for the whole call")
    parser.add_argument("--start-cap", type=float, help="seconds for the server to be ready")
    parser.add_argument("--serve-args", default="", help="more flags for `ninfer serve`")
    args = parser.parse_args(argv)
    for key, value in PROFILES["smoke" if args.smoke else "gpu"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if 2 * args.prompt_tokens <= args.kv_capacity:
        parser.error("--kv-capacity must be below two prompts, or nothing is evicted")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    budget = Budget(args.total, reserve_s=20.0)
    results = Results(os.path.join(args.out, "results.jsonl"))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    py = sys.executable
    artifact = args.artifact
    if artifact is None:
        artifact = os.path.join(args.work, args.preset)
        command = [py, "-m", "ninfer_jax.cli.main", "init-random", "--preset", args.preset,
                   artifact, "--force"]
        if not os.path.exists(os.path.join(artifact, "metadata.json")):
            run = run_capped(command, budget.cap(200.0) or 5.0,
                             os.path.join(args.out, "stages.log"), env)
            results.add("artifact", command, rc=run["rc"], seconds=run["seconds"])
            if run["rc"] != 0:
                return 1
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [py, "-m", "ninfer_jax.cli.main", "serve", artifact, "--port", str(port),
               "--max-concurrency", "1", "--max-context", str(args.max_context),
               "--kv-capacity", str(args.kv_capacity), "--host-context-mib",
               str(args.host_context_mib), "--prefill-chunk", str(args.prefill_chunk),
               "--step-shapes", args.step_shapes, *args.serve_args.split()]
    server = Server(command, env, os.path.join(args.out, "server.log"), url)
    start = server.start_and_wait(budget.cap(args.start_cap) or 5.0)
    results.add("start", command, ready_s=start["ready_s"], exit_rc=start["exit_rc"])
    if start["ready_s"] is None:
        server.stop(0)
        return 1
    try:
        compiled = server.wait_compiled(budget.cap(args.start_cap) or 5.0)
        results.add("compiled", command, **compiled)
        rows = run_rounds(args, url, budget, results, server.log_path)
    finally:
        server.stop(10.0)
    summarize(rows, results, args)
    return 0 if rows else 1


def run_rounds(args, url: str, budget: Budget, results: Results, log_path: str) -> list[dict]:
    model = json.loads(http_get(url + "/v1/models", timeout=10)[1])["data"][0]["id"]
    rng = random.Random(0)
    rows = []
    # A warm-up pair whose prompts are not measured: the first long prefill and the first page
    # copies each way pay one-off costs (compilation of the copy programs, allocator growth).
    for round_no in range(-1, args.rounds):
        a, b = ([rng.randrange(1000, 100000) for _ in range(args.prompt_tokens)]
                for _ in range(2))
        row = {"round": round_no}
        for phase, ids in (("cold", a), ("device", a), ("evict", b), ("host", a)):
            cap = budget.cap(120.0)
            if cap is None:
                return rows
            before, offset = metrics(url), os.path.getsize(log_path)
            reply = complete(url, model, ids, cap)
            row[phase] = {**reply, "server_ttft_s": server_ttft(log_path, offset),
                          **delta(metrics(url), before)}
        row["cold_over_host"] = round(row["cold"]["seconds"] / row["host"]["seconds"], 2)
        if row["cold"]["server_ttft_s"] and row["host"]["server_ttft_s"]:
            row["server_cold_over_host"] = round(
                row["cold"]["server_ttft_s"] / row["host"]["server_ttft_s"], 2)
        results.add("round", "see start", **row)
        if round_no >= 0:
            rows.append(row)
    return rows


def summarize(rows: list[dict], results: Results, args) -> None:
    if not rows:
        return
    phases = ("cold", "device", "evict", "host")
    med = {phase: statistics.median(r[phase]["seconds"] for r in rows) for phase in phases}
    server = {phase: [r[phase]["server_ttft_s"] for r in rows] for phase in phases}
    server_med = {phase: statistics.median(v) for phase, v in server.items() if None not in v}
    moved = {direction: [r["host"].get(f"ninfer_context_transfer_bytes_total:direction="
                                       f"{direction}", 0.0) for r in rows]
             for direction in ("device_to_host", "host_to_device")}
    results.add("summary", "see start", prompt_tokens=args.prompt_tokens, rounds=len(rows),
                median_seconds=med, cold_over_host=round(med["cold"] / med["host"], 2),
                cold_over_device=round(med["cold"] / med["device"], 2),
                server_ttft_s=server, server_median_s=server_med,
                server_cold_over_host=(round(server_med["cold"] / server_med["host"], 2)
                                       if "cold" in server_med and "host" in server_med
                                       else None),
                host_hit_bytes=moved,
                host_cached_tokens=[r["host"]["cached_tokens"] for r in rows])


if __name__ == "__main__":
    sys.exit(main())
