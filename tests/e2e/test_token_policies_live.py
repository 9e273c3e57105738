"""End to end: penalty lanes and token policies (thinking budgets, forced tool calls, on the
device and on the host) under pool pressure and client disconnects, on a live `ninfer serve`
of a random Qwen3.5 dense artifact (its template opens a think block, so budgets apply).

Four lanes over a 1024-token KV pool: nine long requests at once pause and resume (replay,
the host tier is off), and each must still produce what it produces alone; a stream that
disconnects while its lane holds penalty counts or an automaton must leave nothing behind for
the request that takes the lane next. Usage and /metrics must agree.
"""
from __future__ import annotations

import concurrent.futures
import random
import re
import subprocess
import threading

import httpx
import pytest

from conftest import FEW_SHAPES, NINFER, log_records, start_server

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
FORCED = {"type": "function", "function": {"name": "get_weather"}}
# Long names (10 x 70 letters) make a required call's automaton too large for a lane (more
# than 256 name states): it stays on the host. (A named choice renders only its own tool.)
_NAMES = random.Random(1)
LONG_TOOLS = [{"type": "function", "function": {
    "name": "".join(_NAMES.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(70)),
    "parameters": {"type": "object", "properties": {}}}} for _ in range(10)]
SPECS = [
    ("What is the capital of France?", dict(temperature=0)),
    ("Write a haiku about autumn.", dict(temperature=0, presence_penalty=2.0,
                                         frequency_penalty=2.0)),
    ("List three colours.", dict(temperature=0.9, seed=0, frequency_penalty=-2.0)),
    ("Explain a CPU.", dict(temperature=1.0, seed=2 ** 64 - 1, top_k=1, presence_penalty=1.0)),
    ("Name a painting.", dict(temperature=0, thinking_budget=12)),
    ("Give me a cooking tip.", dict(temperature=0.8, seed=7, thinking_budget=20,
                                    presence_penalty=1.5)),
    ("What's the weather in Paris?", dict(temperature=0, tools=[TOOL], tool_choice=FORCED,
                                          enable_thinking=False, frequency_penalty=2.0)),
    ("What's the weather in Rome?", dict(temperature=0, tools=[TOOL], tool_choice=FORCED,
                                         thinking_budget=10, frequency_penalty=1.5)),
    ("Pick a tool.", dict(temperature=0.7, seed=11, tools=LONG_TOOLS, tool_choice="required",
                          enable_thinking=False, frequency_penalty=2.0)),
]
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("policies")
    artifact = folder / "qwen3.5-dense-tiny.ninfer"
    subprocess.run([str(NINFER), "init-random", "--preset", "qwen3.5-dense-tiny",
                    str(artifact), "--quiet"], check=True)
    server = start_server(artifact, "--max-context", "1024", "--prefill-chunk", "64",
                          *FEW_SHAPES, "--max-concurrency", "4", "--kv-capacity", "1024",
                          "--host-context-mib", "0", "--request-log-jsonl",
                          str(folder / "requests.jsonl"), "--log-level", "debug")
    server.request_log = folder / "requests.jsonl"
    yield server
    server.stop()


def model_id(server) -> str:
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


def stream(server, prompt: str, fields: dict, *, cut_after: int | None = None,
           started: threading.Event | None = None) -> dict:
    """One streamed chat request: its text, reasoning, tool calls, finish and usage (cached
    tokens left out: they depend on what ran before). `cut_after`: disconnect after that
    many chunks; `started` is set at the first chunk."""
    standard = {k: v for k, v in fields.items() if k in ("temperature", "seed", "tools",
                                                          "tool_choice", "presence_penalty",
                                                          "frequency_penalty")}
    extra = {k: v for k, v in fields.items() if k not in standard}
    # A stream to be cut asks for the whole context, so it is still running when it goes.
    limit = {} if cut_after is not None else {"max_tokens": MAX_TOKENS}
    chunks = server.openai().chat.completions.create(
        model=model_id(server), messages=[{"role": "user", "content": prompt}],
        **limit, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, **extra}, **standard)
    reply = {"content": "", "reasoning": "", "calls": {}, "finish": None, "usage": None}
    for count, chunk in enumerate(chunks, 1):
        if started is not None:
            started.set()
        if cut_after is not None and count >= cut_after:
            chunks.close()
            return {"id": chunk.id, "cut": True}
        reply["id"] = chunk.id
        if chunk.usage is not None:
            reply["usage"] = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens,
                              chunk.usage.total_tokens,
                              chunk.usage.completion_tokens_details.reasoning_tokens)
        for choice in chunk.choices:
            reply["content"] += choice.delta.content or ""
            reply["reasoning"] += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for call in choice.delta.tool_calls or []:
                name, args = reply["calls"].get(call.index, ("", ""))
                reply["calls"][call.index] = (name + (call.function.name or ""),
                                              args + (call.function.arguments or ""))
            reply["finish"] = choice.finish_reason or reply["finish"]
    if cut_after is None:
        del reply["id"]
    return reply


def run_all(server, **kwargs) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(len(SPECS)) as pool:
        return list(pool.map(lambda spec: stream(server, *spec, **kwargs), SPECS))


def run_all_under_pressure(server) -> list[dict]:
    """Every spec at once, the long-tools request first: the others are sent once it streams,
    so its ~1000 tokens share the 1024-token pool with them and something must pause. (Sent
    all at once, a loaded host could let the long one run alone and nothing paused.)"""
    started = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(len(SPECS)) as pool:
        first = pool.submit(stream, server, *SPECS[-1], started=started)
        assert started.wait(120)
        rest = [pool.submit(stream, server, *spec) for spec in SPECS[:-1]]
        return [future.result() for future in rest] + [first.result()]


def generation_tokens(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    return float(re.search(r"^ninfer_generation_tokens_total (\S+)$", text, re.M).group(1))


@pytest.fixture(scope="module")
def alone(policy_server) -> list[dict]:
    return [stream(policy_server, *spec) for spec in SPECS]


def test_mixed_policies_under_pressure_equal_each_request_alone(policy_server, alone):
    assert all(r["usage"][1] == MAX_TOKENS and r["finish"] == "length" for r in alone)
    assert any(r["reasoning"] for r in alone)  # budgets ran inside a think block
    log_before = policy_server.stderr_text()
    before = generation_tokens(policy_server)
    together = run_all_under_pressure(policy_server)
    assert together == alone
    assert generation_tokens(policy_server) - before == MAX_TOKENS * len(SPECS)
    log = policy_server.stderr_text()[len(log_before):]
    assert re.search(r"restore request_id=\S+ seq=\d+ route=replay", log)
    assert "token policy ForcedToolCall stays on the host: more than" in log
    assert "token policy PolicyChain stays on the host" in log


def test_a_disconnected_stream_leaves_its_lane_clean(policy_server, alone):
    cut = [stream(policy_server, prompt, fields, cut_after=6 + 5 * k)
           for k, (prompt, fields) in enumerate(SPECS[:4])]
    cut += run_all(policy_server, cut_after=12)
    # A stream whose reply shows nothing (blank tokens, a call still being parsed) ends
    # before its cut; the others went while their lanes held counts or an automaton.
    assert sum(reply.get("cut", False) for reply in cut) >= 8
    for reply in cut:
        request_id = reply["id"].removeprefix("chatcmpl-")
        done = log_records(policy_server.request_log, request_id, "request_done", wait_s=30)
        assert done, reply
        assert done[0]["finish_reason"] == ("cancelled" if reply.get("cut") else "length")
    assert [stream(policy_server, *spec) for spec in SPECS] == alone
