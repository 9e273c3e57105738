"""The engine fields behave the same in every dialect: ignore_eos runs past the end token to
the limit, seed makes sampled replies reproducible, stop_token_ids end the reply, and a
malformed value is a 400 on that field in the dialect's own error shape (Anthropic Messages
and Responses, with Chat Completions as the reference they follow). Anthropic Messages names
an unknown top-level field in its 400, as Anthropic's API does.

The scripted fake model of harness.py: a SCRIPT: prompt replays its text and an end token,
any other prompt samples from a random distribution with the request's seed."""
import pytest

from harness import MODEL, STORY, chat

HELLO = "Hello there!"


@pytest.fixture(scope="module", autouse=True)
def scripts(harness):
    harness.book.add("hello", HELLO)
    harness.book.add("story", STORY)


def messages(client, content, limit=6, **fields):
    body = {"model": "any-label", "max_tokens": limit,
            "messages": [{"role": "user", "content": content}], **fields}
    return client.simulate_post("/v1/messages", json=body)


def responses(client, content, limit=6, **fields):
    body = {"model": MODEL, "input": content, "max_output_tokens": limit, "store": False,
            **fields}
    return client.simulate_post("/v1/responses", json=body)


def messages_text(response) -> str:
    return response.json["content"][0]["text"]


def responses_text(response) -> str:
    return response.json["output"][-1]["content"][0]["text"]


def test_messages_ignore_eos_runs_to_max_tokens(client):
    plain = messages(client, "SCRIPT:hello").json
    assert plain["stop_reason"] == "end_turn" and plain["content"][0]["text"] == HELLO
    body = messages(client, "SCRIPT:hello", ignore_eos=True).json
    assert body["stop_reason"] == "max_tokens" and body["usage"]["output_tokens"] == 6
    assert body["content"][0]["text"].startswith(HELLO + "<|im_end|>")
    # The same reply Chat gives under the same field.
    reference = chat(client, "SCRIPT:hello", ignore_eos=True, max_tokens=6).json
    assert reference["choices"][0]["message"]["content"] == body["content"][0]["text"]


def test_responses_ignore_eos_runs_to_max_output_tokens(client):
    assert responses(client, "SCRIPT:hello").json["status"] == "completed"
    body = responses(client, "SCRIPT:hello", ignore_eos=True).json
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == 6
    assert responses_text(responses(client, "SCRIPT:hello", ignore_eos=True)).startswith(
        HELLO + "<|im_end|>")


@pytest.mark.parametrize("send, text", [(messages, messages_text),
                                        (responses, responses_text)])
def test_seed_makes_sampled_replies_reproducible(client, send, text):
    def sampled(seed):
        response = send(client, "no script here", temperature=0.9, seed=seed, limit=8)
        assert response.status_code == 200, response.json
        return text(response)

    first = sampled(-42)
    assert first == sampled(-42) and first != sampled(7)


@pytest.mark.parametrize("send, text", [(messages, messages_text),
                                        (responses, responses_text)])
def test_stop_token_ids_end_the_reply(client, harness, default_tokenizer, send, text):
    script = harness.book.scripts["story"]
    index = harness.book.first_new("story", 4)
    response = send(client, "SCRIPT:story", limit=60, stop_token_ids=[script[index]])
    assert text(response) == default_tokenizer.decode(script[:index])
    assert text(send(client, "SCRIPT:story", limit=60)) == STORY  # the id is what stopped it


def test_bad_ignore_eos_is_a_400_on_the_field(client):
    response = messages(client, "SCRIPT:hello", ignore_eos="yes")
    assert response.status_code == 400
    assert response.json["type"] == "error"
    error = response.json["error"]
    assert error["type"] == "invalid_request_error" and "'ignore_eos'" in error["message"]
    response = responses(client, "SCRIPT:hello", ignore_eos="yes")
    assert response.status_code == 400
    assert (response.json["error"]["param"], response.json["error"]["code"]) == (
        "ignore_eos", "invalid_request")


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "SCRIPT:hello"}]}),
    ("/v1/completions", {"prompt": "SCRIPT:hello"}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "SCRIPT:hello"}]}),
])
def test_unknown_fields_are_ignored_and_named_in_the_log(client, caplog, path, body):
    """Unknown fields leave the reply unchanged (serving.md; vLLM does the same) and are named
    in the log; the fields the route knows (an advisory one, an engine field) are not."""
    body = {"model": MODEL, "max_tokens": 6, "metadata": {"k": "v"}, "seed": 3, **body}
    with caplog.at_level("WARNING", logger="ninfer_jax.serve"):
        plain = client.simulate_post(path, json=body)
        assert not [r for r in caplog.records if "ignored unknown" in r.getMessage()]
        odd = client.simulate_post(path, json={**body, "frobnicate": 1, "ignore_eoss": True})
    assert plain.status_code == odd.status_code == 200
    assert odd.json.get("choices", odd.json.get("content")) == plain.json.get(
        "choices", plain.json.get("content"))
    (record,) = [r for r in caplog.records if "ignored unknown" in r.getMessage()]
    assert record.getMessage().endswith('fields "frobnicate", "ignore_eoss"')
