"""The replay report: latency, TTFT and inter-token-latency percentiles, throughput, and the
comparison verdicts; as one JSON object (--json) or readable text.

Sources: latency is client wall time per request. TTFT and inter-token gaps are measured by
the client for streamed requests; for non-streamed ones they come from the server's request
log when it is available (timings_seconds.ttft, and decode seconds spread evenly over the
completion's gaps). Completion tokens come from the server log, else from the response usage.
"""
from __future__ import annotations

import dataclasses
import math

from ninfer_jax.replay.compare import MISMATCH, VERDICTS, Verdict
from ninfer_jax.replay.records import LoggedRequest
from ninfer_jax.replay.sender import Sent


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"count": len(values), "mean": sum(values) / len(values),
            "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "max": max(values)}


def _server_side(done: dict | None) -> tuple[float | None, list[float], int | None]:
    """(ttft, gaps, completion tokens) from a request_done record."""
    if done is None:
        return None, [], None
    completion = done["tokens"]["completion"]
    timings = done["timings_seconds"]
    gaps = [timings["decode"] / (completion - 1)] * (completion - 1) if completion > 1 else []
    return timings.get("ttft"), gaps, completion


def build_report(sent: list[Sent], replayed: dict[str, LoggedRequest] | None,
                 verdicts: list[Verdict] | None, wall_seconds: float, *, target: str,
                 concurrency: int) -> dict:
    ttfts, gaps, latencies, requests, total_tokens = [], [], [], [], 0
    for s in sent:
        record = replayed.get(s.request_id) if replayed and s.request_id else None
        server_ttft, server_gaps, server_tokens = _server_side(record.done if record else None)
        ttft = s.ttft if s.streamed else server_ttft
        request_gaps = s.gaps if s.streamed else server_gaps
        tokens = server_tokens if server_tokens is not None else s.completion_tokens
        if s.status == 200:
            latencies.append(s.latency)
            gaps.extend(request_gaps)
            total_tokens += tokens or 0
            if ttft is not None:
                ttfts.append(ttft)
        requests.append({"capture_id": s.capture.request_id, "replay_id": s.request_id,
                         "endpoint": s.capture.endpoint, "status": s.status,
                         "stream": s.streamed, "latency_seconds": s.latency,
                         "ttft_seconds": ttft, "completion_tokens": tokens, "error": s.error})
    succeeded = len(latencies)
    report = {
        "target": target, "concurrency": concurrency, "requests": len(sent),
        "succeeded": succeeded, "wall_seconds": wall_seconds,
        "throughput": {
            "requests_per_second": succeeded / wall_seconds if wall_seconds > 0 else None,
            "completion_tokens": total_tokens,
            "completion_tokens_per_second": total_tokens / wall_seconds
            if wall_seconds > 0 else None},
        "latency_seconds": summarize(latencies), "ttft_seconds": summarize(ttfts),
        "inter_token_latency_seconds": summarize(gaps), "per_request": requests,
        "comparison": None,
    }
    if verdicts is not None:
        counts = {name: sum(v.verdict == name for v in verdicts) for name in VERDICTS}
        report["comparison"] = {"counts": counts,
                                "verdicts": [dataclasses.asdict(v) for v in verdicts]}
    return report


def is_success(report: dict) -> bool:
    """Without a comparison: every request answered 200. With one: no verdict other than
    identical (a rejection repeated counts as identical) or not_comparable."""
    comparison = report["comparison"]
    if comparison is None:
        return report["succeeded"] == report["requests"]
    counts = comparison["counts"]
    return counts[MISMATCH] == 0 and counts["failed"] == 0 and counts["missing_previous"] == 0


def _seconds(summary: dict | None) -> str:
    if summary is None:
        return "-"
    return "  ".join(f"{key} {summary[key] * 1000:.1f}ms" for key in ("p50", "p90", "p99"))


def format_text(report: dict) -> str:
    throughput = report["throughput"]
    comparison = report["comparison"]
    lines = [
        f"replayed {report['requests']} requests against {report['target']} "
        f"(concurrency {report['concurrency']}): {report['succeeded']} succeeded in "
        f"{report['wall_seconds']:.2f}s",
        f"throughput  {throughput['requests_per_second'] or 0:.2f} req/s, "
        f"{throughput['completion_tokens_per_second'] or 0:.1f} completion tok/s "
        f"({throughput['completion_tokens']} tokens)",
        f"latency     {_seconds(report['latency_seconds'])}",
        f"ttft        {_seconds(report['ttft_seconds'])}",
        f"itl         {_seconds(report['inter_token_latency_seconds'])}",
    ]
    for request in report["per_request"]:
        if request["status"] != 200 and comparison is None:
            lines.append(f"  FAILED  {request['capture_id']} {request['endpoint']}: "
                         f"{request['status']} {request['error']}")
    if comparison is not None:
        counts = comparison["counts"]
        lines.append("compare     " + ", ".join(f"{counts[name]} {name}" for name in VERDICTS))
        for verdict in comparison["verdicts"]:
            if verdict["verdict"] in ("identical", "not_comparable"):
                continue
            lines.append(_verdict_line(verdict))
    return "\n".join(lines)


def _verdict_line(verdict: dict) -> str:
    head = f"  {verdict['verdict'].upper()}  {verdict['capture_id']} {verdict['endpoint']}"
    if verdict["verdict"] == MISMATCH:
        changed = verdict["changed_sampling"]
        return (f"{head}: first difference at token {verdict['first_difference']} "
                f"({verdict['num_previous']} vs {verdict['num_replayed']} tokens)"
                + (f"; sampling changed: {', '.join(changed)}" if changed else ""))
    return f"{head}: {verdict['detail'] or 'no earlier request_done'}"
