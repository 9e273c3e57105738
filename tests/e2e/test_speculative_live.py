"""Speculative decoding end to end: a live `ninfer serve --spec ngram` of the default model.

Through the openai SDK, greedy replies with speculation equal the same requests with the
per-request `draft: false` (plain decoding in the same server), alone and 8 concurrent; a
stop string and max_tokens that cut an accepted run give the same text and usage; the
anthropic and Responses dialects take `draft` too; /metrics, the request log's speculative
object and the throughput line report the work. A hybrid artifact with its MTP head
(`init-random --preset qwen3.5-tiny`) serves --spec mtp with the same text as `draft: false`.
The same artifact's DFlash2 drafter with its reduced proposal head (--spec dflash2
--lm-head-draft) gives the same text as `draft: false` too, and so does a dense artifact with
random drafters (`init-random --preset qwen3-tiny --drafters`) under --spec dflash. Start-up
refuses drafters an artifact does not have and --spec mtp without a head."""
from __future__ import annotations

import concurrent.futures
import json
import pathlib
import subprocess
import threading
import time

import anthropic
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import FEW_SHAPES, NINFER, early_folder, early_or_now, free_port, start_server

MODEL = "smollm2-135m-instruct"
LANES = 8
PARAGRAPH = ("The old lighthouse stood on a rock at the edge of the bay. Every evening the "
             "keeper climbed its hundred stairs, trimmed the wick, lit the great lamp and "
             "watched the fishing boats come home through the fog, counting each one until "
             "the harbour was full and the night was quiet.")


def spec_flags() -> tuple:
    return ("--max-context", "1024", "--prefill-chunk", "64", "--max-concurrency", str(LANES),
            "--spec", "ngram", "--draft-tokens", "3", "--seed", "7", *FEW_SHAPES,
            "--request-log-jsonl", str(early_folder("speculative") / "requests.jsonl"),
            "--log-stats-interval-ms", "500")


EARLY_SERVERS = {"spec_server": lambda: (spec_flags(), None)}


@pytest.fixture(scope="module")
def spec_server(server_factory):
    server = server_factory(*spec_flags())
    server.folder = early_folder("speculative")
    return server


def echo(client, index=0, *, draft=True, **fields):
    text = PARAGRAPH if index % 2 == 0 else PARAGRAPH.replace("lighthouse", "windmill")
    extra = {} if draft else {"draft": False}
    fields.setdefault("max_tokens", 60)
    return client.chat.completions.create(
        model=MODEL, temperature=0, extra_body=extra,
        messages=[{"role": "user", "content": f"Repeat this paragraph exactly: {text}"}],
        **fields)


def reply(completion):
    return (completion.choices[0].message.content, completion.usage.completion_tokens,
            completion.choices[0].finish_reason)


def test_greedy_equals_draft_false_alone_and_concurrent(spec_server):
    client = spec_server.openai()
    plain = [reply(echo(client, i, draft=False)) for i in range(2)]
    assert reply(echo(client, 0)) == plain[0]
    with concurrent.futures.ThreadPoolExecutor(LANES) as pool:
        together = list(pool.map(lambda i: reply(echo(spec_server.openai(), i)), range(LANES)))
    assert together == [plain[i % 2] for i in range(LANES)]


def test_draft_counts_in_the_terminal_timings(spec_server):
    body = {"model": MODEL, "max_tokens": 40, "temperature": 0, "messages": [
        {"role": "user", "content": f"Repeat this paragraph exactly: {PARAGRAPH}"}]}
    with spec_server.http() as http:
        timings = http.post("/v1/chat/completions", json=body).json()["timings"]
        plain = http.post("/v1/chat/completions", json={**body, "draft": False}).json()
        bad = http.post("/v1/chat/completions", json={**body, "draft": "no"})
    assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert "draft_n" not in plain["timings"]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "draft"


def test_stop_string_and_max_tokens_inside_accepted_runs(spec_server):
    client = spec_server.openai()
    text = reply(echo(client, 0, draft=False))[0]
    words = text.split()
    stop = " ".join(words[8:10])  # a stop string well inside the echo
    plain = reply(echo(client, 0, draft=False, stop=[stop]))
    assert plain[2] == "stop" and stop not in plain[0]
    assert reply(echo(client, 0, stop=[stop])) == plain
    for limit in (5, 9, 13):
        assert reply(echo(client, 0, max_tokens=limit)) == \
            reply(echo(client, 0, draft=False, max_tokens=limit))


