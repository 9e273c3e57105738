"""End to end: `ninfer serve --vision` on a tiny random Qwen3-VL-shaped artifact (the
qwen3-vl-tiny preset of `ninfer init-random`: MRoPE text body, a tower with deepstack taps;
sharpened so that its text depends on the image), one server for the module, real SDKs. Images by data URI and by URL from a local HTTP server, a
video, a tool-result image and an Anthropic base64 image generate; counting endpoints agree
with usage; the media error codes; the request log shows the media cache hit and the
encode; a repeated image prompt reuses its prefix with the same text while a different image
of the same size shares only the pages before it; concurrent media and text streams equal
each alone. (The numbers themselves are checked against a one-shot forward in
tests/model/test_vision_engine.py.)"""
from __future__ import annotations

import base64
import concurrent.futures

import anthropic
import httpx
import openai
import pytest

from conftest import FEW_SHAPES, early_or_now, log_records, start_server
from media_samples import PNG_B64, PNG_URI, VIDEO_URI, media_url, png  # noqa: F401 (fixture)
from ninfer_jax.artifact.format import save_artifact
from ninfer_jax.artifact.random_init import init_random
from vision_models import sharpen

CONTEXT = 512
IMAGE_TOKENS = 70  # the 40 x 60 sample: 14 x 20 patches, merged 2 x 2
LEAD = "Describe what follows in the picture, carefully and in order, please. " * 4


def start_vision(folder):
    contents = init_random("qwen3-vl-tiny")
    sharpen(contents.params)  # tests/vision_models.py: texts that depend on the image
    artifact = save_artifact(folder / "qwen3-vl-tiny.ninfer", contents)
    log = folder / "requests.jsonl"
    server = start_server(artifact, "--vision", "--max-context", str(CONTEXT),
                          "--prefill-chunk", "64", "--max-concurrency", "4", *FEW_SHAPES,
                          "--media-live-mib", "4", "--request-log-jsonl", str(log))
    server.request_log = log
    # (on the early-start thread: trust_env off, see LiveServer.wait_ready)
    models = httpx.get(server.url + "/v1/models", trust_env=False).json()
    server.model_id = models["data"][0]["id"]
    return server


EARLY_STARTS = {"vision_server": start_vision}


@pytest.fixture(scope="module")
def vision_server():
    server = early_or_now(start_vision)
    yield server
    server.stop(wait=False)


