"""Serving benchmark: N concurrent streaming clients against a live `ninfer serve`.

    .venv/bin/python benchmarks/serve_bench.py --url http://127.0.0.1:8080 \
        --concurrency 1 4 8 --requests-per-client 2 --max-tokens 64 [--api-key KEY] [--json]

For each concurrency level C, C client threads each send `--requests-per-client` streaming
chat completions one after another (fixed prompts, temperature 0, `ignore_eos` so every reply
has exactly --max-tokens tokens). Reported per level:
  output tok/s   all completion tokens / wall time of the level (aggregate throughput)
  TTFT p50/p99   request sent -> first content chunk
  ITL p50/p99    gaps between consecutive content chunks of one stream
One unmeasured request warms the server first. Nothing but httpx is needed.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import sys
import time

import httpx

PROMPTS = [
    "Tell me a story about a lighthouse keeper and a storm.",
    "Explain how a refrigerator works.",
    "Write a letter to a friend about a trip to the mountains.",
    "Describe the rules of chess for a beginner.",
    "What are the benefits of regular exercise?",
    "Summarize the plot of a mystery novel you invent.",
    "Give advice to someone starting to learn the piano.",
    "Describe a busy market in a large city.",
]


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def one_request(client: httpx.Client, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    chunk_times, tokens = [], 0
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                chunk_times.append(time.perf_counter())
    gaps = [b - a for a, b in zip(chunk_times, chunk_times[1:])]
    return {"ttft": chunk_times[0] - sent if chunk_times else None, "itl": gaps,
            "tokens": tokens}


def run_level(args, concurrency: int) -> dict:
    def client_loop(index: int) -> list[dict]:
        with httpx.Client(base_url=args.url, headers=args.headers, timeout=600) as client:
            return [one_request(client, args.model, PROMPTS[(index + k) % len(PROMPTS)],
                                args.max_tokens)
                    for k in range(args.requests_per_client)]

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = [r for rs in pool.map(client_loop, range(concurrency)) for r in rs]
    wall = time.perf_counter() - started
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    gaps = [g for r in results for g in r["itl"]]
    tokens = sum(r["tokens"] for r in results)
    return {"concurrency": concurrency, "requests": len(results), "output_tokens": tokens,
            "wall_s": wall, "output_tok_s": tokens / wall,
            "ttft_p50_s": percentile(ttfts, 0.5), "ttft_p99_s": percentile(ttfts, 0.99),
            "itl_p50_s": percentile(gaps, 0.5), "itl_p99_s": percentile(gaps, 0.99)}


def model_id(args) -> str:
    if args.model:
        return args.model
    reply = httpx.get(args.url + "/v1/models", headers=args.headers, timeout=30)
    reply.raise_for_status()
    return reply.json()["data"][0]["id"]


def print_table(levels: list[dict]) -> None:
    print(f"{'conc':>4} {'reqs':>5} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'ITL p50':>8} {'ITL p99':>8}   (seconds)")
    for level in levels:
        cells = [level[k] for k in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")]
        print(f"{level['concurrency']:>4} {level['requests']:>5} {level['output_tok_s']:>10.1f} "
              + " ".join(f"{c:>8.3f}" if c is not None else f"{'-':>8}" for c in cells))
    base = levels[0]["output_tok_s"]
    for level in levels[1:]:
        print(f"throughput at concurrency {level['concurrency']}: "
              f"{level['output_tok_s'] / base:.2f}x concurrency {levels[0]['concurrency']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--model", default=None, help="default: the first of /v1/models")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    args.model = model_id(args)
    with httpx.Client(base_url=args.url, headers=args.headers, timeout=600) as client:
        one_request(client, args.model, PROMPTS[0], 8)  # warm-up, not measured
    levels = [run_level(args, c) for c in args.concurrency]
    if args.json:
        json.dump({"url": args.url, "model": args.model, "max_tokens": args.max_tokens,
                   "levels": levels}, sys.stdout, indent=2)
        print()
    else:
        print_table(levels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
