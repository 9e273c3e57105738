"""Media through every dialect over HTTP (--vision on the fake-model harness: the fake runner
takes a request's media as its placeholder tokens; no vision tower). The real openai and
anthropic SDKs talk to a threaded wsgiref server; media URLs come from a second local HTTP
server (tests/media_samples.py). Each dialect's parsing, every media error code, token
counting with media and the GenerationRequest's media field."""
import base64
import socketserver
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import anthropic
import openai
import pytest
from falcon import testing

from harness import build_harness, by_id, read_log
from media_samples import (PNG_B64, PNG_URI, VIDEO_URI, media_url,  # noqa: F401 (fixture)
                           png, serve_in_thread)
from ninfer_jax.serve.core import generation
from ninfer_jax.serve.media import sources
from ninfer_jax.serve.media.intake import MediaIntake
from ninfer_jax.serve.media.preprocess import VisionProcessing
from ninfer_jax.serve.openai.chat_messages import parse_messages
from ninfer_jax.text.conversation import Conversation

IMAGE_TOKENS = 70  # a 40x60 image -> 224x320 pixels -> 14x20 patches -> 70 merged tokens


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def vh(qwen35, tmp_path_factory):
    log = tmp_path_factory.mktemp("media-log") / "requests.jsonl"
    h = build_harness(qwen35, max_context=1024, vision=True,
                      request_log_jsonl=str(log), engine_options={"accepts_media": True})
    h.book.add("look", "Seen.\n</think>\n\nA picture.")
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(vh):
    return testing.TestClient(vh.app)


