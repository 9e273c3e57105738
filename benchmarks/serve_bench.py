"""Serving benchmark: N concurrent streaming clients against a live `ninfer serve`.

    .venv/bin/python benchmarks/serve_bench.py --url http://127.0.0.1:8080 \
        --concurrency 1 4 8 --requests-per-client 2 --max-tokens 64 [--api-key KEY] [--json]
    ... --api completions --prompt-tokens 256 --max-tokens 256 --json       # exact lengths
    ... --api completions --interference 63 --long-prompt 4000 --json       # see below
    ... --task echo --draft both --concurrency 1 8 --max-tokens 200         # speculation
    ... --concurrency 1 --presence-penalty 0.5                              # penalties

For each concurrency level C, C client threads each send `--requests-per-client` streaming
requests one after another (temperature 0, `ignore_eos`, so every reply has exactly
--max-tokens tokens). `--api chat` sends the fixed chat prompts below (padded with filler
words to about --prompt-tokens when set); `--api completions` sends --prompt-tokens random
token ids, distinct per request so the prefix cache never shortens a prompt. Per level:
  output tok/s      all completion tokens / wall time of the level
  decode tok/s      C x the median stream's decode rate, (tokens - 1) / (last - first chunk):
                    the steady rate of C streams decoding together, the figure to hold
                    against a bare decode step of batch C
  TTFT p50/p99      request sent -> first content chunk
  ITL p50/p99/max   gaps between consecutive content chunks of one stream (a chunk can carry
                    more than one token: `tokens_per_chunk` says how often that happened)
`--interference S`: S streams decode (--max-tokens long); once each has --warm-chunks chunks
and --steady-s more seconds have passed, one --long-prompt-token request arrives. Reported:
its TTFT (its prefill, interleaved with the decodes) and the S streams' largest chunk gap
overlapping [arrival, its first token], next to their largest gap in the steady seconds
before it. One unmeasured request warms the server
first. `--task echo` asks to repeat one of two ~180-token paragraphs (an input-echoing task, where
prompt lookup drafts well; the replies end at the model's end token, so `num_short` counts
them). `--draft off` sends every request with `draft: false` (plain decoding on
a server started with --spec); `--draft both` runs each level plain, then speculative, in the
same server, and prints the speedup; the summaries add the terminal timings' draft_n and
draft_n_accepted. `--json` prints one JSON object per level. Nothing but httpx is needed.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import random
import sys
import threading
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
FILLER = "river stone window garden lantern harbor meadow candle".split()
ECHO_PARAGRAPHS = [
    "The old lighthouse stood on a black rock at the edge of the bay, and for forty years the "
    "same keeper had climbed its one hundred and twelve stairs every evening. He trimmed the "
    "wick, polished the great lens until it shone like water, and lit the lamp just as the "
    "sun touched the hills behind the village. Then he sat by the window with a cup of tea "
    "and watched the fishing boats come home through the fog, counting each one aloud until "
    "the harbour was full. On stormy nights he did not sleep at all. He walked around the "
    "gallery in his heavy coat, listening to the wind and the waves, and wrote in his "
    "logbook the time of every ship that passed, the strength of the gale and the height of "
    "the sea. In the morning he put out the lamp, ate a slice of bread with cheese, and "
    "slept until noon while the gulls cried over the empty beach.",
    "Every summer the family drove to the small cabin by the lake, where the water was so "
    "clear that you could see the stones on the bottom. The children spent the long days "
    "swimming, fishing from the wooden dock and building boats out of bark and string. Their "
    "father cooked fish over an open fire, and their mother read stories on the porch while "
    "the loons called across the water. At night they lay on the grass and counted the stars, "
    "and sometimes they saw a shooting star fall behind the dark pines. When the rain came "
    "they played cards by the window and listened to the drops on the tin roof. On the last "
    "morning they packed the car in silence, waved goodbye to the lake, and promised that "
    "they would come back again the next year.",
]
# Random prompt ids stay inside every vocabulary we serve (SmolLM2 has 49,152 entries) and
# above the low ids where byte and control tokens sit.
TOKEN_ID_RANGE = (1000, 30000)


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def token_prompt(index: int, length: int, seed: int = 0) -> list[int]:
    """`length` token ids, the same for the same (seed, index), different across indexes."""
    rng = random.Random(f"{seed}:{index}")
    return [rng.randrange(*TOKEN_ID_RANGE) for _ in range(length)]


def chat_prompt(index: int, approx_tokens: int = 0) -> str:
    text = PROMPTS[index % len(PROMPTS)]
    words = len(text.split())
    if approx_tokens > words:  # about one token per common English word
        text += " Context: " + " ".join(FILLER[(index + k) % len(FILLER)]
                                        for k in range(approx_tokens - words))
    return text


def request_body(args, index: int, prompt_tokens: int, max_tokens: int) -> tuple[str, dict]:
    """(path, body) of one streaming request; `index` picks a distinct prompt."""
    common = {"model": args.model, "max_tokens": max_tokens, "temperature": 0,
              "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if getattr(args, "draft_off", False):
        common["draft"] = False
    if getattr(args, "presence_penalty", 0):
        common["presence_penalty"] = args.presence_penalty
    if args.task == "echo":  # replies end at the end of the echo, as a client sees them
        paragraph = ECHO_PARAGRAPHS[index % len(ECHO_PARAGRAPHS)]
        return "/v1/chat/completions", {**common, "ignore_eos": False, "messages": [
            {"role": "user", "content": f"Repeat this paragraph exactly: {paragraph}"}]}
    if args.api == "completions":
        return "/v1/completions", {**common, "prompt": token_prompt(index, prompt_tokens,
                                                                    args.seed)}
    return "/v1/chat/completions", {
        **common, "messages": [{"role": "user", "content": chat_prompt(index, prompt_tokens)}]}


def _chunk_text(chunk: dict) -> str:
    parts = []
    for choice in chunk.get("choices", []):
        parts.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
    return "".join(parts)


def one_request(client: httpx.Client, path: str, body: dict, chunk_times: list | None = None,
                stop: threading.Event | None = None) -> dict:
    """Stream one request. Content-chunk arrival times are appended to `chunk_times` as they
    come (another thread may watch it); `stop` ends the stream early (closing the connection
    cancels the request on the server)."""
    chunk_times = [] if chunk_times is None else chunk_times
    result = {"sent": time.perf_counter(), "chunks": chunk_times, "tokens": 0,
              "prompt_tokens": None, "timings": None, "stopped": False, "error": None}
    try:
        with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                response.read()
                result["error"] = f"HTTP {response.status_code}: {response.text[:200]}"
                return result
            for line in response.iter_lines():
                if stop is not None and stop.is_set():
                    result["stopped"] = True
                    break
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("usage"):
                    result["tokens"] = chunk["usage"]["completion_tokens"]
                    result["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
                    result["timings"] = chunk.get("timings")
                if _chunk_text(chunk):
                    chunk_times.append(time.perf_counter())
    except httpx.HTTPError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


def stream_stats(result: dict) -> dict:
    """TTFT, chunk gaps and decode rate of one finished stream."""
    times = result["chunks"]
    gaps = [b - a for a, b in zip(times, times[1:])]
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    tokens = result["tokens"] or len(times)
    return {"ttft": times[0] - result["sent"] if times else None, "gaps": gaps,
            "decode_tok_s": (tokens - 1) / span if span > 0 else None}


def full_window(results: list[dict]) -> dict:
    """The span in which every stream of the level decodes (from the last first chunk to the
    first last chunk) and the tokens all streams delivered in it per second: the server's
    decode rate at the level's full row count, comparable to the bare step's. The median
    stream's rate (decode_tok_s) also counts the spans in which others' prompts were
    prefilled beside it; when all prompts arrive at once that can be half of each stream's
    life (run 45 at 256). A chunk carries the stream's mean tokens per chunk. None when the
    first stream ends before the last one starts (or a stream failed)."""
    streams = [r for r in results if len(r["chunks"]) > 1 and not r["error"]]
    if not streams or len(streams) < len(results):
        return {"full_decode_tok_s": None, "full_window_s": None}
    start = max(r["chunks"][0] for r in streams)
    end = min(r["chunks"][-1] for r in streams)
    if end <= start:
        return {"full_decode_tok_s": None, "full_window_s": None}
    tokens = 0.0
    for r in streams:  # chunks after `start` up to `end`: the tokens made in the window
        inside = sum(1 for t in r["chunks"] if start < t <= end)
        tokens += inside * (r["tokens"] or len(r["chunks"])) / len(r["chunks"])
    return {"full_decode_tok_s": tokens / (end - start), "full_window_s": end - start}


def summarize(results: list[dict], wall: float, concurrency: int, max_tokens: int) -> dict:
    """One level's record from its streams."""
    stats = [stream_stats(r) for r in results]
    ttfts = [s["ttft"] for s in stats if s["ttft"] is not None]
    gaps = [g for s in stats for g in s["gaps"]]
    rates = [s["decode_tok_s"] for s in stats if s["decode_tok_s"] is not None]
    tokens = sum(r["tokens"] for r in results)
    chunks = sum(len(r["chunks"]) for r in results)
    server_prompt_ms = [r["timings"]["prompt_ms"] for r in results
                        if r["timings"] and "prompt_ms" in r["timings"]]
    # The engine's own decode rate per request (first to last committed token), untouched by
    # how the HTTP side batched chunks into the client's reads.
    server_rates = [r["timings"]["predicted_per_second"] for r in results
                    if r["timings"] and r["timings"].get("predicted_per_second")]
    median_rate, median_server_rate = percentile(rates, 0.5), percentile(server_rates, 0.5)
    return {
        "concurrency": concurrency, "requests": len(results), "max_tokens": max_tokens,
        "prompt_tokens": percentile([r["prompt_tokens"] for r in results
                                     if r["prompt_tokens"] is not None], 0.5),
        "errors": [r["error"] for r in results if r["error"]][:5],
        "num_errors": sum(1 for r in results if r["error"]),
        "num_short": sum(1 for r in results if not r["error"] and r["tokens"] != max_tokens),
        "output_tokens": tokens, "wall_s": wall, "output_tok_s": tokens / wall if wall else None,
        "decode_tok_s": concurrency * median_rate if median_rate else None,
        **full_window(results),
        "request_tok_s_p50": median_rate, "request_tok_s_min": min(rates, default=None),
        "ttft_p50_s": percentile(ttfts, 0.5), "ttft_p99_s": percentile(ttfts, 0.99),
        "itl_p50_s": percentile(gaps, 0.5), "itl_p99_s": percentile(gaps, 0.99),
        "itl_max_s": max(gaps, default=None),
        "tokens_per_chunk": tokens / chunks if chunks else None,
        "server_prompt_ms_p50": percentile(server_prompt_ms, 0.5),
        "server_decode_tok_s": concurrency * median_server_rate if median_server_rate else None,
        "draft_n": sum((r["timings"] or {}).get("draft_n", 0) for r in results),
        "draft_n_accepted": sum((r["timings"] or {}).get("draft_n_accepted", 0)
                                for r in results),
    }


