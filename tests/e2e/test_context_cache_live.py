"""The context cache against a live `ninfer serve` (default model, the same flags as
test_scheduler_live's `batched` server, so no extra server starts in a full run): a
conversation whose pages other traffic pushed off the 1024-token device pool comes back from
the host tier, the usage counts exactly the reused pages, and /metrics shows the copies."""
from __future__ import annotations

import re

import pytest

SCHED_FLAGS = ("--max-context", "1024", "--prefill-chunk", "64", "--seed", "1234",
               "--step-shapes", "essential")
SYSTEM = ("You are the guide of a small museum of old maps. " * 12).strip()
OTHERS = [f"Topic {n}: " + ("a long note about rivers, mountains and coastlines. " * 30)
          for n in range(3)]


BATCHED = (*SCHED_FLAGS, "--max-concurrency", "8", "--kv-capacity", "1024")
EARLY_SERVERS = {"batched": lambda: (BATCHED, None)}


@pytest.fixture(scope="module")
def batched(server_factory):
    return server_factory(*BATCHED)


def metric(server, name: str) -> float:
    text = server.http().get("/metrics").text
    pattern = re.escape(name) + r"\s+([0-9.e+]+)"
    return float(re.search(pattern, text).group(1))


def test_evicted_conversation_returns_from_the_host_tier(batched):
    client = batched.openai()
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Which room holds the oldest map?"}]
    first = client.chat.completions.create(model=batched.model_id, messages=messages,
                                           temperature=0, max_tokens=8)
    for other in OTHERS:  # ~1200 tokens of other prompts: the device pool evicts the first
        client.chat.completions.create(model=batched.model_id, temperature=0, max_tokens=2,
                                       messages=[{"role": "user", "content": other}])
    loaded_before = metric(batched, 'ninfer_context_transfer_bytes_total{direction='
                                    '"host_to_device",resource="main_kv"}')
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And the newest?"}]
    second = client.chat.completions.create(model=batched.model_id, messages=messages,
                                            temperature=0, max_tokens=8)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # At least the system prompt's whole pages came back; reuse is whole 16-token pages.
    assert cached >= first.usage.prompt_tokens // 16 * 16 - 16 and cached % 16 == 0
    assert cached < second.usage.prompt_tokens
    loaded = metric(batched, 'ninfer_context_transfer_bytes_total{direction='
                             '"host_to_device",resource="main_kv"}')
    assert loaded > loaded_before
    assert metric(batched, "ninfer_host_context_capacity_bytes") >= 8192 * 2**20 - 2**20