@pytest.fixture(scope="module")
def sdk_url(vh):
    server = serve_in_thread(make_server("127.0.0.1", 0, vh.app, server_class=_ThreadingServer,
                                handler_class=_QuietHandler))
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def chat(client, vh, content, role="user", **fields):
    messages = [{"role": role, "content": content}]
    if role == "tool":
        messages = [{"role": "user", "content": "SCRIPT:look"},
                    {"role": "assistant", "content": "", "tool_calls": [{
                        "id": "call_1", "type": "function",
                        "function": {"name": "grab", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": content}]
    body = {"model": vh.ctx.model_id, "max_tokens": 16, "messages": messages, **fields}
    return client.simulate_post("/v1/chat/completions", json=body)


def anthropic_count(client, vh, content) -> int:
    result = client.simulate_post("/v1/messages/count_tokens", json={
        "model": vh.ctx.model_id, "messages": [{"role": "user", "content": content}]})
    assert result.status_code == 200, result.json
    return result.json["input_tokens"]


def image_block(data=PNG_B64):
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": data}}


# ----------------------------------------------------------------------------- parsing


def test_chat_image_counts_its_expanded_tokens(client, vh):
    text_only = chat(client, vh, [{"type": "text", "text": "SCRIPT:look What?"}])
    with_image = chat(client, vh, [{"type": "text", "text": "SCRIPT:look What?"},
                                   {"type": "image_url", "image_url": {"url": PNG_URI,
                                                                       "detail": "auto"}}])
    assert with_image.status_code == 200, with_image.json
    assert with_image.json["choices"][0]["message"]["content"] == "A picture."
    # the pads plus <|vision_start|> and <|vision_end|>
    assert (with_image.json["usage"]["prompt_tokens"]
            == text_only.json["usage"]["prompt_tokens"] + IMAGE_TOKENS + 2)


def test_chat_string_url_and_http_fetch_match_data_uri(client, vh, media_url):
    counts = []
    for image_url in (PNG_URI, {"url": f"{media_url}/image.png"}, f"{media_url}/image.png"):
        result = chat(client, vh, [{"type": "image_url", "image_url": image_url},
                                   {"type": "text", "text": "SCRIPT:look"}])
        assert result.status_code == 200, result.json
        counts.append(result.json["usage"]["prompt_tokens"])
    assert len(set(counts)) == 1


def test_request_log_shows_the_media_cache_hit(client, vh):
    uri = f"data:image/png;base64,{base64.b64encode(png(seed=21)).decode()}"
    ids = []
    for _ in range(2):
        result = chat(client, vh, [{"type": "image_url", "image_url": uri},
                                   {"type": "text", "text": "SCRIPT:look"}])
        assert result.status_code == 200
        ids.append(result.headers["x-request-id"])
    lines = read_log(vh)
    first, second = (by_id(lines, i, "request_start")[0]["media"] for i in ids)
    assert (first["cache_misses"], first["cache_hits"]) == (1, 0)
    assert (second["cache_misses"], second["cache_hits"]) == (0, 1)
    assert first["num_images"] == 1 and first["vision_tokens"] == IMAGE_TOKENS
    assert first["payload_bytes"] == 280 * 1536 * 4 and first["source_bytes"] > 0
    assert by_id(lines, ids[0], "request_start")[0]["shape"]["num_media_items"] == 1


def test_chat_tool_result_image(client, vh):
    result = chat(client, vh, [{"type": "text", "text": "screenshot:"},
                               {"type": "image_url", "image_url": {"url": PNG_URI}}],
                  role="tool")
    assert result.status_code == 200, result.json
    assert result.json["usage"]["prompt_tokens"] > IMAGE_TOKENS


def test_prompt_layout_and_generation_request_media(vh):
    messages = parse_messages([{"role": "user", "content": [
        {"type": "text", "text": "A"}, {"type": "image_url", "image_url": {"url": PNG_URI}},
        {"type": "text", "text": "B"}, {"type": "video_url", "video_url": {"url": VIDEO_URI}},
    ]}], vision=True)
    prepared = generation.prepare_chat(vh.ctx, Conversation(messages),
                                       generation.GenerationOptions(), "req-media")
    tokenizer = vh.ctx.tokenizer
    request = prepared.request
    image, video = request.media
    assert (image.kind, image.grid_thw, image.pixel_values.shape) == ("image", (1, 14, 20),
                                                                      (280, 1536))
    pad = tokenizer.token_to_id("<|image_pad|>")
    ((start, length),) = image.spans
    assert length == IMAGE_TOKENS
    assert request.prompt_ids[start:start + length] == [pad] * length
    assert request.prompt_ids[start - 1] == tokenizer.token_to_id("<|vision_start|>")
    assert request.prompt_ids[start + length] == tokenizer.token_to_id("<|vision_end|>")
    # Qwen3-VL's video layout: per temporal group its time, then its own markers and pads
    assert video.grid_thw == (3, 4, 4) and len(video.spans) == 3
    text = tokenizer.decode(request.prompt_ids)
    group = "<|vision_start|>" + "<|video_pad|>" * 4 + "<|vision_end|>"
    assert (f"B<0.2 seconds>{group}<1.4 seconds>{group}<2.2 seconds>{group}<|im_end|>"
            in text)
    assert image.digest != video.digest and len(image.digest) == 64
    live = vh.ctx.media.cache.live_bytes_used
    prepared.release_media()
    prepared.release_media()
    assert vh.ctx.media.cache.live_bytes_used <= live


def test_chat_video_url(client, vh):
    result = chat(client, vh, [{"type": "video_url", "video_url": VIDEO_URI},
                               {"type": "text", "text": "SCRIPT:look"}])
    assert result.status_code == 200, result.json


def test_responses_image_video_and_tool_output(client, vh):
    body = {"model": vh.ctx.model_id, "max_output_tokens": 4, "input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "SCRIPT:look"},
            {"type": "input_image", "image_url": PNG_URI, "detail": "auto"},
            {"type": "input_video", "video_url": VIDEO_URI}]},
        {"type": "function_call", "call_id": "c1", "name": "grab", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "shot:"},
            {"type": "input_image", "image_url": PNG_URI}]}]}
    result = client.simulate_post("/v1/responses", json=body)
    assert result.status_code == 200, result.json
    counted = client.simulate_post("/v1/responses/input_tokens", json={
        key: body[key] for key in ("model", "input")})
    assert counted.json["input_tokens"] == result.json["usage"]["input_tokens"]
    assert counted.json["input_tokens"] > 2 * IMAGE_TOKENS


