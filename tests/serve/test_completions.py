"""POST /v1/completions: raw prompts (text and token ids), echo, streaming, rejections."""
import pytest

from sse_util import sse_chunks

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module", autouse=True)
def scripts(harness):
    harness.book.add("raw", " and they lived happily ever after.")


def complete(client, prompt, **fields):
    return client.simulate_post("/v1/completions",
                                json={"model": MODEL, "prompt": prompt, **fields})


def test_text_prompt_without_template(client, default_tokenizer):
    response = complete(client, "Once upon a time SCRIPT:raw")
    body = response.json
    assert response.status_code == 200 and response.headers["x-request-id"]
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["text"] == " and they lived happily ever after."
    assert choice["finish_reason"] == "stop" and choice["logprobs"] is None
    assert body["usage"]["prompt_tokens"] == len(default_tokenizer.encode(
        "Once upon a time SCRIPT:raw"))
    assert body["timings"]["prompt_n"] + body["timings"]["cache_n"] == \
        body["usage"]["prompt_tokens"]


def test_token_prompts_and_single_element_lists(client, default_tokenizer):
    ids = default_tokenizer.encode("Once upon a time SCRIPT:raw")
    expected = complete(client, "Once upon a time SCRIPT:raw").json["choices"][0]["text"]
    for prompt in (ids, [ids], ["Once upon a time SCRIPT:raw"]):
        assert complete(client, prompt).json["choices"][0]["text"] == expected


def test_echo_stop_and_stream(client):
    body = complete(client, "Tale SCRIPT:raw", echo=True, stop=" happily").json
    assert body["choices"][0]["text"] == "Tale SCRIPT:raw and they lived"
    chunks, done, _ = sse_chunks(complete(client, "Tale SCRIPT:raw", stream=True,
                                          stream_options={"include_usage": True}).text)
    assert done
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == " and they lived happily ever after."
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert "timings" in chunks[-1]


@pytest.mark.parametrize("prompt,fields,param", [
    ("", {}, "prompt"),
    (["a", "b"], {}, "prompt"),
    ([10 ** 9], {}, "prompt"),
    (None, {}, "prompt"),
    ("x", {"logprobs": 2}, "logprobs"),
    ("x", {"suffix": "tail"}, "suffix"),
    ("x", {"best_of": 3}, "best_of"),
    ("x", {"n": 2}, "n"),
    ("x", {"temperature": -1}, "temperature"),
    ("x", {"max_tokens": 100_000}, "max_tokens"),
    ("x", {"model": "other"}, "model"),
])
def test_rejections_name_the_field(client, prompt, fields, param):
    response = complete(client, prompt, **fields)
    assert response.status_code in (400, 404)
    assert response.json["error"]["param"] == param


@pytest.mark.parametrize("prompt", [[True, False], [1, "a"], [{"text": "x"}, "y"]])
def test_malformed_prompt_lists_are_invalid_not_batches(client, prompt):
    """Only a list of several prompts is a batch (unsupported); other lists are malformed."""
    error = complete(client, prompt).json["error"]
    assert (error["param"], error["code"]) == ("prompt", "invalid_request")
