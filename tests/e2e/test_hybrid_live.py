"""End to end: a hybrid Qwen3.5 artifact (Gated DeltaNet + gated attention, random weights from
`ninfer init-random --preset qwen3.5-tiny`) served by a live `ninfer serve`, through the
openai and anthropic SDKs: concurrent greedy streams equal the same requests alone, a
repeated conversation resumes from a state checkpoint with the same text, and the state-slot
gauges report the slots in use."""
from __future__ import annotations

import concurrent.futures
import subprocess

import anthropic
import httpx
import pytest

from conftest import FEW_SHAPES, NINFER, early_or_now, start_server

LANES = 4
QUESTIONS = ["Name a colour.", "Count to three.", "Say hello in French.", "What is 2 + 2?",
             "Spell cat backwards.", "Name a planet."]


def start_hybrid(folder):
    artifact = folder / "qwen3.5-tiny.ninfer"
    subprocess.run([str(NINFER), "init-random", "--preset", "qwen3.5-tiny", str(artifact),
                    "--quiet"], check=True)
    return start_server(artifact, "--max-context", "512", "--prefill-chunk", "64", *FEW_SHAPES,
                        "--max-concurrency", str(LANES))


EARLY_STARTS = {"hybrid_server": start_hybrid}


@pytest.fixture(scope="module")
def hybrid_server():
    server = early_or_now(start_hybrid)
    yield server
    server.stop(wait=False)


def model_id(server) -> str:
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


def chat(server, question: str, max_tokens: int = 12):
    client = server.openai()
    reply = client.chat.completions.create(
        model=model_id(server), max_tokens=max_tokens, temperature=0,
        messages=[{"role": "user", "content": question}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    return reply


def test_concurrent_greedy_streams_equal_the_same_requests_alone(hybrid_server):
    alone = [chat(hybrid_server, q).choices[0].message.content for q in QUESTIONS]
    with concurrent.futures.ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda q: chat(hybrid_server, q), QUESTIONS))
    assert [r.choices[0].message.content for r in together] == alone
    assert all(r.usage.completion_tokens == 12 for r in together)


def test_a_repeated_conversation_reuses_a_checkpoint_with_the_same_text(hybrid_server):
    question = "Tell me about the sea. " * 12  # several pages of prompt
    first = chat(hybrid_server, question)
    again = chat(hybrid_server, question)
    assert again.choices[0].message.content == first.choices[0].message.content
    cached = again.usage.prompt_tokens_details.cached_tokens
    # Only whole pages up to a state checkpoint count as reused, never the whole prompt.
    assert 0 < cached < again.usage.prompt_tokens


def test_anthropic_messages_and_state_slot_gauges(hybrid_server):
    client = anthropic.Anthropic(base_url=hybrid_server.url, api_key="unused", max_retries=0,
                                 timeout=300)
    message = client.messages.create(model=model_id(hybrid_server), max_tokens=8,
                                     messages=[{"role": "user", "content": "Hi"}],
                                     extra_body={"temperature": 0})
    assert message.usage.output_tokens == 8 and message.stop_reason == "max_tokens"
    metrics = httpx.get(hybrid_server.url + "/metrics").text
    gauges = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("ninfer_device_state_")}
    # --device-state-slots defaults to --max-concurrency: LANES lanes + LANES spare.
    assert gauges["ninfer_device_state_capacity_slots"] == 2 * LANES
    assert 0 <= gauges["ninfer_device_state_used_slots"] <= 2 * LANES
