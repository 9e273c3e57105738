"""The web page in headless Chromium against a live server: the key typed into the page,
a streamed reply, the stop button ending the stream, the metrics plots moving.

NINFER_UI_SCREENSHOT=path saves a PNG of the page at the end (docs/images/web-ui.png)."""
from __future__ import annotations

import os
import time

import pytest

ANSWER = ".msg.assistant .answer"


@pytest.fixture
def page(browser, ui_server):
    context = browser.new_context(viewport={"width": 1280, "height": 820})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(ui_server.url + "/")
    page.fill("#api-key", ui_server.api_key)
    page.dispatch_event("#api-key", "change")
    yield page
    context.close()
    assert not errors, errors


def _answer(page, index):
    return page.locator(ANSWER).nth(index).inner_text()


def _generated(page) -> float:
    return float(page.get_attribute("#v-totals", "data-generated") or 0)


def test_chat_streams_stops_and_metrics_move(page):
    page.wait_for_function("() => document.getElementById('v-totals').dataset.generated !== undefined")
    page.wait_for_selector("#model:has-text('smollm2')")
    before = _generated(page)

    page.fill("#max-tokens", "400")
    page.fill("#prompt", "Write a long story about a dragon who learns to bake bread.")
    page.click("#send")
    page.wait_for_selector("#status[data-state=streaming]")
    page.wait_for_function(f"() => document.querySelector('{ANSWER}').textContent.length > 20")
    first = _answer(page, 0)
    page.wait_for_function(
        f"() => document.querySelector('{ANSWER}').textContent.length > {len(first) + 10}")
    assert page.is_enabled("#stop") and page.is_disabled("#send")

    page.click("#stop")
    page.wait_for_selector("#status[data-state=stopped]")
    stopped = _answer(page, 0)
    time.sleep(1.5)
    assert _answer(page, 0) == stopped, "text kept arriving after stop"
    assert len(stopped) > len(first) and page.is_disabled("#stop")
    # the server saw the disconnect: its lane is free again
    page.wait_for_selector("#v-lanes:text-matches('^0 /')", timeout=10_000)

    # the poll sees the generated tokens and draws a non-zero throughput
    page.wait_for_function(f"() => Number(document.getElementById('v-totals').dataset.generated) "
                           f"> {before}", timeout=10_000)
    assert page.evaluate("() => plots.throughput.data[0].some(v => v > 0)")
    assert page.evaluate("() => plots.kv.data[0].length > 1")

    # a short second turn runs to its end
    page.fill("#max-tokens", "24")
    page.fill("#prompt", "Now give the dragon a name.")
    page.press("#prompt", "Enter")
    page.wait_for_selector("#status[data-state=done]", timeout=60_000)
    assert _answer(page, 1).strip()
    assert page.locator(".msg.user").count() == 2
    path = os.environ.get("NINFER_UI_SCREENSHOT")
    if path:  # the picture of docs/operations.md: a third turn, caught mid-stream
        page.fill("#max-tokens", "200")
        page.fill("#prompt", "Tell me about Zephyrus's bakery.")
        page.press("#prompt", "Enter")
        page.wait_for_function(f"() => document.querySelectorAll('{ANSWER}')[2]"
                               ".textContent.length > 200", timeout=60_000)
        page.screenshot(path=path, full_page=True)
        page.click("#stop")


def test_wrong_key_is_reported_in_the_page(page):
    page.fill("#api-key", "wrong")
    page.dispatch_event("#api-key", "change")
    page.wait_for_selector("#metrics-status:has-text('401')")
    page.fill("#prompt", "hello")
    page.click("#send")
    page.wait_for_selector("#status[data-state=error]")
    assert "401" in page.locator(".msg.assistant .error").inner_text()


SSE_WITH_REASONING = "".join(
    f"data: {chunk}\n\n" for chunk in (
        '{"choices":[{"index":0,"delta":{"role":"assistant"}}]}',
        '{"choices":[{"index":0,"delta":{"reasoning_content":"The user greets; "}}]}',
        '{"choices":[{"index":0,"delta":{"reasoning_content":"answer briefly."}}]}',
        '{"choices":[{"index":0,"delta":{"content":"Hello"}}]}',
        '{"choices":[{"index":0,"delta":{"content":" there!"},"finish_reason":"stop"}]}',
        "[DONE]"))


def test_reasoning_is_shown_apart_from_the_answer(page):
    """The default model sends no reasoning_content, so this stream is the server's wire
    format replayed by the browser's request routing (the request itself is checked)."""
    sent = []

    def reply(route):
        sent.append(route.request)
        route.fulfill(status=200, content_type="text/event-stream", body=SSE_WITH_REASONING)

    page.route("**/v1/chat/completions", reply)
    page.fill("#prompt", "hi")
    page.click("#send")
    page.wait_for_selector("#status[data-state=done]")
    assert page.locator(".msg.assistant .reasoning").inner_text() == \
        "The user greets; answer briefly."
    assert _answer(page, 0) == "Hello there!"
    request = sent[0]
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer " + page.input_value("#api-key")
    body = request.post_data_json
    assert body["stream"] is True and body["messages"] == [{"role": "user", "content": "hi"}]
