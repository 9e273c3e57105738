"""The scheduler against a live `ninfer serve` on the default model (issue 3 acceptance).

Two extra servers: `batched` (8 lanes over a 1024-token KV pool, so long requests run under
pressure) and `one_lane` (1 lane, 1 pending slot, 2 s pending timeout: the 429/503 paths and
disconnects). Both reuse the live server's context and chunk sizes, so most executables come
from the persistent compile cache.
"""
from __future__ import annotations

import concurrent.futures
import re
import time

import httpx
import pytest

SCHED_FLAGS = ("--max-context", "1024", "--prefill-chunk", "64", "--seed", "1234")
PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about autumn leaves.",
    "List three primary colors.",
    "Explain what a CPU does in two sentences.",
    "Name a famous painting and its painter.",
    "What is 12 times 12?",
    "Give me a tip for learning to cook.",
    "Describe the color blue to someone who cannot see.",
]


@pytest.fixture(scope="module")
def batched(server_factory):
    return server_factory(*SCHED_FLAGS, "--max-concurrency", "8", "--kv-capacity", "1024")


@pytest.fixture(scope="module")
def one_lane(server_factory):
    return server_factory(*SCHED_FLAGS, "--max-concurrency", "1", "--max-pending-requests", "1",
                          "--pending-timeout-ms", "2000")


def stream_text(server, prompt, **fields) -> tuple[str, list[str], dict]:
    """Stream one chat completion; returns (text, per-chunk texts, last chunk info)."""
    client = server.openai()
    pieces, finish, usage = [], None, None
    stream = client.chat.completions.create(
        model=server.model_id, messages=[{"role": "user", "content": prompt}], stream=True,
        stream_options={"include_usage": True}, **fields)
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    return "".join(pieces), pieces, {"finish_reason": finish, "usage": usage}


def run_together(server, prompts, **fields) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(stream_text, server, p, **fields) for p in prompts]
        return [f.result()[0] for f in futures]


def test_eight_concurrent_streams_equal_their_solo_text(batched):
    solo = [stream_text(batched, p, temperature=0, max_tokens=32)[0] for p in PROMPTS]
    together = run_together(batched, PROMPTS, temperature=0, max_tokens=32)
    assert together == solo
    assert "Paris" in solo[0]


def test_seeded_sampled_request_is_the_same_alone_and_in_a_batch(batched):
    fields = dict(temperature=0.9, max_tokens=32, seed=4242)
    alone = stream_text(batched, PROMPTS[1], **fields)[0]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        mine = pool.submit(stream_text, batched, PROMPTS[1], **fields)
        others = [pool.submit(stream_text, batched, p, temperature=0, max_tokens=32)
                  for p in PROMPTS[2:5]]
        assert mine.result()[0] == alone
        for other in others:
            other.result()


def test_small_kv_pool_pauses_and_replays_without_changing_text(batched):
    # Four at a time fit the 1024-token pool; eight at once do not (8 x ~160 tokens). Batched
    # text equals solo text (test above), so the groups of four are the unpressured reference.
    fields = dict(temperature=0, max_tokens=120, extra_body={"ignore_eos": True})
    unpressured = (run_together(batched, PROMPTS[:4], **fields)
                   + run_together(batched, PROMPTS[4:], **fields))
    log_before = batched.stderr_text()
    together = run_together(batched, PROMPTS, **fields)
    assert together == unpressured
    log = batched.stderr_text()[len(log_before):]
    assert re.search(r"pause request_id=\S+ seq=\d+", log)
    assert re.search(r"restore request_id=\S+ seq=\d+", log)
    assert "replay complete request_id=" in log


def test_stop_string_split_across_tokens(batched):
    text, pieces, _ = stream_text(batched, PROMPTS[3], temperature=0, max_tokens=40)
    # A stop string made of the end of one token and the start of the next.
    starts = [sum(map(len, pieces[:i])) for i in range(len(pieces))]
    for k in range(1, len(pieces) - 1):
        stop = pieces[k][-2:] + pieces[k + 1][:2]
        if len(pieces[k]) >= 2 and len(pieces[k + 1]) >= 2 and text.find(stop) == \
                starts[k + 1] - 2:
            break
    else:
        pytest.skip("no token boundary with a unique 4-character stop string")
    stopped, _, info = stream_text(batched, PROMPTS[3], temperature=0, max_tokens=40,
                                   stop=[stop])
    assert stopped == text[: text.find(stop)]
    assert info["finish_reason"] == "stop"
    # Usage counts the tokens through the one that completed the match.
    assert info["usage"].completion_tokens == k + 2


def engine_gauges(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {name: float(value)
            for name, value in re.findall(r"^(ninfer_[a-z_]+) (\S+)$", text, re.MULTILINE)}


def test_full_capacity_gives_429_and_queue_timeout_503(one_lane):
    headers = one_lane.headers
    body = {"model": one_lane.model_id, "messages": [{"role": "user", "content": PROMPTS[0]}],
            "max_tokens": 600, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=one_lane.url, headers=headers, timeout=120) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as lane_holder:
            assert lane_holder.status_code == 200
            lines = lane_holder.iter_lines()
            next(line for line in lines if line.startswith("data:"))  # it is running
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(client.post, "/v1/chat/completions",
                                      json={**body, "stream": False, "max_tokens": 4})
                time.sleep(0.5)  # let it take the pending slot
                overloaded = client.post("/v1/chat/completions",
                                         json={**body, "stream": False, "max_tokens": 4})
                assert overloaded.status_code == 429
                assert overloaded.json()["error"]["code"] == "server_overloaded"
                timed_out = waiting.result()
            assert timed_out.status_code == 503
            assert timed_out.json()["error"]["code"] == "request_queue_timeout"
            request_id = lane_holder.headers["x-request-id"]
        # The stream is closed: the engine cancels the request and frees its lane and pages.
        deadline = time.monotonic() + 60
        pattern = re.compile(rf"cancelled request_id={re.escape(request_id)} .*"
                             r"pages_released=([1-9]\d*)")
        while not pattern.search(one_lane.stderr_text()):
            assert time.monotonic() < deadline, "the disconnected request was not cancelled"
            time.sleep(0.2)
        # /metrics agrees: nothing runs, and every used page is one the prefix cache retains.
        while True:
            gauges = engine_gauges(client)
            if gauges["ninfer_requests_running"] == 0 and (
                    gauges["ninfer_device_kv_used_pages"]
                    == gauges["ninfer_device_kv_cached_pages"]):
                break
            assert time.monotonic() < deadline, f"pages still held: {gauges}"
            time.sleep(0.2)
        after = client.post("/v1/chat/completions", json={**body, "stream": False,
                                                          "max_tokens": 4})
        assert after.status_code == 200
