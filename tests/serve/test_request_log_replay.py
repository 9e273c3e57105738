"""capture -> replay -> compare over a real app with the fake model, served on a loopback
port: every dialect, streamed and not; greedy and seeded requests replay identically, an
unseeded sampled one is not comparable, a deliberately changed sampling field is a mismatch,
and the CLI's exit status follows."""
import json
import shutil
import threading

import httpx
import pytest
from click.testing import CliRunner
from wsgiref.simple_server import make_server

from harness import build_harness
from ninfer_jax.cli.replay import replay
from ninfer_jax.replay.compare import first_difference
from ninfer_jax.replay.local_server import _QuietHandler, _ThreadingServer
from ninfer_jax.replay.records import ReplayInputError, load_captures
from ninfer_jax.replay.report import is_success, percentile
from ninfer_jax.replay.run import ReplayOptions, run_replay


@pytest.fixture(scope="module")
def served(default_artifact, default_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("replay")
    h = build_harness(default_artifact, default_tokenizer, log_stats_interval_ms=0,
                      request_log_jsonl=str(folder / "requests.jsonl"),
                      capture_requests=str(folder / "capture.jsonl"))
    server = make_server("127.0.0.1", 0, h.app, server_class=_ThreadingServer,
                         handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield h, url, folder
    server.shutdown()
    server.server_close()
    h.close()


def original_run(h, url, folder):
    model = h.ctx.model_id
    user = [{"role": "user", "content": "tell me about owls"}]
    bodies = [
        ("/v1/chat/completions", {"messages": user, "max_tokens": 12, "temperature": 0}),
        ("/v1/chat/completions", {"messages": user, "max_tokens": 12, "temperature": 0,
                                  "stream": True}),
        ("/v1/chat/completions", {"messages": user, "max_tokens": 12, "temperature": 0.9,
                                  "seed": 42}),
        ("/v1/chat/completions", {"messages": user, "max_tokens": 12, "temperature": 0.9}),
        ("/v1/completions", {"prompt": "owls are", "max_tokens": 8, "temperature": 0}),
        ("/v1/responses", {"input": "owls?", "max_output_tokens": 8, "temperature": 0,
                           "stream": True}),
        ("/v1/messages", {"messages": user, "max_tokens": 8, "temperature": 0,
                          "stream": True}),
    ]
    with httpx.Client(base_url=url, timeout=60) as client:
        for path, body in bodies:
            assert client.post(path, json={"model": model, **body}).status_code == 200
        rejected = {"model": model, "messages": user, "max_tokens": 10 ** 6}
        assert client.post("/v1/chat/completions", json=rejected).status_code == 400
    for writer in ("request_log", "capture"):
        h.ctx.extras[writer].flush()
    shutil.copy(folder / "requests.jsonl", folder / "previous.jsonl")
    return folder / "capture.jsonl", folder / "previous.jsonl"


def test_capture_replay_compare(served, tmp_path):
    h, url, folder = served
    capture, previous = original_run(h, url, folder)
    assert len(load_captures(str(capture))) == 8
    report = run_replay(ReplayOptions(str(capture), url=url, compare_log=str(previous),
                                      server_log=str(folder / "requests.jsonl"),
                                      concurrency=3))
    counts = report["comparison"]["counts"]
    # The rejected request is rejected again with the same status and code: identical.
    assert counts == {"identical": 7, "mismatch": 0, "not_comparable": 1,
                      "missing_previous": 0, "failed": 0}
    assert is_success(report) and report["succeeded"] == 7
    streamed = [r for r in report["per_request"] if r["stream"]]
    assert len(streamed) == 3 and all(r["ttft_seconds"] is not None for r in streamed)
    assert report["ttft_seconds"]["count"] == 7  # non-streamed TTFT from the server log
    assert report["inter_token_latency_seconds"]["count"] > 0
    assert report["throughput"]["completion_tokens"] > 0

    # Change one greedy request's sampling: the earlier run was deterministic -> mismatch.
    lines = [json.loads(line) for line in capture.read_text().splitlines()]
    lines[0]["body"].update(temperature=1.0, seed=7)
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(replay, [str(changed), "--url", url, "--compare", str(previous),
                                         "--server-log", str(folder / "requests.jsonl"),
                                         "--json"])
    assert result.exit_code == 1, result.output
    verdicts = json.loads(result.output)["comparison"]["verdicts"]
    assert verdicts[0]["verdict"] == "mismatch"
    assert verdicts[0]["changed_sampling"] == ["temperature"]  # the old seed was random
    assert [v["verdict"] for v in verdicts[1:]].count("identical") == 6

    text = CliRunner().invoke(replay, [str(changed), "--url", url, "--compare", str(previous),
                                       "--server-log", str(folder / "requests.jsonl")]).output
    assert "MISMATCH" in text and "sampling changed: temperature" in text
    assert "latency" in text and "ttft" in text and "itl" in text


def test_replay_without_compare_reports_timings(served, tmp_path):
    h, url, folder = served
    if not (folder / "capture.jsonl").exists():
        original_run(h, url, folder)
    # The first captured request (greedy chat) and the rejected one (the 8th line).
    lines = (folder / "capture.jsonl").read_text().splitlines()
    capture = tmp_path / "two.jsonl"
    capture.write_text(lines[0] + "\n" + lines[7] + "\n")
    report = run_replay(ReplayOptions(str(capture), url=url))
    assert report["comparison"] is None and report["requests"] == 2
    assert report["succeeded"] == 1 and not is_success(report)  # the 400 is a failure here
    assert report["latency_seconds"]["count"] == 1
    assert [r["status"] for r in report["per_request"]] == [200, 400]


def test_compare_with_url_needs_the_server_log(served, tmp_path):
    _, url, folder = served
    capture = tmp_path / "c.jsonl"
    capture.write_text(json.dumps({"event": "request_capture", "request_id": "x",
                                   "endpoint": "/v1/completions", "body": {}}) + "\n")
    with pytest.raises(ReplayInputError, match="--server-log"):
        run_replay(ReplayOptions(str(capture), url=url, compare_log=str(capture)))
    with pytest.raises(ReplayInputError, match="exactly one"):
        run_replay(ReplayOptions(str(capture)))


def test_small_helpers():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 90) == pytest.approx(1.9)
    assert percentile([], 50) is None
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
