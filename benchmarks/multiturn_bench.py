"""Multi-turn conversations over one shared system prompt: what the context cache saves.

    PYTHONPATH=. python3 benchmarks/multiturn_bench.py \
        --artifact artifacts/smollm2-135m-instruct.ninfer --conversations 4 --turns 6 \
        --system-tokens 128 --user-tokens 8 --answer-tokens 32 --kv-capacity 448

N conversations take T turns round-robin (turn t of every conversation, then turn t + 1):
each prompt is the shared system prompt, the conversation's earlier user turns and the
model's own greedy answers, then a new user turn. The whole history outgrows the device pool
(--kv-capacity tokens), so by the time a conversation comes back the device cache has
evicted it. The same workload runs three times over one runner and one compiled set of
shapes: `no_prefix_reuse`, `device_only` (the prefix cache, --host-context-mib 0) and
`device_host` (plus the host tier). One JSON line per mode: requests, prompt tokens, cached
(verified reused) tokens, hit rate, prefilled tokens, TTFT p50/p99 (submission to first
token; requests run one at a time, so this is queue-free prefill time), host-tier traffic;
then a summary line with the prefill ratio device_only / device_host and whether every
mode produced the same answers (greedy decoding: it must). `--fake` uses the engine's fake
runner (no JAX: tests/benchmarks checks the logic with it).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.host_pages import HostPagePool
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import GenerationRequest, RequestHandle, SamplingParams
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.step_loop import StepLoop

PAGE_SIZE = 16
GREEDY = SamplingParams(temperature=0.0)
# (mode, prefix reuse, host tier)
MODES = (("no_prefix_reuse", False, False), ("device_only", True, False),
         ("device_host", True, True))


def synthetic_ids(count: int, vocab: int, salt: int) -> list[int]:
    """Deterministic token ids away from the low (control) ids."""
    rng = np.random.default_rng(salt)
    return [int(t) for t in rng.integers(16, vocab - 16, count)]


def build_runner(args):
    num_pages = args.kv_capacity // PAGE_SIZE + 1
    if args.fake:
        from ninfer_jax.engine.fake import FakeRunner

        return FakeRunner(num_pages=num_pages, page_size=PAGE_SIZE, max_batch=1,
                          vocab_size=1000, async_dispatch=False), 1000
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.engine.runner import JaxRunner

    artifact = load_artifact(args.artifact, weights=True)
    runner = JaxRunner(artifact, num_pages=num_pages, page_size=PAGE_SIZE, max_batch=1,
                       max_context=args.max_context, prefill_chunk=args.prefill_chunk)
    runner.warmup()
    return runner, artifact.config.vocab_size


def run_mode(runner, vocab: int, args, mode: str, prefix_reuse: bool, host: bool):
    """One pass of the workload; (the mode's JSON record, every answer in order)."""
    config = EngineConfig(max_concurrency=1, prefill_chunk=args.prefill_chunk,
                          max_context=args.max_context, kv_capacity=args.kv_capacity,
                          prefix_reuse=prefix_reuse,
                          host_context_mib=args.host_context_mib if host else 0)
    host_pool = HostPagePool(config.host_pages(runner.page_bytes), runner.page_bytes)
    scheduler = Scheduler(config, PagePool(runner.num_pages), page_size=PAGE_SIZE,
                          max_batch=1, host=host_pool)
    loop = StepLoop(scheduler, runner)
    system = synthetic_ids(args.system_tokens, vocab, salt=1)
    histories = [list(system) for _ in range(args.conversations)]
    ttfts, answers, started = [], [], time.perf_counter()
    for turn in range(args.turns):
        for index, history in enumerate(histories):
            history += synthetic_ids(args.user_tokens, vocab, salt=1000 * index + turn + 2)
            request = GenerationRequest(f"{mode}-{index}-{turn}", list(history), GREEDY,
                                        args.answer_tokens, ignore_eos=True)
            seq = scheduler.add(RequestHandle(request))
            while scheduler.has_work() or loop.in_flight:
                if not loop.advance():
                    loop.drain()
            ttfts.append(seq.first_token_at - request.arrival_time)
            answers.append(seq.output_ids)
            history += seq.output_ids
    counters, cache = scheduler.counters, scheduler.cache
    record = {
        "mode": mode, "requests": len(ttfts), "prompt_tokens": counters.prompt_tokens,
        "cached_tokens": counters.cached_tokens,
        "hit_rate": round(counters.cached_tokens / counters.prompt_tokens, 4),
        "prefilled_tokens": counters.prefill_tokens,
        "ttft_p50_ms": round(1000 * float(np.percentile(ttfts, 50)), 2),
        "ttft_p99_ms": round(1000 * float(np.percentile(ttfts, 99)), 2),
        "spilled_pages": cache.spilled_pages if cache is not None else 0,
        "loaded_pages": cache.loaded_pages if cache is not None else 0,
        "host_pages_peak": host_pool.peak_used,
        "device_pages": runner.num_pages - 1, "seconds": round(time.perf_counter() - started, 2),
    }
    return record, answers


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", default="artifacts/smollm2-135m-instruct.ninfer")
    parser.add_argument("--fake", action="store_true", help="the fake runner (no JAX)")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system-tokens", type=int, default=128)
    parser.add_argument("--user-tokens", type=int, default=8)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--kv-capacity", type=int, default=448, help="device pool, tokens")
    parser.add_argument("--host-context-mib", type=int, default=8192)
    parser.add_argument("--max-context", type=int, default=512)
    parser.add_argument("--prefill-chunk", type=int, default=128)
    args = parser.parse_args(argv)
    total = (args.system_tokens + args.conversations * args.turns
             * (args.user_tokens + args.answer_tokens))
    if total <= args.kv_capacity:
        parser.error(f"the workload's {total} tokens fit the {args.kv_capacity}-token pool: "
                     "nothing would be evicted")
    runner, vocab = build_runner(args)
    records, outputs = [], []
    for mode, prefix_reuse, host in MODES:
        record, answers = run_mode(runner, vocab, args, mode, prefix_reuse, host)
        records.append(record)
        outputs.append(answers)
        print(json.dumps(record), flush=True)
    device, tiered = records[1]["prefilled_tokens"], records[2]["prefilled_tokens"]
    summary = {"summary": True, "workload_tokens": total,
               "prefill_ratio_device_over_host": round(device / max(1, tiered), 2),
               "outputs_match": all(answers == outputs[0] for answers in outputs)}
    print(json.dumps(summary), flush=True)
    return records + [summary]


if __name__ == "__main__":
    main()