def test_counts_agree_across_dialects(client, vh, media_url):
    anthropic_tokens = anthropic_count(client, vh, [image_block(), {"type": "text",
                                                                     "text": "hi"}])
    by_url = anthropic_count(client, vh, [
        {"type": "image", "source": {"type": "url", "url": f"{media_url}/image.png"}},
        {"type": "text", "text": "hi"}])
    responses = client.simulate_post("/v1/responses/input_tokens", json={
        "model": vh.ctx.model_id, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": PNG_URI},
            {"type": "input_text", "text": "hi"}]}]})
    text_only = anthropic_count(client, vh, [{"type": "text", "text": "hi"}])
    assert anthropic_tokens == by_url == responses.json["input_tokens"]
    assert anthropic_tokens == text_only + IMAGE_TOKENS + 2


def test_anthropic_tool_result_image(client, vh):
    result = client.simulate_post("/v1/messages", json={
        "model": vh.ctx.model_id, "max_tokens": 4, "messages": [
            {"role": "user", "content": "SCRIPT:look"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "grab",
                                                "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "shot:"},
                                                      image_block()]}]}]})
    assert result.status_code == 200, result.json
    assert result.json["usage"]["input_tokens"] > IMAGE_TOKENS


# ----------------------------------------------------------------------------- the SDKs


def test_openai_sdk_image_by_url(sdk_url, vh, media_url):
    client = openai.OpenAI(base_url=f"{sdk_url}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=vh.ctx.model_id, max_tokens=16, messages=[
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"{media_url}/image.png"}},
            {"type": "text", "text": "SCRIPT:look"}]}])
    assert reply.choices[0].message.content == "A picture."
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=vh.ctx.model_id, max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {
                "url": "data:image/png;base64,AAAA"}}]}])
    assert caught.value.body["code"] == "invalid_media"


def test_anthropic_sdk_image_and_count(sdk_url, vh):
    client = anthropic.Anthropic(base_url=sdk_url, api_key="unused", max_retries=0)
    content = [image_block(), {"type": "text", "text": "SCRIPT:look"}]
    message = client.messages.create(model=vh.ctx.model_id, max_tokens=16,
                                     messages=[{"role": "user", "content": content}])
    assert [block.text for block in message.content if block.type == "text"] == ["A picture."]
    counted = client.messages.count_tokens(model=vh.ctx.model_id,
                                           messages=[{"role": "user", "content": content}])
    usage = message.usage  # input_tokens leaves out the prefix-cache reads
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=vh.ctx.model_id, max_tokens=4, messages=[
            {"role": "user", "content": [image_block("@@not base64@@")]}])
    assert caught.value.body["error"]["type"] == "invalid_request_error"


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("part,param,code", [
    ({"type": "image_url", "image_url": {"url": PNG_URI, "detail": "low"}},
     "messages[0].content[0].image_url.detail", "unsupported_parameter"),
    ({"type": "image_url", "image_url": {"url": PNG_URI, "detail": "huge"}},
     "messages[0].content[0].image_url.detail", "invalid_request"),
    ({"type": "image_url", "image_url": {}}, "messages[0].content[0].image_url.url",
     "invalid_media"),
    ({"type": "image_url", "image_url": "data:image/png;base64,%%%"},
     "messages[0].content[0].image_url", "invalid_media"),
    ({"type": "image_url", "image_url": "ftp://example.com/a.png"},
     "messages[0].content[0].image_url", "invalid_media"),
    ({"type": "image_url", "image_url": "data:image/png;base64,"
      + base64.b64encode(b"not a png").decode()},
     "messages[0].content[0].image_url", "invalid_media"),
    ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,"
                                                  + base64.b64encode(b"\0" * 64).decode()}},
     "messages[0].content[0].video_url.url", "invalid_media"),
    ({"type": "input_image", "image_url": PNG_URI}, "messages[0].content[0].type",
     "invalid_request"),
])
def test_chat_media_errors_name_their_field(client, vh, part, param, code):
    result = chat(client, vh, [part])
    assert result.status_code == 400, result.json
    assert (result.json["error"]["param"], result.json["error"]["code"]) == (param, code)


