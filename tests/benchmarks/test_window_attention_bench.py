"""benchmarks/window_attention_bench.py (run 38's `gemma` group runs it on the H200): one small
case on the CPU writes one JSON line per case with both paths' times."""
from __future__ import annotations

import json
import sys

import window_attention_bench


def test_one_case_writes_both_paths_times(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["window_attention_bench.py", "--shape", "small",
                                      "--batches", "2", "--contexts", "700"])
    window_attention_bench.main()
    (row,) = [json.loads(line) for line in
              (tmp_path / "window_attention_bench.jsonl").read_text().splitlines()]
    assert (row["shape"], row["batch"], row["context"], row["window"]) == ("small", 2, 700, 512)
    assert row["windowed_ms"] > 0 and row["reference_ms"] > 0
    assert row["speedup"] == row["reference_ms"] / row["windowed_ms"]
