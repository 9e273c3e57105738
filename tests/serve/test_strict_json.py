"""Strict request JSON on every POST route (serve/wire/json_body.py): lone surrogates, NaN and
Infinity, and deep nesting are 400s naming the field, in each dialect's error shape; chunked
bodies are read whole."""
import io
import json

import pytest
from falcon import testing

from harness import build_harness

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def client(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer)
    h.book.add("ok", "fine")
    yield testing.TestClient(h.app)
    h.close()


def bodies(model):
    """One valid body per POST route, with a slot (the returned path) to spoil."""
    return {
        "/v1/chat/completions": {"model": model, "max_tokens": 3,
                                 "messages": [{"role": "user", "content": "SCRIPT:ok"}]},
        "/v1/completions": {"model": model, "max_tokens": 3, "prompt": "SCRIPT:ok"},
        "/v1/responses": {"model": model, "max_output_tokens": 3, "input": "SCRIPT:ok"},
        "/v1/messages": {"model": model, "max_tokens": 3,
                         "messages": [{"role": "user", "content": "SCRIPT:ok"}]},
    }


def raw_post(client, path, text: str):
    return client.simulate_post(path, body=text.encode("utf-8", "surrogatepass"), headers=JSON)


def error_of(response, path):
    """(message, param-or-None) from either dialect's error body; checks the shape."""
    body = response.json
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return body["error"]["message"], None
    assert body["error"]["code"] == "invalid_json"
    return body["error"]["message"], body["error"]["param"]


ROUTES = list(bodies("m"))


@pytest.mark.parametrize("path", ROUTES)
def test_lone_surrogate_is_400_naming_the_field(client, path):
    body = bodies("smollm2-135m-instruct")[path]
    body["metadata"] = {"user_tag": "PLACEHOLDER"}
    text = json.dumps(body).replace("PLACEHOLDER", "\\ud800")
    response = raw_post(client, path, text)
    assert response.status_code == 400, response.text
    message, param = error_of(response, path)
    assert "surrogate" in message
    if param is not None:
        assert param == "metadata.user_tag"


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_400(client, path, literal):
    body = bodies("smollm2-135m-instruct")[path]
    text = json.dumps(body)[:-1] + f', "temperature": {literal}}}'
    response = raw_post(client, path, text)
    assert response.status_code == 400, response.text
    message, param = error_of(response, path)
    assert literal in message
    if param is not None:
        assert param == "temperature"


@pytest.mark.parametrize("path", ROUTES)
def test_an_integer_too_large_for_a_float_is_400_not_500(client, path):
    # JSON integers have no size limit and Python keeps them exact; as a float they overflow.
    body = bodies("smollm2-135m-instruct")[path]
    text = json.dumps(body)[:-1] + f', "temperature": 1{"0" * 400}}}'
    response = raw_post(client, path, text)
    assert response.status_code == 400, response.text
    error = response.json["error"]
    assert "temperature" in error["message"] and "an integer of 401 digits" in error["message"]
    assert error.get("param", "temperature") == "temperature"


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("depth", [100, 5000])
def test_deep_nesting_is_400(client, path, depth):
    body = bodies("smollm2-135m-instruct")[path]
    text = json.dumps(body)[:-1] + ', "metadata": ' + "[" * depth + "]" * depth + "}"
    response = raw_post(client, path, text)
    assert response.status_code == 400, response.text
    assert "nests deeper" in error_of(response, path)[0]


def test_nan_in_a_tool_schema_is_refused_not_echoed(client):
    body = {"model": "smollm2-135m-instruct", "max_output_tokens": 3, "input": "SCRIPT:ok",
            "tools": [{"type": "function", "name": "f",
                       "parameters": {"type": "object", "properties": {},
                                      "minimum": "PLACEHOLDER"}}]}
    response = raw_post(client, "/v1/responses",
                        json.dumps(body).replace('"PLACEHOLDER"', "NaN"))
    assert response.status_code == 400
    assert response.json["error"]["param"] == "tools[0].parameters.minimum"


def test_paired_surrogates_and_ordinary_depth_are_accepted(client):
    body = bodies("smollm2-135m-instruct")["/v1/chat/completions"]
    body["messages"][0]["content"] = "SCRIPT:ok \U0001F600"
    body["metadata"] = {"a": [[[[{"b": 1.5}]]]]}
    response = raw_post(client, "/v1/chat/completions", json.dumps(body))  # \ud83d\ude00
    assert response.status_code == 200, response.text


def test_chunked_body_is_read_whole(client):
    body = json.dumps(bodies("smollm2-135m-instruct")["/v1/chat/completions"]).encode()
    environ = testing.create_environ(method="POST", path="/v1/chat/completions",
                                     headers={**JSON, "Transfer-Encoding": "chunked"})
    # What gunicorn hands the app for a chunked request: no CONTENT_LENGTH, a decoded stream.
    environ.pop("CONTENT_LENGTH", None)
    environ["wsgi.input"] = io.BytesIO(body)
    status = []
    result = b"".join(client.app(environ, lambda s, h, exc_info=None: status.append(s)))
    assert status[0].startswith("200"), result
    assert json.loads(result)["choices"][0]["message"]["content"] == "fine"


def test_chunked_body_over_the_limit_is_413(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, max_request_mib=1)
    try:
        environ = testing.create_environ(method="POST", path="/v1/chat/completions",
                                         headers={**JSON, "Transfer-Encoding": "chunked"})
        environ.pop("CONTENT_LENGTH", None)
        environ["wsgi.input"] = io.BytesIO(b'{"a": "' + b"x" * (2 * 1024 * 1024) + b'"}')
        status = []
        result = b"".join(h.app(environ, lambda s, hs, exc_info=None: status.append(s)))
        assert status[0].startswith("413"), result
    finally:
        h.close()


def test_the_body_budget_holds_large_bodies_back_and_lets_small_ones_by():
    import threading

    from ninfer_jax.errors import Overloaded
    from ninfer_jax.serve.wire.json_body import BodyBudget

    budget = BodyBudget(100, wait_s=0.2)
    with budget.hold(60):
        with budget.hold(40):  # fits beside it
            assert budget.free_bytes == 0
            with pytest.raises(Overloaded):
                with budget.hold(10):
                    pass
        released = threading.Event()

        def late():
            with budget.hold(80):  # waits for the 60 to go
                released.set()

        waiter = threading.Thread(target=late)
        budget.wait_s = 5
        waiter.start()
        assert not released.wait(0.1)
    waiter.join(5)
    assert released.is_set() and budget.free_bytes == 100
    with budget.hold(10 ** 9):  # a body larger than the budget is charged the whole budget
        assert budget.free_bytes == 0


def test_every_request_reads_under_the_workers_budget(client):
    from ninfer_jax.serve.wire.http import BodyLimitMiddleware

    (limit,) = [m for m in client.app._unprepared_middleware
                if isinstance(m, BodyLimitMiddleware)]
    body = json.dumps(bodies("smollm2-135m-instruct")["/v1/chat/completions"])
    with limit.budget.hold(limit.budget.total_bytes):  # every byte taken: the request waits
        limit.budget.wait_s = 0.2
        reply = raw_post(client, "/v1/chat/completions", body)
    assert reply.status_code == 429 and reply.json["error"]["code"] == "server_overloaded"
    assert raw_post(client, "/v1/chat/completions", body).status_code == 200
