"""Chat Completions over the real Engine with a scripted fake model: aggregate and streamed
replies, stop strings, limits, usage, timings and progress observations."""
import pytest

from harness import MODEL, STORY, chat
from ninfer_jax.serve.openai.chat import parse_chat
from sse_util import sse_chunks, streamed_text


@pytest.fixture(scope="module", autouse=True)
def scripts(harness):
    book = harness.book
    book.add("hello", "Hello there!")
    book.add("story", STORY)
    book.add("unicode", "Café ☕ naïve 🎉 done")
    book.add("ramble", "la", end=False)


def test_aggregate_reply_usage_and_timings(client, harness, default_tokenizer):
    response = chat(client, "SCRIPT:hello")
    assert response.status_code == 200 and response.headers["x-request-id"]
    body = response.json
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["id"] == "chatcmpl-" + response.headers["x-request-id"]
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello there!",
                                 "reasoning_content": None, "refusal": None}
    assert choice["finish_reason"] == "stop" and choice["logprobs"] is None
    usage = body["usage"]
    script = harness.book.scripts["hello"]
    assert usage["completion_tokens"] == len(script)  # the end token counts, unseen
    conversation = parse_chat({"model": MODEL, "messages": [
        {"role": "user", "content": "SCRIPT:hello"}]}, harness.ctx)[0]
    rendered = harness.ctx.renderer.render(conversation)
    assert usage["prompt_tokens"] == len(rendered.ids)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    timings = body["timings"]
    assert timings["cache_n"] + timings["prompt_n"] == usage["prompt_tokens"]
    assert timings["cache_n"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert timings["predicted_n"] == usage["completion_tokens"]
    assert all(v >= 0 for v in timings.values())


@pytest.mark.parametrize("key", ["story", "unicode"])
def test_stream_equals_aggregate(client, key):
    whole = chat(client, f"SCRIPT:{key}").json
    response = chat(client, f"SCRIPT:{key}", stream=True)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-request-id"]
    chunks, done, _ = sse_chunks(response.text)
    assert done
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert streamed_text(chunks) == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "timings" in chunks[-1] and all("timings" not in c for c in chunks[:-1])
    assert len({c["id"] for c in chunks}) == 1


def test_stream_usage_chunk_carries_usage_and_timings(client):
    chunks, done, _ = sse_chunks(chat(client, "SCRIPT:hello", stream=True,
                                      stream_options={"include_usage": True}).text)
    assert done
    final, usage_chunk = chunks[-2], chunks[-1]
    assert final["choices"][0]["finish_reason"] == "stop" and "timings" not in final
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 4
    assert usage_chunk["timings"]["predicted_n"] == 4


def test_stop_string_across_tokens_is_withheld_and_counted(client, harness, default_tokenizer):
    body = chat(client, "SCRIPT:story", stop=["a cr", "never"]).json
    assert body["choices"][0]["message"]["content"] == "One day a fox met "
    assert body["choices"][0]["finish_reason"] == "stop"
    script = harness.book.scripts["story"]
    # Tokens through the one completing "a cr": the smallest prefix whose text holds it.
    needed = next(n for n in range(1, len(script) + 1)
                  if "a cr" in default_tokenizer.decode(script[:n]))
    assert body["usage"]["completion_tokens"] == needed
    streamed = sse_chunks(chat(client, "SCRIPT:story", stop="a cr", stream=True).text)[0]
    assert streamed_text(streamed) == "One day a fox met "


def test_max_tokens_limits_and_reports_length(client):
    body = chat(client, "SCRIPT:ramble", max_tokens=5).json
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5
    body = chat(client, "SCRIPT:ramble", max_completion_tokens=3).json
    assert body["usage"]["completion_tokens"] == 3


def test_zero_max_tokens_processes_the_prompt_only(client):
    body = chat(client, "SCRIPT:hello", max_tokens=0).json
    assert body["usage"]["completion_tokens"] == 0
    assert body["choices"][0]["message"]["content"] == ""
    assert body["timings"]["predicted_n"] == 0 and body["timings"]["predicted_per_second"] == 0


def test_default_budget_is_capped_by_context(client, harness):
    # No max_tokens: the remaining context (512 - prompt) bounds the rambling script.
    body = chat(client, "SCRIPT:ramble").json
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == 512


def test_ignore_eos_shows_end_tokens_and_runs_to_the_limit(client):
    body = chat(client, "SCRIPT:hello", ignore_eos=True, max_tokens=6).json
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["content"].startswith("Hello there!<|im_end|>")


def test_return_progress_and_timings_per_token(client):
    chunks, _, _ = sse_chunks(chat(client, "SCRIPT:story", stream=True, return_progress=True,
                                   timings_per_token=True).text)
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert progress and progress[0]["processed"] == progress[0]["cache"]
    assert progress[-1]["processed"] == progress[-1]["total"]
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    first_output = next(i for i, c in enumerate(chunks)
                        if c.get("choices") and c["choices"][0]["delta"].get("content"))
    last_progress = max(i for i, c in enumerate(chunks) if "prompt_progress" in c)
    assert last_progress < first_output
    visible = [c for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("content")]
    assert all("timings" in c for c in visible)
    counts = [c["timings"]["predicted_n"] for c in visible]
    assert counts == sorted(counts) and counts[-1] >= len(visible)


def test_seeded_sampling_is_reproducible(client):
    first = chat(client, "no script here", temperature=0.9, seed=-42, max_tokens=8).json
    again = chat(client, "no script here", temperature=0.9, seed=-42, max_tokens=8).json
    other = chat(client, "no script here", temperature=0.9, seed=7, max_tokens=8).json
    text = lambda b: b["choices"][0]["message"]["content"]  # noqa: E731
    assert text(first) == text(again) and text(first) != text(other)


def test_cache_hints_mark_breakpoints_without_changing_the_prompt(harness):
    def parsed(**fields):
        body = {"model": MODEL, "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief.",
                                            "prompt_cache_breakpoint": {"mode": "explicit"}}]},
            {"role": "user", "content": "SCRIPT:hello"}], **fields}
        return parse_chat(body, harness.ctx)[0]

    implicit = parsed()
    assert [m.cache_breakpoint for m in implicit.messages] == [True, True]
    explicit_only = parsed(prompt_cache_options={"mode": "explicit"})
    assert [m.cache_breakpoint for m in explicit_only.messages] == [True, False]
    render = harness.ctx.renderer.render
    assert render(implicit).ids == render(explicit_only).ids
    assert len(render(implicit).breakpoints) == 2
