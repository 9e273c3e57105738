"""The guards in front of every route (serve/wire/http.py): Host check, JSON content type, auth
before the size check, HEAD /health; and the cheap refusals of oversized prompts."""
import json
import time

import pytest
from click.testing import CliRunner
from falcon import testing

from harness import build_harness
from ninfer_jax.serve.core.errors import CLIENT_CLOSED_REQUEST
from ninfer_jax.serve.observability.request_trace import loggable_param

MODEL = "smollm2-135m-instruct"
KEY = "guard-secret"
JSON_AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "SCRIPT:ok"}]}


@pytest.fixture(scope="module")
def harness(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, api_key=KEY, max_request_mib=8,
                      allowed_hosts=("models.internal",))
    h.book.add("ok", "fine")
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(harness):
    return testing.TestClient(harness.app)


def post(client, path, body, headers=JSON_AUTH, host="127.0.0.1:8080"):
    return client.simulate_post(path, body=json.dumps(body), headers={**headers, "Host": host})


@pytest.mark.parametrize("host", ["127.0.0.1:8080", "localhost:8080", "[::1]:8080",
                                  "10.1.2.3", "models.internal", "MODELS.internal:80"])
def test_local_ip_and_configured_hosts_are_answered(client, host):
    assert post(client, "/v1/chat/completions", CHAT, host=host).status_code == 200


def test_a_foreign_host_is_refused_in_each_dialect(client):
    openai = post(client, "/v1/chat/completions", CHAT, host="attacker.example:8080")
    assert openai.status_code == 403 and openai.json["error"]["code"] == "host_not_allowed"
    anthropic = post(client, "/v1/messages", CHAT, host="attacker.example")
    assert anthropic.status_code == 403
    assert anthropic.json["error"]["type"] == "permission_error"
    assert client.simulate_get("/health", headers={"Host": "evil.test"}).status_code == 403


def test_allowed_hosts_star_answers_any(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, allowed_hosts=("*",))
    try:
        reply = testing.TestClient(h.app).simulate_get("/v1/models",
                                                       headers={"Host": "any.example"})
        assert reply.status_code == 200
    finally:
        h.close()


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_post_bodies_must_be_json(client, content_type):
    headers = {"Authorization": f"Bearer {KEY}", "Host": "127.0.0.1"}
    if content_type:
        headers["Content-Type"] = content_type
    for path in ("/v1/chat/completions", "/v1/messages"):
        reply = client.simulate_post(path, body=json.dumps(CHAT), headers=headers)
        assert reply.status_code == 415, reply.text


def test_json_with_parameters_is_accepted(client):
    headers = {**JSON_AUTH, "Content-Type": "application/json; charset=utf-8"}
    assert post(client, "/v1/chat/completions", CHAT, headers=headers).status_code == 200


def test_authentication_comes_before_the_size_check(client):
    big = b"{" + b" " * (9 * 1024 * 1024) + b"}"
    headers = {"Content-Type": "application/json", "Host": "127.0.0.1"}
    reply = client.simulate_post("/v1/chat/completions", body=big, headers=headers)
    assert reply.status_code == 401
    reply = client.simulate_post("/v1/chat/completions", body=big, headers={**headers,
                                                                             **JSON_AUTH})
    assert reply.status_code == 413


def test_head_health_answers_without_a_body(client):
    reply = client.simulate_head("/health", headers={"Host": "127.0.0.1"})
    assert reply.status_code == 200 and reply.content == b""


def test_a_huge_prompt_is_refused_before_it_is_tokenized(client):
    huge = "word " * 1_400_000  # 7 MiB: tokenizing it would take seconds
    started = time.monotonic()
    chat = post(client, "/v1/chat/completions",
                {**CHAT, "messages": [{"role": "user", "content": huge}]})
    completion = post(client, "/v1/completions", {"model": MODEL, "prompt": huge})
    elapsed = time.monotonic() - started
    assert chat.status_code == 400 and chat.json["error"]["code"] == "context_length_exceeded"
    assert chat.json["error"]["param"] == "messages"
    assert completion.status_code == 400
    assert completion.json["error"]["param"] == "prompt"
    assert elapsed < 3.0


def test_completions_context_errors_name_prompt(client, default_tokenizer):
    prompt = "word " * 600  # over the harness's 512-token context, within the char bound
    reply = post(client, "/v1/completions", {"model": MODEL, "prompt": prompt})
    assert reply.status_code == 400 and reply.json["error"]["param"] == "prompt"
    reply = post(client, "/v1/completions", {"model": MODEL, "prompt": "SCRIPT:ok",
                                             "max_tokens": 5000})
    assert reply.json["error"]["param"] == "max_tokens"


def test_anthropic_stop_sequences_are_bounded(client):
    body = {**CHAT, "stop_sequences": [f"s{i}" for i in range(5)]}
    reply = post(client, "/v1/messages", body)
    assert reply.status_code == 400 and "stop_sequences" in reply.json["error"]["message"]
    assert post(client, "/v1/messages", {**body, "stop_sequences": ["a", "b"]}).status_code == 200


def test_client_closed_status_has_a_reason_phrase():
    assert CLIENT_CLOSED_REQUEST == "499 Client Closed Request"


def test_client_named_fields_are_not_logged():
    assert loggable_param("tools[0].parameters.minimum") == "tools[0].parameters.minimum"
    assert "secret" not in loggable_param("metadata.my secret prompt text")


def test_api_key_from_the_environment_or_a_file(tmp_path, monkeypatch):
    from ninfer_jax.cli import serve as serve_cli
    from ninfer_jax.serve import launcher

    seen = []
    monkeypatch.setattr(launcher, "run_server", seen.append)
    runner = CliRunner()
    assert runner.invoke(serve_cli.serve, ["a.ninfer"],
                         env={"NINFER_API_KEY": "from-env"}).exit_code == 0
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert runner.invoke(serve_cli.serve, ["a.ninfer", "--api-key-file", str(key_file),
                                           "--allowed-hosts", "a.example, b.example"],
                         env={"NINFER_API_KEY": ""}).exit_code == 0
    both = runner.invoke(serve_cli.serve, ["a.ninfer", "--api-key", "x", "--api-key-file",
                                           str(key_file)])
    assert both.exit_code == 2 and "not both" in both.output
    assert [c.api_key for c in seen] == ["from-env", "from-file"]
    assert seen[1].allowed_hosts == ("a.example", "b.example")
