"""/v1/responses* through the real openai SDK (WSGI transport) over the fake-model harness."""
import httpx
import openai
import pytest

from harness import build_harness

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for tool in tools %} "
    "{{ tool.function.name }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\n' }}"
    "{%- if message.reasoning_content is defined and message.reasoning_content is not none %}"
    "{{ '<think>' + message.reasoning_content + '</think>' }}{% endif %}"
    "{{- message.content }}"
    "{%- if message.tool_calls is defined %}{% for call in message.tool_calls %}<tool_call>"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "</tool_call>{% endfor %}{% endif %}{{- '<|im_end|>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHAT_FORMAT = {"tool_call_format": "hermes", "reasoning": {"open": "<think>", "close": "</think>"},
               "thinking_default": False}
NAMESPACE_TOOLS = [{"type": "namespace", "name": "mcp__weather", "description": "Weather",
                    "tools": [{"type": "function", "name": "get_current", "parameters": {
                        "type": "object", "properties": {"city": {"type": "string"}}}}]},
                   {"type": "function", "name": "get_current", "parameters": None, "strict": False}]
TOOL_SCRIPT = ('<think>Need the weather.</think><tool_call>\n{"name": "mcp__weather.get_current", '
               '"arguments": {"city": "Paris"}}\n</tool_call>')


@pytest.fixture(scope="module")
def harness(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, chat_format=CHAT_FORMAT,
                      template=TEMPLATE, max_context=1024, response_store_max_records=8)
    h.book.add("hello", "Hello there!")
    h.book.add("tool", TOOL_SCRIPT)
    h.book.add("after", "It is sunny in Paris.")
    h.book.add("ramble", "la", end=False)
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(harness):
    http = httpx.Client(transport=httpx.WSGITransport(app=harness.app))
    yield openai.OpenAI(base_url="http://ninfer.test/v1", api_key="unused", http_client=http,
                        max_retries=0)
    http.close()


@pytest.fixture(scope="module")
def model(harness):
    return harness.ctx.model_id


def test_create_retrieve_delete(client, model):
    raw = client.responses.with_raw_response.create(model=model, input="SCRIPT:hello",
                                                    instructions="Be brief.")
    assert raw.headers["x-request-id"]
    response = raw.parse()
    assert response.output_text == "Hello there!" and response.status == "completed"
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.instructions == "Be brief." and response.store is True
    again = client.responses.retrieve(response.id)
    assert again.output_text == "Hello there!" and again.id == response.id
    deleted = client.responses.delete(response.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve(response.id)
    assert info.value.body["code"] == "response_not_found"


def test_stream_events(client, model):
    with client.responses.stream(model=model, input="SCRIPT:hello") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == "Hello there!"
    numbers = [event.sequence_number for event in events]
    assert numbers == sorted(set(numbers))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello there!"
    assert client.responses.retrieve(final.id).status == "completed"


def test_input_items_and_input_tokens(client, model):
    items = [{"role": "user", "content": f"turn {n}", "id": f"msg_item{n}"} for n in range(3)]
    items.append({"role": "user", "content": "SCRIPT:hello"})
    response = client.responses.create(model=model, input=items)
    listed = client.responses.input_items.list(response.id, order="asc", limit=2)
    assert [item.id for item in listed.data] == ["msg_item0", "msg_item1"] and listed.has_more
    every = [item.id for item in client.responses.input_items.list(response.id, order="asc")]
    assert every[:3] == ["msg_item0", "msg_item1", "msg_item2"] and len(every) == 4
    counted = client.responses.input_tokens.count(model=model, input=items)
    assert counted.input_tokens == response.usage.input_tokens


def test_reasoning_namespaced_tool_call_and_continuation(client, model):
    first = client.responses.create(model=model, input="SCRIPT:tool", tools=NAMESPACE_TOOLS)
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Need the weather."
    assert reasoning.summary == []
    assert (call.type, call.namespace, call.name) == ("function_call", "mcp__weather", "get_current")
    assert call.arguments == '{"city": "Paris"}'
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert first.usage.output_tokens_details.reasoning_tokens > 0
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny",
              "namespace": "mcp__weather"}
    chained = client.responses.input_tokens.count(
        model=model, previous_response_id=first.id, tools=NAMESPACE_TOOLS,
        input=[result, {"role": "user", "content": "SCRIPT:after"}])
    explicit_history = [{"role": "user", "content": "SCRIPT:tool"},
                        *[item.model_dump(exclude_none=True) for item in first.output],
                        result, {"role": "user", "content": "SCRIPT:after"}]
    explicit = client.responses.input_tokens.count(model=model, tools=NAMESPACE_TOOLS,
                                                   input=explicit_history)
    assert chained.input_tokens == explicit.input_tokens
    second = client.responses.create(model=model, previous_response_id=first.id,
                                     tools=NAMESPACE_TOOLS,
                                     input=[result, {"role": "user", "content": "SCRIPT:after"}])
    assert second.output_text == "It is sunny in Paris."
    assert second.usage.input_tokens == chained.input_tokens


def test_stream_function_call_events(client, model):
    with client.responses.stream(model=model, input="SCRIPT:tool", tools=NAMESPACE_TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == final.output[-1].arguments == '{"city": "Paris"}'
    assert any(e.type == "response.reasoning_text.delta" for e in events)


def test_incomplete_on_max_output_tokens(client, model):
    response = client.responses.create(model=model, input="SCRIPT:ramble", max_output_tokens=4)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 4


def test_store_false_is_not_retrievable(client, model):
    response = client.responses.create(model=model, input="SCRIPT:hello", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=model, input="x", previous_response_id=response.id)
    assert info.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize("extra, status, param, code", [
    ({"extra_body": {"bogus": 1}}, 400, "bogus", "unknown_parameter"),
    ({"background": True}, 400, "background", "unsupported_parameter"),
    ({"truncation": "auto"}, 400, "truncation", "unsupported_parameter"),
    ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type", "unsupported_parameter"),
    ({"temperature": 3}, 400, "temperature", "invalid_request"),
    ({"model": "other-model"}, 404, "model", "model_not_found"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     400, "input[0].content[0]", "vision_disabled"),
])
def test_error_contracts_over_http(client, model, extra, status, param, code):
    fields = {"model": model, "input": "SCRIPT:hello", **extra}
    with pytest.raises(openai.APIStatusError) as info:
        client.responses.create(**fields)
    error = info.value
    assert error.status_code == status and error.response.headers["x-request-id"]
    assert (error.body["param"], error.body["code"]) == (param, code)


def test_overlong_input_fails_instead_of_truncating(client, model):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=model, input="word " * 1500)
    assert (info.value.body["code"], info.value.body["param"]) == ("context_length_exceeded",
                                                                   "input")
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=model, input="SCRIPT:hello", max_output_tokens=5000)
    assert info.value.body["param"] == "max_output_tokens"


def test_cancel_compact_and_unknown_ids(client, model, harness):
    http = client._client
    stored = client.responses.create(model=model, input="SCRIPT:hello")
    response = http.post(f"http://ninfer.test/v1/responses/{stored.id}/cancel")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "background_not_supported"
    assert http.post("http://ninfer.test/v1/responses/resp_missing/cancel").status_code == 404
    response = http.post("http://ninfer.test/v1/responses/compact", json={"model": model})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "compaction_not_supported"
    response = http.get(f"http://ninfer.test/v1/responses/{stored.id}/input_items",
                        params={"limit": 0})
    assert response.status_code == 400 and response.json()["error"]["param"] == "limit"
    response = http.get(f"http://ninfer.test/v1/responses/{stored.id}", params={"include[]": "x"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "include"