def chat(server, content, *, max_tokens=6, role="user", **extra):
    messages = [{"role": role, "content": content}]
    if role == "tool":
        messages = [{"role": "user", "content": "Take a screenshot."},
                    {"role": "assistant", "content": "", "tool_calls": [{
                        "id": "call_1", "type": "function",
                        "function": {"name": "screenshot", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": content}]
    return server.openai().chat.completions.create(
        model=server.model_id, max_tokens=max_tokens, temperature=0, messages=messages,
        **extra)


def image(url=PNG_URI):
    return {"type": "image_url", "image_url": {"url": url}}


def uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def logged(server, reply, event) -> dict:
    """The request-log `event` line of a chat completion."""
    found = log_records(server.request_log, reply.id.removeprefix("chatcmpl-"), event)
    assert len(found) == 1, found
    return found[0]


def test_image_by_data_uri_and_by_url_generate_alike(vision_server, media_url):
    by_uri = chat(vision_server, [image(), {"type": "text", "text": "What is it?"}])
    by_url = chat(vision_server, [image(f"{media_url}/image.png"),
                                  {"type": "text", "text": "What is it?"}])
    text_only = chat(vision_server, "What is it?")
    assert by_uri.usage.completion_tokens == 6
    assert by_uri.usage.prompt_tokens == text_only.usage.prompt_tokens + IMAGE_TOKENS + 2
    assert by_url.choices[0].message.content == by_uri.choices[0].message.content
    assert by_uri.choices[0].message.content != text_only.choices[0].message.content
    assert by_url.usage.prompt_tokens == by_uri.usage.prompt_tokens


def test_video_and_tool_result_image(vision_server):
    video = chat(vision_server, [{"type": "video_url", "video_url": {"url": VIDEO_URI}},
                                 {"type": "text", "text": "What happens?"}])
    assert video.usage.completion_tokens == 6 and video.usage.prompt_tokens > 20
    tool = chat(vision_server, [{"type": "text", "text": "screenshot:"}, image()], role="tool")
    assert tool.usage.completion_tokens == 6
    assert tool.usage.prompt_tokens > IMAGE_TOKENS


def test_anthropic_image_and_both_count_endpoints(vision_server):
    client = anthropic.Anthropic(base_url=vision_server.url, api_key="unused", max_retries=0,
                                 timeout=300)
    content = [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": PNG_B64}},
               {"type": "text", "text": "What is it?"}]
    message = client.messages.create(model=vision_server.model_id, max_tokens=6,
                                     messages=[{"role": "user", "content": content}],
                                     extra_body={"temperature": 0})
    assert message.usage.output_tokens == 6
    counted = client.messages.count_tokens(model=vision_server.model_id,
                                           messages=[{"role": "user", "content": content}])
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    responses = httpx.post(vision_server.url + "/v1/responses/input_tokens", json={
        "model": vision_server.model_id, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": PNG_URI},
            {"type": "input_text", "text": "What is it?"}]}]}).json()
    chat_usage = chat(vision_server, [image(), {"type": "text", "text": "What is it?"}]).usage
    assert responses["input_tokens"] == counted.input_tokens == chat_usage.prompt_tokens
    assert counted.input_tokens > IMAGE_TOKENS


@pytest.mark.parametrize("content,status,code", [
    ([image("data:image/png;base64,AAAA")], 400, "invalid_media"),
    ([image("{media_url}/missing.png")], 502, "media_fetch_failed"),
    # 1,024 patches: a 6 MiB payload, over --media-live-mib 4
    ([image(uri(png(500, 500)))], 400, "media_budget_exceeded"),
    ([image() for _ in range(8)], 400, "context_length_exceeded"),  # 8 x 72 tokens > 512
])
def test_media_errors(vision_server, media_url, content, status, code):
    for part in content:
        part["image_url"]["url"] = part["image_url"]["url"].replace("{media_url}", media_url)
    with pytest.raises(openai.APIStatusError) as caught:
        chat(vision_server, content)
    assert caught.value.status_code == status
    assert caught.value.body["code"] == code


def test_repeated_image_reuses_its_prefix_and_another_image_does_not(vision_server):
    def prompt(seed):  # the image more than a page from the end: a hit covers all of it
        return [{"type": "text", "text": LEAD}, image(uri(png(seed=seed))),
                {"type": "text", "text": "Answer in one short sentence, thank you. " * 3}]

    first, again, other = (chat(vision_server, prompt(seed)) for seed in (11, 11, 12))
    assert again.choices[0].message.content == first.choices[0].message.content
    repeat_cached = again.usage.prompt_tokens_details.cached_tokens
    other_cached = other.usage.prompt_tokens_details.cached_tokens
    # The repeat reuses pages past the image; the other image (same size, so the same pad
    # tokens) only the text pages before it.
    assert repeat_cached >= again.usage.prompt_tokens - 16
    assert 0 < other_cached <= repeat_cached - IMAGE_TOKENS
    done = [logged(vision_server, reply, "request_done") for reply in (first, again, other)]
    assert [r["media"]["items_encoded"] for r in done] == [1, 0, 1]  # the repeat: none
    assert done[0]["timings_seconds"]["vision"] > 0


def test_request_log_shows_the_media_cache_hit(vision_server):
    data = uri(png(seed=21))
    replies = [chat(vision_server, [image(data)], max_tokens=1) for _ in range(2)]
    first, second = (logged(vision_server, r, "request_start")["media"] for r in replies)
    assert (first["cache_misses"], first["cache_hits"]) == (1, 0)
    assert (second["cache_misses"], second["cache_hits"]) == (0, 1)
    metrics = httpx.get(vision_server.url + "/metrics").text
    encoded = [line for line in metrics.splitlines()
               if line.startswith("ninfer_vision_items_encoded_total")]
    assert encoded and float(encoded[0].split()[1]) > 0


def test_concurrent_media_and_text_streams_equal_each_alone(vision_server):
    contents = [[image(uri(png(seed=31))), {"type": "text", "text": "One?"}],
                [{"type": "video_url", "video_url": {"url": VIDEO_URI}}],
                "Name three colours."]
    alone = [chat(vision_server, c, max_tokens=7).choices[0].message.content
             for c in contents]
    with concurrent.futures.ThreadPoolExecutor(len(contents)) as pool:
        together = list(pool.map(lambda c: chat(vision_server, c, max_tokens=7), contents))
    assert [r.choices[0].message.content for r in together] == alone
    assert len(set(alone)) == len(alone)  # three different texts, none empty
    assert all(alone)