def run_level(args, concurrency: int) -> dict:
    def client_loop(client_index: int) -> list[dict]:
        with httpx.Client(base_url=args.url, headers=args.headers, timeout=600) as client:
            out = []
            for k in range(args.requests_per_client):
                index = 1 + concurrency * 1000 + client_index * args.requests_per_client + k
                out.append(one_request(client, *request_body(
                    args, index, args.prompt_tokens, args.max_tokens)))
            return out

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = [r for rs in pool.map(client_loop, range(concurrency)) for r in rs]
    return summarize(results, time.perf_counter() - started, concurrency, args.max_tokens)


def largest_gap(streams: list[list[float]], start: float, end: float) -> float | None:
    """The largest gap between consecutive chunks of any stream that overlaps [start, end],
    counted whole; a stream with no chunk after `end` is still waiting, up to `end`."""
    largest = None
    for times in streams:
        edges = times + [end] if times and times[-1] <= end else times
        for a, b in zip(edges, edges[1:]):
            if b >= start and a <= end:
                largest = b - a if largest is None else max(largest, b - a)
    return largest


def interference(args) -> dict:
    """S decoding streams, then one long prompt: its TTFT and the streams' stall."""
    streams = args.interference
    stop = threading.Event()
    chunk_lists: list[list[float]] = [[] for _ in range(streams)]

    def decode_stream(i: int) -> dict:
        with httpx.Client(base_url=args.url, headers=args.headers, timeout=600) as client:
            return one_request(client, *request_body(args, 10_000_000 + i, args.prompt_tokens,
                                                     args.max_tokens), chunk_lists[i], stop)

    pool = concurrent.futures.ThreadPoolExecutor(streams)
    futures = [pool.submit(decode_stream, i) for i in range(streams)]
    deadline = time.perf_counter() + args.warm_timeout
    while (min(len(c) for c in chunk_lists) < args.warm_chunks
           and time.perf_counter() < deadline and not any(f.done() for f in futures)):
        time.sleep(0.01)
    warm = min(len(c) for c in chunk_lists) >= args.warm_chunks
    steady_from = time.perf_counter()
    time.sleep(args.steady_s)  # the baseline window: every stream decoding, nothing arriving
    with httpx.Client(base_url=args.url, headers=args.headers, timeout=600) as client:
        long_path, long_body = request_body(args, 20_000_000, args.long_prompt,
                                            args.long_max_tokens)
        arrived = time.perf_counter()
        long_result = one_request(client, long_path, long_body)
    first = long_result["chunks"][0] if long_result["chunks"] else time.perf_counter()
    window = first - arrived
    finished_early = sum(1 for f in futures if f.done())
    stop.set()
    decode_results = [f.result() for f in futures]
    pool.shutdown()
    before = [[t for t in c if steady_from <= t <= arrived] for c in chunk_lists]
    return {
        "interference_streams": streams, "stream_prompt_tokens": args.prompt_tokens,
        "long_prompt_tokens": long_result["prompt_tokens"] or args.long_prompt,
        "long_ttft_s": window if long_result["chunks"] else None,
        "long_server_prompt_ms": (long_result["timings"] or {}).get("prompt_ms"),
        "long_error": long_result["error"],
        "streams_warm": warm, "streams_finished_early": finished_early,
        "stream_errors": sum(1 for r in decode_results if r["error"]),
        "stream_gap_max_during_s": largest_gap(chunk_lists, arrived, first),
        "stream_gap_max_before_s": largest_gap(before, steady_from, arrived),
        "stream_itl_p50_before_s": percentile(
            [b - a for c in before for a, b in zip(c, c[1:])], 0.5),
    }


