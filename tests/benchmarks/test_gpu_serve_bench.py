"""benchmarks/gpu_serve_bench.py and proclib.py: output parsing, time caps, the readiness
timeline of a (fake) server and the JSON-line records."""
from __future__ import annotations

import json
import sys
import textwrap
import time

import pytest

import gpu_serve_bench
import proclib

RUNNER_TEXT = """\
qwen3-8b: dtype bfloat16, buckets chunks (16, 64, 256) widths (8, 32)
prefill 256 tokens: 40123 tok/s
decode batch 1 at context 384: 221.5 tok/s (4.5 ms/step)
decode batch 8 at context 384: 1650.0 tok/s (4.8 ms/step)
"""


def test_runner_output_text_lines():
    parsed = gpu_serve_bench.parse_runner_output(RUNNER_TEXT)
    assert parsed["decode_tok_s"] == {1: 221.5, 8: 1650.0}
    assert parsed["prefill_tok_s"] == 40123.0


def test_runner_output_json_lines_are_kept_and_read():
    text = "\n".join([
        "compiling...",
        json.dumps({"kind": "prefill", "prompt": 256, "tok_s": 39000.5}),
        json.dumps({"kind": "decode", "batch": 64, "context": 384, "tok_s": 7000.0}),
        json.dumps({"rows": 256, "decode_tok_s": 15000.0, "ms_per_step": 17.1}),
        json.dumps({"op": "decode", "batch": 8, "context": 384, "tok_per_s": 1600.0}),
        json.dumps({"op": "params", "weight_bytes": 16e9}),
        "{not json",
    ])
    parsed = gpu_serve_bench.parse_runner_output(text)
    assert parsed["decode_tok_s"] == {8: 1600.0, 64: 7000.0, 256: 15000.0}
    assert parsed["prefill_tok_s"] == 39000.5
    assert len(parsed["json_records"]) == 5


def test_metrics_counters_are_summed_over_labels():
    page = textwrap.dedent("""\
        # HELP ninfer_decode_rows_total rows
        ninfer_decode_rows_total 120.0
        ninfer_requests_total{outcome="stop"} 3.0
        ninfer_requests_total{outcome="length"} 4.0
        ninfer_prefill_units_total 7
        """)
    assert proclib.parse_metrics(page, ("ninfer_decode_rows_total", "ninfer_requests_total")) \
        == {"ninfer_decode_rows_total": 120.0, "ninfer_requests_total": 7.0}


def test_budget_caps_and_skips():
    budget = proclib.Budget(total_s=100.0, reserve_s=10.0)
    assert budget.cap(30.0) == 30.0
    assert 85.0 < budget.cap(500.0) <= 90.0
    assert proclib.Budget(total_s=12.0, reserve_s=10.0).cap(60.0) is None  # under MIN_STAGE_S


def test_run_capped_kills_a_stalled_command_and_its_children(tmp_path):
    script = "import subprocess, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"
    started = time.monotonic()
    run = proclib.run_capped([sys.executable, "-c", script], 1.0, str(tmp_path / "log"), {})
    assert run["timed_out"] and run["rc"] != 0
    assert time.monotonic() - started < 10
    ok = proclib.run_capped([sys.executable, "-c", "print('hello')"], 30.0,
                            str(tmp_path / "log"), {})
    assert (ok["rc"], ok["timed_out"], ok["stdout"]) == (0, False, "hello\n")
    assert "hello" in (tmp_path / "log").read_text()


