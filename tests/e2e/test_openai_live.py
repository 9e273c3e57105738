"""End to end against a live `ninfer serve` of the default model: the openai SDK, httpx and
curl; plain flows, streaming, concurrency, every error path, health and models."""
import concurrent.futures
import json
import re
import shutil
import subprocess

import httpx
import openai
import pytest

from conftest import NINFER, free_port

CAPITAL = "What is the capital of France? Answer in one sentence."
PARIS = "The capital of France is Paris."
MODEL = "smollm2-135m-instruct"


def ask(client, content, **kwargs):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], **kwargs)


def test_health_models_and_request_ids(live_server):
    health = httpx.get(live_server.url + "/health").json()
    assert health["status"] == "ok"
    # On CPU every step shape compiles before ready.
    assert health["compiled_shapes"] == health["total_shapes"] > 0
    with live_server.http() as http:
        listing = http.get("/v1/models")
        assert listing.headers["x-request-id"]
        assert [m["id"] for m in listing.json()["data"]] == [MODEL]
        card = http.get(f"/v1/models/{MODEL}").json()
        assert card["max_model_len"] == 1024
    models = live_server.openai().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_capital_question_greedy_and_default(live_server):
    client = live_server.openai()
    greedy = ask(client, CAPITAL, temperature=0)
    assert greedy.choices[0].message.content == PARIS
    assert greedy.choices[0].finish_reason == "stop"
    assert greedy.usage.completion_tokens == 8  # seven text tokens and <|im_end|>
    # Server defaults (SmolLM2's low temperature, the fixed --seed) give the same answer.
    assert ask(client, CAPITAL).choices[0].message.content == PARIS


@pytest.mark.parametrize("prompt", [CAPITAL, "Write a haiku about the sea."])
def test_streaming_equals_non_streaming_at_temperature_zero(live_server, prompt):
    client = live_server.openai()
    whole = ask(client, prompt, temperature=0, max_tokens=40)
    stream = ask(client, prompt, temperature=0, max_tokens=40, stream=True,
                 stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]


def test_four_concurrent_clients_complete(live_server):
    prompts = [CAPITAL, "List three primary colors.", "What is 12 plus 7?", "Hi"]

    def run(prompt):
        return ask(live_server.openai(), prompt, temperature=0, max_tokens=24)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, prompts))
    for result in results:
        assert result.choices[0].finish_reason in ("stop", "length")
        assert result.choices[0].message.content
        assert result.usage.completion_tokens <= 24
    assert results[0].choices[0].message.content == PARIS


def test_completions_endpoint(live_server):
    client = live_server.openai()
    raw = client.completions.create(
        model=MODEL, prompt="Once upon a time, in a small village by the mountains, there lived",
        max_tokens=6, temperature=0)
    assert raw.choices[0].text.startswith(" a wise old wizard")
    assert raw.usage.completion_tokens == 6 and raw.choices[0].finish_reason == "length"


def test_curl_stream_has_request_id_and_done(live_server):
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    body = json.dumps({"model": MODEL, "stream": True, "temperature": 0, "max_tokens": 8,
                       "messages": [{"role": "user", "content": CAPITAL}]})
    out = subprocess.run([curl, "-sN", "-i", live_server.url + "/v1/chat/completions",
                          "-H", "Content-Type: application/json",
                          "-H", f"Authorization: Bearer {live_server.api_key}", "-d", body],
                         capture_output=True, text=True, timeout=120).stdout
    assert re.search(r"(?im)^x-request-id: \w+", out)
    assert out.rstrip().endswith("data: [DONE]")
    assert '"role": "assistant"' in out


def error_of(response, status, param=None, code=None):
    assert response.status_code == status, response.text
    assert response.headers["x-request-id"]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def test_error_paths(live_server):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with live_server.http() as http:
        error_of(http.post("/v1/chat/completions", json={**chat, "model": "nope"}), 404,
                 "model", "model_not_found")
        error_of(http.post("/v1/chat/completions", content=b"{oops",
                           headers={"Content-Type": "application/json"}), 400,
                 code="invalid_json")
        error_of(http.post("/v1/chat/completions", json={**chat, "temperature": 9}), 400,
                 "temperature")
        error_of(http.post("/v1/chat/completions", json={**chat, "messages": "hi"}), 400,
                 "messages")
        error_of(http.post("/v1/chat/completions", json={**chat, "logprobs": True}), 400,
                 "logprobs", "unsupported_parameter")
        error_of(http.post("/v1/chat/completions", json={**chat, "max_tokens": 5000}), 400,
                 "max_tokens", "context_length_exceeded")
        error_of(http.post("/v1/chat/completions", content=b"x" * (1024 * 1024 + 1),
                           headers={"Content-Type": "application/json"}), 413,
                 code="request_too_large")
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        error_of(httpx.post(live_server.url + "/v1/chat/completions", json=chat,
                            headers=headers), 401, code="invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=live_server.url + "/v1", api_key="wrong",
                      max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError) as caught:
        ask(live_server.openai(), "hi", n=2)
    assert caught.value.body["param"] == "n"


def test_stderr_lines_have_the_operational_format(live_server):
    lines = [line for line in live_server.stderr_text().splitlines() if line.strip()]
    pattern = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} "
                         r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
    assert lines and all(pattern.match(line) for line in lines if not line.startswith(" "))
    assert any("engine ready" in line for line in lines)
    assert live_server.api_key not in live_server.stderr_text()


def test_vision_is_refused_at_startup_without_a_vision_component(default_artifact_path):
    result = subprocess.run([str(NINFER), "serve", str(default_artifact_path), "--port",
                             str(free_port()), "--vision"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "needs an artifact with a vision component" in result.stderr, result.stderr