def test_assistant_media_refused(client, vh):
    result = client.simulate_post("/v1/responses", json={
        "model": vh.ctx.model_id, "input": [{"role": "system", "content": [
            {"type": "input_image", "image_url": PNG_URI}]}]})
    assert result.status_code == 400
    assert result.json["error"]["param"] == "input[0].content[0].type"
    result = client.simulate_post("/v1/messages", json={
        "model": vh.ctx.model_id, "max_tokens": 4, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [image_block()]}]})
    assert result.status_code == 400 and result.json["error"]["type"] == "invalid_request_error"


def test_anthropic_source_errors(client, vh):
    for source, param in (
            ({"type": "base64", "media_type": "text/plain", "data": PNG_B64},
             "messages[0].content[0].source.media_type"),
            ({"type": "bytes"}, "messages[0].content[0].source.type"),
            ({"type": "url"}, "messages[0].content[0].source.url")):
        result = client.simulate_post("/v1/messages/count_tokens", json={
            "model": vh.ctx.model_id, "messages": [{"role": "user", "content": [
                {"type": "image", "source": source}]}]})
        assert result.status_code == 400, result.json
        assert param in result.json["error"]["message"]


def test_fetch_failure_and_timeout_codes(client, vh, media_url):
    missing = chat(client, vh, [{"type": "image_url", "image_url": f"{media_url}/gone.png"}])
    assert missing.status_code == 502
    assert missing.json["error"]["code"] == "media_fetch_failed"
    assert missing.json["error"]["param"] == "messages[0].content[0].image_url"
    intake = vh.ctx.media
    saved = intake.limits
    intake.limits = sources.SourceLimits(saved.max_bytes, timeout_s=0.2)
    try:
        slow = chat(client, vh, [{"type": "image_url", "image_url": f"{media_url}/slow.png"}])
        assert slow.status_code == 504 and slow.json["error"]["code"] == "media_fetch_timeout"
        slow = client.simulate_post("/v1/messages", json={
            "model": vh.ctx.model_id, "max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": f"{media_url}/slow.png"}}]}]})
        assert slow.status_code == 504 and slow.json["error"]["type"] == "timeout_error"
    finally:
        intake.limits = saved


def test_media_budget_exceeded(client, vh):
    full = vh.ctx.media
    vh.ctx.media = MediaIntake(VisionProcessing(), cache_mib=0, live_mib=1, threads=1,
                               max_source_bytes=1 << 20)
    try:
        uri = f"data:image/png;base64,{base64.b64encode(png(seed=7)).decode()}"
        result = chat(client, vh, [{"type": "image_url", "image_url": uri}])
    finally:
        vh.ctx.media.close()
        vh.ctx.media = full
    assert result.status_code == 400
    assert result.json["error"]["code"] == "media_budget_exceeded"


def test_prompt_plus_media_must_fit_the_context(client, vh):
    big = base64.b64encode(png(1400, 1400, solid=True)).decode()  # 88 x 88 patches
    result = chat(client, vh, [{"type": "image_url",
                                "image_url": f"data:image/png;base64,{big}"}])
    assert result.status_code == 400
    error = result.json["error"]
    assert error["code"] == "context_length_exceeded"
    assert "1024" in error["message"] and str(88 * 88 // 4) in error["message"]


def test_engine_without_vision_tower_refuses_generation_but_counts(client, vh):
    """--vision on, but a runner without a vision tower (JaxRunner today): the media is
    prepared, counted, and refused at submit."""
    vh.runner.accepts_media = False
    try:
        misses = vh.ctx.media.cache.stats["misses"]
        result = chat(client, vh, [{"type": "image_url", "image_url": {
            "url": f"data:image/png;base64,{base64.b64encode(png(seed=11)).decode()}"}}])
        assert result.status_code == 400 and result.json["error"]["code"] == "vision_disabled"
        assert vh.ctx.media.cache.stats["misses"] == misses + 1  # it reached preparation
        assert anthropic_count(client, vh, [image_block()]) > IMAGE_TOKENS
    finally:
        vh.runner.accepts_media = True