def test_streamed_stop_string_sends_nothing_past_it(spec_server):
    client = spec_server.openai()
    text = reply(echo(client, 0, draft=False))[0]
    stop = text.split()[12]
    pieces = [chunk.choices[0].delta.content or "" for chunk in echo(
        client, 0, stop=[stop], stream=True) if chunk.choices]
    assert "".join(pieces) == reply(echo(client, 0, draft=False, stop=[stop]))[0]


def test_other_dialects_take_draft(spec_server):
    claude = anthropic.Anthropic(base_url=spec_server.url, api_key="unused", max_retries=0)
    message = {"role": "user", "content": f"Repeat this paragraph exactly: {PARAGRAPH}"}
    texts = [claude.messages.create(model=MODEL, max_tokens=30, messages=[message],
                                    extra_body={"temperature": 0, **extra}).content[0].text
             for extra in ({}, {"draft": False})]
    assert texts[0] == texts[1]
    client = spec_server.openai()
    outputs = [client.responses.create(model=MODEL, input=message["content"],
                                       max_output_tokens=30, temperature=0, store=False,
                                       extra_body=extra).output_text
               for extra in ({}, {"draft": False})]
    assert outputs[0] == outputs[1]


def scrape(server) -> dict:
    text = httpx.get(server.url + "/metrics").text
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples}


def log_records(server, event):
    text = (server.folder / "requests.jsonl").read_text(encoding="utf-8")
    return [r for r in map(json.loads, text.splitlines()) if r["event"] == event]