FAKE_SERVER = """
import http.server, json, sys, time
time.sleep(0.3)  # imports
print("INFO warming up", flush=True)
ready_at = time.monotonic() + 0.6  # warm-up
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        ok = time.monotonic() >= ready_at
        body = json.dumps({"status": "ok" if ok else "loading"}).encode()
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_server_readiness_timeline_and_stop(tmp_path):
    port = proclib.free_port()
    server = proclib.Server([sys.executable, "-c", FAKE_SERVER, str(port)], {},
                            str(tmp_path / "server.log"), f"http://127.0.0.1:{port}")
    timeline = server.start_and_wait(cap_s=20.0)
    assert 0.3 <= timeline["listening_s"] < timeline["ready_s"] < 10
    assert [h["body"]["status"] for h in timeline["health"]] == ["loading", "ok"]
    assert [h["status"] for h in timeline["health"]] == [503, 200]
    assert server.log_lines("warm") == ["INFO warming up"]
    assert server.log_lines("never printed") == []
    assert server.stop(grace_s=5.0) < 6
    assert server.proc.poll() is not None


def test_server_that_never_gets_ready_times_out(tmp_path):
    server = proclib.Server([sys.executable, "-c", "import time; time.sleep(60)"], {},
                            str(tmp_path / "server.log"), f"http://127.0.0.1:{proclib.free_port()}")
    timeline = server.start_and_wait(cap_s=1.0)
    assert timeline["timed_out"] and timeline["ready_s"] is None and timeline["health"] == []
    assert server.stop(grace_s=0) < 5


def test_results_are_json_lines_with_the_command(tmp_path):
    results = proclib.Results(str(tmp_path / "results.jsonl"))
    results.add("step", ["python3", "bench.py", "--batches", "1,8"], rc=0)
    results.add("load", "python3 x.py --a 'b c'", concurrency=8)
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert rows[0]["command"] == "python3 bench.py --batches 1,8" and rows[0]["rc"] == 0
    assert rows[1]["stage"] == "load" and rows[1]["concurrency"] == 8


def test_smoke_and_gpu_defaults_and_stage_names():
    gpu = gpu_serve_bench.parse_args(["--out", "/tmp/x"])
    assert gpu.presets == "qwen3-8b" and "--max-concurrency 256" in gpu.serve_args
    smoke = gpu_serve_bench.parse_args(["--smoke", "--levels", "1"])
    assert smoke.presets == "qwen3-tiny" and smoke.levels == "1"
    with pytest.raises(SystemExit):
        gpu_serve_bench.parse_args(["--stages", "install,bogus"])


def test_a_level_measured_while_shapes_compile_says_so(capsys):
    level = dict(stage="load", preset="qwen3-8b", concurrency=8, decode_tok_s=179.2,
                 server_decode_tok_s=179.2, request_tok_s_p50=22.4, ttft_p50_s=0.479,
                 itl_p50_s=0.023, itl_p99_s=0.94, itl_max_s=0.996, server_over_step=None)
    gpu_serve_bench.print_summary([{**level, "all_shapes_compiled": False},
                                   {**level, "all_shapes_compiled": True}])
    compiling, steady = capsys.readouterr().out.splitlines()[-2:]
    assert "C=8: decode 179.2" in compiling and "still compiling" in compiling
    assert "C=8: decode 179.2" in steady and "still compiling" not in steady


def test_a_level_with_too_little_time_left_is_skipped_not_cut(tmp_path):
    """Run 44's 64 level got 6 s of --total and was killed mid-level: a level now starts
    only with MIN_MEASURE_S left, else it is recorded as skipped."""
    args = gpu_serve_bench.parse_args(["--out", str(tmp_path), "--total", "60",
                                       "--reserve", "0"])
    bench = gpu_serve_bench.Bench(args)
    assert bench.capped("load", "level", least_s=gpu_serve_bench.MIN_MEASURE_S) is not None
    bench.budget.deadline = time.monotonic() + gpu_serve_bench.MIN_MEASURE_S - 10
    assert bench.capped("load", "level") is not None  # a plain stage still runs
    assert bench.capped("load", "level", least_s=gpu_serve_bench.MIN_MEASURE_S) is None
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert rows[-1]["stage"] == "load" and rows[-1]["skipped"].startswith("only ")