def model_id(args) -> str:
    if args.model:
        return args.model
    reply = httpx.get(args.url + "/v1/models", headers=args.headers, timeout=30)
    reply.raise_for_status()
    return reply.json()["data"][0]["id"]


def print_table(levels: list[dict], speedups: bool = True) -> None:
    print(f"{'draft':>5} {'conc':>4} {'reqs':>5} {'out tok/s':>10} {'dec tok/s':>10} "
          f"{'TTFT p50':>9} "
          f"{'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'ITL max':>8}   (seconds)")
    for level in levels:
        cells = [level[k] for k in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
                                    "itl_max_s")]
        print(f"{level.get('draft', '-'):>5} {level['concurrency']:>4} {level['requests']:>5} "
              f"{level['output_tok_s']:>10.1f} "
              f"{level['decode_tok_s'] or 0:>10.1f} "
              + " ".join(f"{c:>8.3f}" if c is not None else f"{'-':>8}" for c in cells))
    base = levels[0]["output_tok_s"]
    for level in levels[1:] if speedups else []:
        print(f"throughput at concurrency {level['concurrency']}: "
              f"{level['output_tok_s'] / base:.2f}x concurrency {levels[0]['concurrency']}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--model", default=None, help="default: the first of /v1/models")
    parser.add_argument("--api", choices=["chat", "completions"], default="chat")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=0,
                        help="prompt length (completions: exact token ids; chat: about this "
                             "many words of padding); 0: the short fixed chat prompts")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--task", choices=["prompts", "echo"], default="prompts",
                        help="echo: repeat a ~200-token paragraph (chat API)")
    parser.add_argument("--draft", choices=["on", "off", "both"], default="on",
                        help="off: send draft: false; both: each level plain, then drafted")
    parser.add_argument("--seed", type=int, default=0, help="picks the random prompt ids")
    parser.add_argument("--presence-penalty", type=float, default=0.0,
                        help="sent with every request (penalised rows' decode speed)")
    parser.add_argument("--interference", type=int, default=0, metavar="STREAMS",
                        help="run the interference measurement with this many streams "
                             "instead of the concurrency levels")
    parser.add_argument("--long-prompt", type=int, default=4000)
    parser.add_argument("--long-max-tokens", type=int, default=4)
    parser.add_argument("--warm-chunks", type=int, default=8,
                        help="chunks each stream must have received before the long prompt")
    parser.add_argument("--warm-timeout", type=float, default=120.0)
    parser.add_argument("--steady-s", type=float, default=1.0,
                        help="seconds of steady decoding (the baseline) before the long prompt")
    parser.add_argument("--json", action="store_true", help="print one JSON object per level")
    args = parser.parse_args(argv)
    if args.api == "completions" and args.prompt_tokens <= 0:
        parser.error("--api completions needs --prompt-tokens > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    args.model = model_id(args)
    with httpx.Client(base_url=args.url, headers=args.headers, timeout=600) as client:
        warm = one_request(client, *request_body(args, 0, args.prompt_tokens, 8))  # unmeasured
    if warm["error"]:
        print(f"warm-up request failed: {warm['error']}", file=sys.stderr)
        return 1
    if args.interference:
        records = [interference(args)]
    else:
        records = []
        for concurrency in args.concurrency:
            for draft in (("off", "on") if args.draft == "both" else (args.draft,)):
                args.draft_off = draft == "off"
                records.append({"draft": draft, **run_level(args, concurrency)})
    if args.json:
        for record in records:
            print(json.dumps({"url": args.url, "model": args.model, "api": args.api,
                              **record}), flush=True)
    elif args.interference:
        print(json.dumps(records[0], indent=2))
    elif args.draft == "both":
        print_table(records, speedups=False)
        for plain, spec in zip(records[::2], records[1::2]):
            accepted = spec["draft_n_accepted"] / spec["draft_n"] if spec["draft_n"] else 0
            print(f"concurrency {spec['concurrency']}: speculative {spec['output_tok_s']:.1f} "
                  f"vs plain {plain['output_tok_s']:.1f} tok/s = "
                  f"{spec['output_tok_s'] / plain['output_tok_s']:.2f}x "
                  f"(drafts accepted {100 * accepted:.0f}%)")
    else:
        print_table(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