def test_metrics_request_log_and_throughput_line(spec_server):
    before = scrape(spec_server)
    echo(spec_server.openai(), 0, max_tokens=50)
    echo(spec_server.openai(), 1, max_tokens=20, draft=False)
    after = scrape(spec_server)
    delta = {name: after[name] - before.get(name, 0.0) for name in after
             if name.startswith("ninfer_spec_decode_")}
    assert delta["ninfer_spec_decode_rounds_total"] > 0
    assert 0 < delta["ninfer_spec_decode_accepted_tokens_total"] <= \
        delta["ninfer_spec_decode_draft_tokens_total"]
    deadline = time.monotonic() + 10
    while len(log_records(spec_server, "request_done")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    done = log_records(spec_server, "request_done")
    spec, plain = (done[-2], done[-1]) if done[-1]["tokens"]["completion"] == 20 else \
        (done[-1], done[-2])
    record = spec["timings_seconds"]["speculative"]
    assert record["backend"] == "ngram" and record["draft_window"] == 3
    assert record["rounds"] > 0 and 0 < record["accepted_tokens"] <= record["drafted_tokens"]
    assert len(record["accepted_per_position"]) == 3
    assert sum(record["accepted_per_position"]) == record["accepted_tokens"]
    assert plain["timings_seconds"]["speculative"]["backend"] is None
    deadline = time.monotonic() + 10
    while "spec accepted" not in spec_server.stderr_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "spec accepted" in spec_server.stderr_text()
    # Windows are periodic: one may hold drafts that were all rejected, and the window
    # holding the last rounds may still be open, so wait for the accepted tokens to appear.
    deadline = time.monotonic() + 10
    while True:
        throughput = [r["speculative"] for r in log_records(spec_server, "throughput")
                      if r["speculative"]["draft_tokens"]]
        if sum(r["accepted_tokens"] for r in throughput) > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert sum(r["accepted_tokens"] for r in throughput) > 0
    assert all(r["acceptance"] == r["accepted_tokens"] / r["draft_tokens"] for r in throughput)


def refused(artifact, *flags):
    return subprocess.run([str(NINFER), "serve", str(artifact), "--port", str(free_port()),
                           *flags], capture_output=True, text=True, timeout=300)


def test_startup_refuses_drafters_the_model_cannot_take(default_artifact_path):
    for backend in ("dflash", "dflash2"):
        result = refused(default_artifact_path, "--spec", backend)
        assert result.returncode == 2 and f"{backend} component" in result.stderr
    result = refused(default_artifact_path, "--spec", "ngram", "--lm-head-draft")
    assert result.returncode == 2 and "no proposal head" in result.stderr
    result = refused(default_artifact_path, "--spec", "mtp")
    assert result.returncode == 2 and "MTP head" in result.stderr
    result = refused(default_artifact_path, "--spec", "mtp", "--draft-tokens", "6")
    assert result.returncode == 2 and "1..5" in result.stderr
    result = refused(default_artifact_path, "--draft-tokens", "3")
    assert result.returncode == 2 and "needs --spec" in result.stderr


_HYBRID_BUILD = threading.Lock()


def hybrid_artifact() -> pathlib.Path:
    """A tiny random hybrid with its MTP head, DFlash / DFlash2 drafters and proposal head,
    built once for the two servers on it."""
    artifact = early_folder("hybrid") / "qwen3.5-tiny.ninfer"
    with _HYBRID_BUILD:
        if not artifact.exists():
            subprocess.run([str(NINFER), "init-random", "--preset", "qwen3.5-tiny",
                            str(artifact), "--quiet"], check=True)
    return artifact


def hybrid_server(artifact, folder, *spec):
    server = start_server(artifact, "--max-context", "512", "--prefill-chunk", "64",
                          "--max-concurrency", "4", *spec, *FEW_SHAPES,
                          "--request-log-jsonl", str(folder / "requests.jsonl"))
    server.folder = folder
    return server


def start_mtp(folder):
    return hybrid_server(hybrid_artifact(), folder, "--spec", "mtp", "--draft-tokens", "3")


def start_dflash2(folder):
    return hybrid_server(hybrid_artifact(), folder, "--spec", "dflash2", "--draft-tokens", "3",
                         "--lm-head-draft")


def start_dense_dflash(folder):
    """A tiny random dense qwen3 with random DFlash / DFlash2 drafters, under --spec dflash:
    its sequences hold draft-store slots (engine/state_slots.py)."""
    artifact = folder / "qwen3-tiny.ninfer"
    subprocess.run([str(NINFER), "init-random", "--preset", "qwen3-tiny", str(artifact),
                    "--drafters", "--quiet"], check=True)
    return hybrid_server(artifact, folder, "--spec", "dflash", "--draft-tokens", "3")


EARLY_STARTS = {"mtp_server": start_mtp, "dflash2_server": start_dflash2,
                "dense_dflash_server": start_dense_dflash}


@pytest.fixture(scope="module")
def mtp_server():
    server = early_or_now(start_mtp)
    yield server
    server.stop(wait=False)


@pytest.fixture(scope="module")
def dflash2_server():
    server = early_or_now(start_dflash2)
    yield server
    server.stop(wait=False)


@pytest.fixture(scope="module")
def dense_dflash_server():
    server = early_or_now(start_dense_dflash)
    yield server
    server.stop(wait=False)


def test_dense_dflash_greedy_equals_draft_false(dense_dflash_server):
    check_drafted_equals_plain(dense_dflash_server, "dflash")


def test_hybrid_mtp_greedy_equals_draft_false_and_reports_its_rounds(mtp_server):
    check_drafted_equals_plain(mtp_server, "mtp")


def test_hybrid_dflash2_with_its_proposal_head_equals_draft_false(dflash2_server):
    check_drafted_equals_plain(dflash2_server, "dflash2")


def check_drafted_equals_plain(server, backend):
    """Four greedy questions, plain then concurrent with drafts: the same text; the drafted
    requests' log records name the backend and its rounds."""
    client = server.openai()
    model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]

    def ask(question, draft=True):
        return client.chat.completions.create(
            model=model, max_tokens=16, temperature=0,
            messages=[{"role": "user", "content": question}],
            extra_body={"chat_template_kwargs": {"enable_thinking": False},
                        **({} if draft else {"draft": False})})

    questions = ["Name a colour.", "Count to three.", "Say hello.", "Name a planet."]
    plain = [ask(q, draft=False).choices[0].message.content for q in questions]
    with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
        drafted = list(pool.map(ask, questions))
    assert [r.choices[0].message.content for r in drafted] == plain
    assert scrape(server)["ninfer_spec_decode_rounds_total"] > 0
    deadline = time.monotonic() + 10
    while len(log_records(server, "request_done")) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    records = [r["timings_seconds"]["speculative"]
               for r in log_records(server, "request_done")]
    assert sum(r["backend"] == backend and r["draft_window"] == 3 and r["rounds"] > 0
               for r in records) == 4
    assert sum(r["backend"] is None for r in records) == 4
