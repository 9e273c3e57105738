"""The real openai SDK against the chat adapter served over HTTP (a threaded wsgiref server in
this process) with the scripted fake model: tools, reasoning and tool_choice as SDK objects."""
import json
import socketserver
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import openai
import pytest

from harness import build_harness

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
XML_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def sdk(qwen35):
    h = build_harness(qwen35, max_context=1024)
    h.book.add("sdk-call", "Checking the forecast.\n</think>\n\n" + XML_CALL)
    h.book.add("sdk-answer", "Short thought.\n</think>\n\nIt will be sunny.")
    server = make_server("127.0.0.1", 0, h.app, server_class=_ThreadingServer,
                         handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1",
                           api_key="unused", max_retries=0)
    yield client, h.ctx.model_id
    server.shutdown()
    h.close()


def ask(sdk, content, **kwargs):
    client, model = sdk
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], **kwargs)


def test_sdk_tool_call_and_reasoning(sdk):
    reply = ask(sdk, "SCRIPT:sdk-call", tools=TOOLS)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.model_extra["reasoning_content"] == "Checking the forecast."
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Rome", "days": 2}
    assert reply.usage.completion_tokens_details.reasoning_tokens > 0


def test_sdk_stream_accumulates_to_the_same_reply(sdk):
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in ask(sdk, "SCRIPT:sdk-call", tools=TOOLS, stream=True):
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (reasoning, content, finish) == ("Checking the forecast.", "", "tool_calls")
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Rome", "days": 2}


def test_sdk_plain_answer_and_rejections(sdk):
    reply = ask(sdk, "SCRIPT:sdk-answer")
    assert reply.choices[0].message.content == "It will be sunny."
    with pytest.raises(openai.BadRequestError) as caught:
        ask(sdk, "x", tools=[{**TOOLS[0], "function": {**TOOLS[0]["function"],
                                                        "strict": True}}])
    assert caught.value.body["param"] == "tools[0].function.strict"
    with pytest.raises(openai.NotFoundError):
        sdk[0].chat.completions.create(model="other", messages=[{"role": "user",
                                                                  "content": "x"}])
