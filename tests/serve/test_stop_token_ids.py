"""vLLM's `stop_token_ids` on Chat Completions and Completions: the reply ends at the first
listed id, which is counted in usage but never shown (like an end token), also under
ignore_eos; streamed and aggregate replies agree; malformed lists are a 400 naming the field.
Responses and Anthropic Messages read the same field (test_engine_fields.py)."""
import pytest

from harness import MODEL, STORY, chat
from sse_util import sse_chunks, streamed_text

MIDDLE = "Hello<|im_end|> and more words follow here"


@pytest.fixture(scope="module", autouse=True)
def scripts(harness):
    harness.book.add("story", STORY)
    harness.book.add("middle", MIDDLE)  # an end token inside the script


def complete(client, prompt, **fields):
    return client.simulate_post("/v1/completions",
                                json={"model": MODEL, "prompt": prompt, **fields})


def test_chat_stops_at_the_id_hides_it_and_counts_it(client, harness, default_tokenizer):
    script = harness.book.scripts["story"]
    index = harness.book.first_new("story", 4)
    body = chat(client, "SCRIPT:story", stop_token_ids=[script[index]]).json
    choice = body["choices"][0]
    assert choice["message"]["content"] == default_tokenizer.decode(script[:index])
    assert choice["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == index + 1
    # Without the field the whole script comes back: the id is what stopped it.
    assert chat(client, "SCRIPT:story").json["choices"][0]["message"]["content"] == STORY


def test_chat_stream_matches_the_aggregate_reply(client, harness):
    script = harness.book.scripts["story"]
    fields = {"stop_token_ids": [script[harness.book.first_new("story", 5)]], "max_tokens": 40}
    aggregate = chat(client, "SCRIPT:story", **fields).json
    chunks, done, _ = sse_chunks(chat(client, "SCRIPT:story", stream=True,
                                      stream_options={"include_usage": True}, **fields).text)
    assert done
    assert streamed_text(chunks) == aggregate["choices"][0]["message"]["content"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == aggregate["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"] == aggregate["usage"]


def test_ignore_eos_shows_end_tokens_but_keeps_the_stop_ids(client, harness,
                                                            default_tokenizer):
    script = harness.book.scripts["middle"]
    eos = default_tokenizer.eos_ids[0]
    assert eos in script[:-1]
    index = harness.book.first_new("middle", script.index(eos) + 2)
    plain = chat(client, "SCRIPT:middle", stop_token_ids=[script[index]]).json
    assert plain["choices"][0]["message"]["content"] == "Hello"  # the end token came first
    body = chat(client, "SCRIPT:middle", ignore_eos=True, stop_token_ids=[script[index]],
                max_tokens=60).json
    choice = body["choices"][0]
    assert choice["message"]["content"] == default_tokenizer.decode(script[:index])
    assert "<|im_end|>" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == index + 1
    # Listing the end token itself restores stopping (and hiding) under ignore_eos.
    listed = chat(client, "SCRIPT:middle", ignore_eos=True, stop_token_ids=[eos],
                  max_tokens=60).json
    assert listed["choices"][0]["message"]["content"] == "Hello"
    assert listed["choices"][0]["finish_reason"] == "stop"
    assert listed["usage"]["completion_tokens"] == script.index(eos) + 1


def test_completions_stop_at_the_id_streamed_and_not(client, harness, default_tokenizer):
    script = harness.book.scripts["story"]
    index = harness.book.first_new("story", 3)
    fields = {"stop_token_ids": [script[index], script[index]]}  # a repeated id is fine
    body = complete(client, "Once upon a time SCRIPT:story", **fields).json
    choice = body["choices"][0]
    assert choice["text"] == default_tokenizer.decode(script[:index])
    assert choice["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == index + 1
    chunks, done, _ = sse_chunks(complete(client, "Once upon a time SCRIPT:story", stream=True,
                                          stream_options={"include_usage": True},
                                          **fields).text)
    assert done
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == choice["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"] == body["usage"]


def test_null_is_no_stop_ids(client):
    body = chat(client, "SCRIPT:story", stop_token_ids=None).json
    assert body["choices"][0]["message"]["content"] == STORY


@pytest.mark.parametrize("value", [
    "5", 5, {"0": 1}, [True], [-1], [1.5], ["7"], [None], "past-vocab", [10 ** 12],
    list(range(65)),
])
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_malformed_stop_token_ids_name_the_field(client, default_tokenizer, route, value):
    if value == "past-vocab":
        value = [default_tokenizer.vocab_size]
    send = chat if route == "chat" else complete
    response = send(client, "SCRIPT:story", stop_token_ids=value)
    assert response.status_code == 400
    error = response.json["error"]
    assert (error["param"], error["code"]) == ("stop_token_ids", "invalid_request")


def test_the_largest_list_and_the_last_vocabulary_id_are_accepted(client, default_tokenizer):
    ids = list(range(default_tokenizer.vocab_size - 64, default_tokenizer.vocab_size))
    assert chat(client, "SCRIPT:story", stop_token_ids=ids).status_code == 200
