"""`ninfer serve --tensor-parallel 2` end to end on 2 XLA host devices (XLA_FLAGS in the
server's environment only), with a tiny random qwen3 artifact (4 heads, 2 kv heads).

Through the openai SDK: a chat, a stream whose text equals the same greedy request's, and 4
concurrent greedy requests each equal to it alone; /metrics and the request log's
server_start show the 2-device mesh. Start-up refuses a size that does not divide the heads,
and --expert-parallel on a model without routed experts, with one line."""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import FEW_SHAPES, NINFER, early_or_now, free_port, start_server

HOST_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
PROMPTS = ["Say hello.", "Name a colour.", "Count to three.", "What is two plus two?"]


@pytest.fixture(scope="module")
def tiny_artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp") / "qwen3-tiny.ninfer"
    subprocess.run([str(NINFER), "init-random", "--preset", "qwen3-tiny", str(path)],
                   check=True, capture_output=True, timeout=300)
    return path


def start_tp(folder):
    artifact = folder / "qwen3-tiny.ninfer"
    subprocess.run([str(NINFER), "init-random", "--preset", "qwen3-tiny", str(artifact)],
                   check=True, capture_output=True, timeout=300)
    log = folder / "requests.jsonl"
    server = start_server(artifact, "--tensor-parallel", "2", "--max-context", "256",
                          "--prefill-chunk", "32", "--max-concurrency", "4", "--seed", "1",
                          *FEW_SHAPES, "--request-log-jsonl", str(log),
                          env_extra=HOST_DEVICES)
    server.model_id = "qwen3-tiny"
    server.request_log = log
    return server


EARLY_STARTS = {"tp_server": start_tp}


@pytest.fixture(scope="module")
def tp_server():
    server = early_or_now(start_tp)
    yield server
    server.stop(wait=False)


def _chat(server, prompt: str) -> str:
    reply = server.openai().chat.completions.create(
        model=server.model_id, messages=[{"role": "user", "content": prompt}],
        max_tokens=12, temperature=0)
    return reply.choices[0].message.content


def test_chat_stream_and_concurrency(tp_server):
    solo = [_chat(tp_server, prompt) for prompt in PROMPTS]
    assert all(solo)
    stream = tp_server.openai().chat.completions.create(
        model=tp_server.model_id, messages=[{"role": "user", "content": PROMPTS[0]}],
        max_tokens=12, temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream
                   if chunk.choices) == solo[0]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: _chat(tp_server, p), PROMPTS))
    assert together == solo


def test_metrics_and_server_start_show_the_mesh(tp_server):
    with tp_server.http() as http:
        text = http.get("/metrics").text
    samples = [sample for family in text_string_to_metric_families(text)
               if family.name == "ninfer_tensor_parallel" for sample in family.samples]
    assert [s.value for s in samples] == [2.0]
    assert samples[0].labels["axis"] == "tp"
    assert len(samples[0].labels["devices"].split(",")) == 2
    records = [json.loads(line) for line in tp_server.request_log.read_text().splitlines()]
    start = next(r for r in records if r.get("event") == "server_start")
    mesh = start["runtime"]["mesh"]
    assert mesh["tensor_parallel"] == 2 and len(mesh["devices"]) == 2


@pytest.mark.parametrize("options,error", [
    (["--tensor-parallel", "4"], "--tensor-parallel 4 does not divide the model's 2 kv heads"),
    (["--tensor-parallel", "2", "--expert-parallel"],
     "--expert-parallel needs a MoE model; qwen3 has no routed experts")])
def test_refuses_what_it_cannot_split(tiny_artifact, options, error):
    done = subprocess.run([str(NINFER), "serve", str(tiny_artifact), "--port",
                           str(free_port()), *options],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ,
                               "XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert done.returncode != 0
    assert error in done.stderr + done.stdout
