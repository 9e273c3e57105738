"""Where a device's time went in a jax.profiler trace: kernels grouped by name.

    python benchmarks/trace_summary.py TRACE_DIR [--steps N] [--top 30] [--hlo FILE]

Reads the newest *.xplane.pb under TRACE_DIR with jax.profiler.ProfileData and, for every
device plane (/device:GPU:N), sums the kernel events on its stream lines by name: total time,
count and share, plus the span from the first kernel to the last and the union of the
kernels' busy intervals (busy / span is the fraction of the span the device was working; the
rest is the device waiting for the host). --steps divides every total by the number of steps
traced, so figures read as per-step costs. Prints one JSON object per device.
With the optimized HLO text of the executable that ran (`--hlo FILE`; the benches pass
`JaxRunner.step_hlo`), each kernel also gets `source`: the model code it came from, as
"op @ file:line (function)" for the HLO instruction of its name and, for a fusion, each
distinct one among the instructions it fused (`hlo_sources`), so the small kernels of a step
can be traced back to the lines that made them.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys


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


# One HLO instruction: its name, then (anywhere after it) its metadata and the computation a
# fusion calls.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ")
_METADATA = re.compile(r"\bmetadata=\{([^}]*)\}")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+) \(.*\{\s*$")
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s,}]+)')
# HLO module text keeps source locations in tables that metadata's stack_frame_id points into
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
MAX_SOURCES = 6  # per kernel


def _fields(text: str) -> dict[str, str]:
    return {key: value.strip('"') for key, value in _FIELD.findall(text)}


def _short_path(path: str) -> str:
    marker = path.rfind("ninfer_jax/")
    return path[marker:] if marker >= 0 else os.path.basename(path)


def hlo_sources(hlo_text: str) -> dict[str, list[str]]:
    """Instruction name, with dots as underscores (as a GPU trace names the kernel), ->
    distinct "op @ file:line (function)" of the instruction and of the instructions of the
    computation it calls (a fusion's), at most MAX_SOURCES. The location is the innermost
    frame in ninfer_jax when the metadata has a stack (else the innermost one), or its
    source_file / source_line where the text has those instead."""
    tables = {name: {} for name in _TABLES}
    table = None
    computations: dict[str, list[tuple[str, dict, str | None]]] = {}
    current = None
    for line in hlo_text.splitlines():
        stripped = line.strip()
        if stripped in _TABLES:
            table = stripped
            continue
        if table is not None:
            if not stripped:
                table = None
                continue
            key, _, rest = stripped.partition(" ")
            tables[table][key] = rest.strip('"') if table in _TABLES[:2] else _fields(rest)
            continue
        header = _COMPUTATION.match(line)
        if header:
            current = computations.setdefault(header.group(1), [])
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction and current is not None:
            metadata = _METADATA.search(line)
            calls = _CALLS.search(line)
            current.append((instruction.group(1), _fields(metadata.group(1)) if metadata else {},
                            calls.group(1) if calls else None))

    def frame(frame_id: str) -> str | None:
        chain, seen = [], set()
        while frame_id and frame_id not in seen and frame_id in tables["StackFrames"]:
            seen.add(frame_id)
            entry = tables["StackFrames"][frame_id]
            location = tables["FileLocations"].get(entry.get("file_location_id", ""), {})
            path = tables["FileNames"].get(location.get("file_name_id", ""), "?")
            function = tables["FunctionNames"].get(location.get("function_name_id", ""), "?")
            chain.append((path, location.get("line", "?"), function))
            parent = entry.get("parent_frame_id")
            frame_id = parent if parent != frame_id else None
        if not chain:
            return None
        path, line, function = next((c for c in chain if "ninfer_jax/" in c[0]), chain[0])
        return f"{_short_path(path)}:{line} ({function})"

    def describe(metadata: dict) -> str | None:
        op = metadata.get("op_name", "")
        if not op or "/" not in op:  # parameters carry their argument's name only
            return None
        where = (frame(metadata["stack_frame_id"]) if "stack_frame_id" in metadata else
                 f"{_short_path(metadata['source_file'])}:{metadata.get('source_line', '?')}"
                 if "source_file" in metadata else None)
        return f"{op.rsplit('/', 1)[-1]} @ {where}" if where else op.rsplit("/", 1)[-1]

    sources = {}
    for instructions in computations.values():
        for name, metadata, calls in instructions:
            found = [describe(metadata)]
            found += [describe(m) for _, m, _ in computations.get(calls, ())] if calls else []
            distinct = list(dict.fromkeys(f for f in found if f))[:MAX_SOURCES]
            if distinct:
                sources[name.replace(".", "_")] = distinct
    return sources


def sources_or_none(hlo_text: str | None) -> dict[str, list[str]]:
    """hlo_sources for a bench: {} without text, and {} (with a note on stderr) if the text
    does not parse, so a device run keeps its profile either way."""
    if not hlo_text:
        return {}
    try:
        return hlo_sources(hlo_text)
    except Exception as error:  # noqa: BLE001 - the attribution is an extra, not the figure
        print(f"trace_summary: no sources ({error!r})", file=sys.stderr)
        return {}


def annotate(summary: dict, sources: dict[str, list[str]]) -> dict:
    """`summary` (summarize's) with each top kernel's `source` where the HLO names it."""
    for entry in summary["top"]:
        found = sources.get(entry["name"]) or sources.get(entry["name"].replace(".", "_"))
        if found:
            entry["source"] = found
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace_dir")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--hlo", help="the optimized HLO text of the executable traced")
    args = parser.parse_args()
    sources = {}
    if args.hlo:
        with open(args.hlo) as f:
            sources = hlo_sources(f.read())
    for summary in summarize(args.trace_dir, args.steps, args.top):
        print(json.dumps(annotate(summary, sources)))


if __name__ == "__main__":
    main()
