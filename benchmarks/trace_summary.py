"""Where a device's time went in a jax.profiler trace: kernels grouped by name.

    python benchmarks/trace_summary.py TRACE_DIR [--steps N] [--top 30]

Reads the newest *.xplane.pb under TRACE_DIR with jax.profiler.ProfileData and, for every
device plane (/device:GPU:N), sums the kernel events on its stream lines by name: total time,
count and share, plus the span from the first kernel to the last and the union of the
kernels' busy intervals (busy / span is the fraction of the span the device was working; the
rest is the device waiting for the host). --steps divides every total by the number of steps
traced, so figures read as per-step costs. Prints one JSON object per device.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os


def summarize(trace_dir: str, steps: int = 1, top: int = 30) -> list[dict]:
    from jax.profiler import ProfileData

    paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)
    if not paths:
        raise FileNotFoundError(f"no *.xplane.pb under {trace_dir}")
    data = ProfileData.from_file(paths[-1])
    summaries = []
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        intervals = []
        for line in plane.lines:
            # Stream lines hold the kernels; "XLA Ops"/"XLA Modules" repeat them by HLO name.
            if not line.name.startswith("Stream"):
                continue
            for event in line.events:
                entry = by_name[event.name]
                entry[0] += event.duration_ns
                entry[1] += 1
                intervals.append((event.start_ns, event.start_ns + event.duration_ns))
        if not intervals:
            continue
        intervals.sort()
        busy, cur_start, cur_end = 0.0, *intervals[0]
        for start, end in intervals[1:]:
            if start > cur_end:
                busy += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        busy += cur_end - cur_start
        span = intervals[-1][1] - intervals[0][0]
        total = sum(v[0] for v in by_name.values())
        ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
        summaries.append({
            "device": plane.name, "steps": steps, "span_ms_per_step": span / steps / 1e6,
            "busy_ms_per_step": busy / steps / 1e6,
            "busy_fraction": busy / span if span else 0.0,
            "kernels_per_step": sum(v[1] for v in by_name.values()) / steps,
            "top": [{"name": name[:160], "ms_per_step": ns / steps / 1e6,
                     "count_per_step": count / steps, "share": ns / total}
                    for name, (ns, count) in ranked]})
    return summaries


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace_dir")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    for summary in summarize(args.trace_dir, args.steps, args.top):
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
