"""`ninfer replay --artifact`: the in-process server on a tiny random artifact (fast to compile),
run twice. The first run keeps its request log (--server-log); the second compares with it:
greedy and seeded requests identical, an unseeded sampled one not comparable."""
import json

import pytest
from click.testing import CliRunner

from ninfer_jax.cli.replay import replay

SERVE_ARGS = "--max-context 256 --prefill-chunk 32 --max-concurrency 2"


@pytest.fixture(scope="module")
def tiny_artifact(tmp_path_factory):
    from ninfer_jax.artifact.format import save_artifact
    from ninfer_jax.artifact.random_init import init_random

    path = tmp_path_factory.mktemp("replay-artifact") / "tiny.ninfer"
    save_artifact(path, init_random("qwen3-tiny", seed=3))
    return path


def capture_file(folder, model) -> str:
    messages = [{"role": "user", "content": "Count to five."}]
    bodies = [
        ("/v1/chat/completions", {"messages": messages, "max_tokens": 10, "temperature": 0}),
        ("/v1/chat/completions", {"messages": messages, "max_tokens": 10, "temperature": 0.8,
                                  "seed": 5, "stream": True}),
        ("/v1/completions", {"prompt": "one two three", "max_tokens": 6, "temperature": 0}),
        ("/v1/chat/completions", {"messages": messages, "max_tokens": 10, "temperature": 0.8}),
    ]
    path = folder / "capture.jsonl"
    path.write_text("".join(json.dumps({
        "event": "request_capture", "request_id": f"c{i}", "endpoint": endpoint,
        "body": {"model": model, **body}}) + "\n" for i, (endpoint, body) in enumerate(bodies)))
    return str(path)


def test_artifact_replay_twice_compares(tiny_artifact, tmp_path):
    capture = capture_file(tmp_path, "qwen3-tiny")
    first_log = tmp_path / "first.jsonl"
    first = CliRunner().invoke(replay, [capture, "--artifact", str(tiny_artifact),
                                        "--serve-args", SERVE_ARGS,
                                        "--server-log", str(first_log), "--json"])
    assert first.exit_code == 0, first.output
    report = json.loads(first.output)
    assert report["succeeded"] == 4 and report["comparison"] is None
    assert report["target"].startswith("artifact ")
    # Captured ids are not the ids the first run's server gave: join them by order.
    ids = [r["replay_id"] for r in report["per_request"]]
    lines = [json.loads(line) for line in first_log.read_text().splitlines()]
    for line in lines:
        if line.get("request_id") in ids:
            line["request_id"] = f"c{ids.index(line['request_id'])}"
    previous = tmp_path / "previous.jsonl"
    previous.write_text("".join(json.dumps(line) + "\n" for line in lines))

    second = CliRunner().invoke(replay, [capture, "--artifact", str(tiny_artifact),
                                         "--serve-args", SERVE_ARGS, "--compare",
                                         str(previous), "--concurrency", "2"])
    assert second.exit_code == 0, second.output
    assert "compare     3 identical, 0 mismatch, 1 not_comparable" in second.output
