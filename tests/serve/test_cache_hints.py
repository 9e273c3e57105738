"""Cache hints through the dialects to the engine, with the openai and anthropic SDKs over
WSGI: `prompt_cache_options.mode: explicit` writes only up to the marked breakpoints, reads
need no marker, usage reports exactly the verified reused tokens (whole 16-token pages of
the common rendered prefix), and bad hints are field-specific 400s."""
import anthropic
import httpx2
import openai
import pytest

from harness import build_harness
from ninfer_jax.serve.anthropic.request import parse_request
from ninfer_jax.serve.openai.chat import parse_chat

PAGE = 16  # the harness runner's page size
SYSTEM = ("You are a careful assistant for a museum of maps. Answer in one sentence, cite the "
          "room number, and never invent a map that is not in the catalogue. ") * 2


@pytest.fixture(scope="module")
def harness(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, max_context=1024)
    h.book.add("hello", "Hello there!")
    yield h
    h.close()


def http(harness):
    return httpx2.Client(transport=httpx2.WSGITransport(app=harness.app))


@pytest.fixture(scope="module")
def oai(harness):
    return openai.OpenAI(base_url="http://ninfer.test/v1", api_key="unused",
                         http_client=http(harness), max_retries=0)


@pytest.fixture(scope="module")
def claude(harness):
    return anthropic.Anthropic(base_url="http://ninfer.test", api_key="unused",
                               http_client=http(harness), max_retries=0)


def reused(first, second) -> int:
    """Tokens a request rendering `second` can reuse after one rendering `first`."""
    common = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b),
                  min(len(first), len(second)))
    return min(common, len(second) - 1) // PAGE * PAGE


def chat_messages(system, user, marked=False):
    part = {"type": "text", "text": system}
    if marked:
        part["prompt_cache_breakpoint"] = {"mode": "explicit"}
    return [{"role": "system", "content": [part]},
            {"role": "user", "content": f"SCRIPT:hello {user}"}]


def chat_ids(harness, messages, **fields):
    body = {"model": "smollm2-135m-instruct", "messages": messages, **fields}
    conversation = parse_chat(body, harness.ctx)[0]
    return harness.ctx.renderer.render(conversation)


def ask(oai, messages, **extra):
    return oai.chat.completions.create(model="smollm2-135m-instruct", messages=messages,
                                       max_tokens=4, extra_body=extra or None)


def test_explicit_mode_writes_nothing_without_a_marker(oai, harness):
    system = "Explicit, unmarked. " + SYSTEM
    ask(oai, chat_messages(system, "one"), prompt_cache_options={"mode": "explicit"})
    second = ask(oai, chat_messages(system, "two"))  # the first wrote nothing
    assert second.usage.prompt_tokens_details.cached_tokens == 0
    third = ask(oai, chat_messages(system, "three"))  # the second's automatic write
    expected = reused(chat_ids(harness, chat_messages(system, "two")).ids,
                      chat_ids(harness, chat_messages(system, "three")).ids)
    assert third.usage.prompt_tokens_details.cached_tokens == expected > PAGE


def test_explicit_marker_writes_up_to_its_frontier_only(oai, harness):
    system = "Explicit, marked. " + SYSTEM
    first = chat_messages(system, "a long first question about the map rooms", marked=True)
    rendered = chat_ids(harness, first, prompt_cache_options={"mode": "explicit"})
    (offset,) = rendered.breakpoints  # explicit mode: the marker alone, at the system's end
    ask(oai, first, prompt_cache_options={"mode": "explicit"})
    # Same system, a longer user turn: only the marked prefix was written.
    again = ask(oai, chat_messages(system, "a long first question about the map rooms!"))
    assert again.usage.prompt_tokens_details.cached_tokens == offset // PAGE * PAGE > 0
    assert offset // PAGE * PAGE < reused(rendered.ids, chat_ids(harness, chat_messages(
        system, "a long first question about the map rooms!")).ids)


@pytest.mark.parametrize("extra, param", [
    ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
    ({"prompt_cache_key": 7}, "prompt_cache_key"),
    ({"prompt_cache_options": {"mode": "sometimes"}}, "prompt_cache_options.mode"),
])
def test_bad_openai_hints_are_field_specific_400s(oai, extra, param):
    with pytest.raises(openai.BadRequestError) as error:
        ask(oai, chat_messages(SYSTEM, "x"), **extra)
    assert error.value.status_code == 400 and error.value.body["param"] == param


def test_valid_openai_hints_are_accepted(oai):
    reply = ask(oai, chat_messages(SYSTEM, "x"), prompt_cache_key="tenant-1",
                prompt_cache_retention="24h")
    assert reply.choices[0].message.content == "Hello there!"


def claude_body(system, user, **fields):
    return {"model": "smollm2-135m-instruct", "max_tokens": 4,
            "system": [{"type": "text", "text": system,
                        "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "messages": [{"role": "user", "content": f"SCRIPT:hello {user}"}], **fields}


def test_anthropic_reads_report_verified_cache_tokens(claude, harness):
    system = "Anthropic. " + SYSTEM
    first = claude.messages.create(**claude_body(system, "one"))
    assert first.usage.cache_read_input_tokens == 0
    second = claude.messages.create(**claude_body(system, "two"))

    def ids(user):
        request = parse_request(claude_body(system, user), default_max_tokens=64, vocab_size=49152)
        return harness.ctx.renderer.render(request.conversation).ids

    assert second.usage.cache_read_input_tokens == reused(ids("one"), ids("two")) > PAGE
    assert second.usage.cache_creation_input_tokens is None  # unknown, as the contract says
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == len(ids("two"))


def test_anthropic_cache_control_conflicts_are_400s(claude):
    body = claude_body(SYSTEM, "x", cache_control={"type": "ephemeral", "ttl": "5m"})
    body["messages"][0]["content"] = [{"type": "text", "text": "SCRIPT:hello",
                                       "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    with pytest.raises(anthropic.BadRequestError) as error:  # request level, same block
        claude.messages.create(**body)
    assert error.value.status_code == 400 and "conflicts" in str(error.value)
    body = claude_body(SYSTEM, "x")
    body["system"][0]["cache_control"]["ttl"] = "2h"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(**body)


def test_metrics_report_the_host_tier(harness):
    text = http(harness).get("http://ninfer.test/metrics").text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    page_bytes = harness.runner.page_bytes
    assert values["ninfer_host_context_capacity_bytes"] == (8192 << 20) // page_bytes * page_bytes
    assert values["ninfer_host_context_used_bytes"] == harness.engine.host.num_used * page_bytes
    assert "ninfer_snapshot_restores_total" in values
    assert 'ninfer_context_transfer_bytes_total{direction="device_to_host",resource="main_kv"}' \
        in values
