"""Build real apps over the real Engine with a fake model (no JAX, no monkey-patching).

`ScriptBook` is the fake model's brain: a prompt containing `SCRIPT:<key>` is answered with
that key's token script (the text encoded with the real tokenizer), output token i being
script[i] whatever was forced before it; any other prompt gets the FakeRunner's hand-checkable
weighted-sum tokens. The script is chosen from the prompt alone, so concurrent requests each
get their own.
"""
from __future__ import annotations

import dataclasses
import json
import re
import time

import numpy as np
from falcon.testing.helpers import DEFAULT_HOST

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.engine import Engine
from ninfer_jax.engine.fake import FakeRunner, weighted_sum_next_token
from ninfer_jax.serve.app import create_app
from ninfer_jax.serve.config import ServeConfig
from ninfer_jax.serve.core.context import ServingContext
from ninfer_jax.text.chat_template import ChatRenderer

TEST_HOSTS = (DEFAULT_HOST, "ninfer.test")
_KEY = re.compile(r"SCRIPT:([\w-]+)")
MODEL = "smollm2-135m-instruct"  # the default artifact's served name
STORY = "One day a fox met a crow. The end."  # a script of distinct words, for stop tests


class ScriptBook:
    def __init__(self, tokenizer, end_token: int):
        self.tokenizer = tokenizer
        self.end_token = end_token
        self.scripts: dict[str, list[int]] = {}
        self.fallback = weighted_sum_next_token(tokenizer.vocab_size)

    def add(self, key: str, text: str, *, end: bool = True) -> list[int]:
        ids = self.tokenizer.encode(text, special=True)
        # end=False: no end token, the model rambles on with the last token (length tests).
        self.scripts[key] = ids + ([self.end_token] if end else [])
        return ids

    def first_new(self, key: str, start: int) -> int:
        """The index of the first token of `key`'s script at or after `start` that does not
        occur before it: listed as a stop id, it can end the reply only there."""
        script = self.scripts[key]
        return next(i for i in range(start, len(script)) if script[i] not in script[:i])

    def __call__(self, context: np.ndarray, sample) -> int:
        prompt = context[: len(context) - sample.sample_index]
        found = _KEY.findall(self.tokenizer.decode([int(t) for t in prompt]))
        if not found or found[-1] not in self.scripts:
            return self.fallback(context, sample)
        script = self.scripts[found[-1]]
        index = sample.sample_index
        return script[index] if index < len(script) else script[-1]


@dataclasses.dataclass
class RandomQwen:
    """What the harness needs of an artifact, built in memory from `ninfer init-random`'s
    contents (the real Qwen tokenizer and our Qwen-style template; no weights saved)."""

    path: str
    metadata: dict
    chat_template: str
    tokenizer_json: str

    @classmethod
    def build(cls, preset: str) -> "RandomQwen":
        from ninfer_jax.artifact.random_init import init_random

        contents = init_random(preset)
        return cls(preset, contents.metadata(), contents.chat_template, contents.tokenizer_json)

    def load_tokenizer(self):
        from ninfer_jax.text.tokenizer import Tokenizer

        special = self.metadata["special_tokens"]
        return Tokenizer(self.tokenizer_json, eos_ids=special["eos_ids"])


@dataclasses.dataclass
class Harness:
    ctx: ServingContext
    engine: Engine
    runner: FakeRunner
    book: ScriptBook
    app: object

    def close(self) -> None:
        self.engine.shutdown(timeout=5)


def build_harness(artifact, tokenizer=None, *, chat_format=None, template=None, max_context=512,
                  decode_sleep=0.0, engine_options=None, **config) -> Harness:
    metadata = dict(artifact.metadata)
    if chat_format is not None:
        metadata["chat_format"] = chat_format
    # The hosts the tests' clients name (Falcon's test client, the SDKs' WSGI transports).
    config.setdefault("allowed_hosts", TEST_HOSTS)
    serve_config = ServeConfig(artifact=str(artifact.path), max_context=max_context, **config)
    tokenizer = tokenizer or artifact.load_tokenizer()
    book = ScriptBook(tokenizer, tokenizer.eos_ids[0])
    options = engine_options or {}
    # kv_pages: a smaller KV pool (pressure pauses); the default holds 4 full contexts.
    num_pages = options.get("kv_pages", 4 * max_context // 16 + 2)
    runner = FakeRunner(num_pages=num_pages, page_size=16, max_batch=8,
                        vocab_size=tokenizer.vocab_size, next_token=book,
                        decode_sleep=decode_sleep,
                        accepts_media=options.get("accepts_media", False))
    engine_config = EngineConfig(max_concurrency=options.get("lanes", 4),
                                 max_pending=options.get("pending", 16),
                                 max_context=max_context, kv_capacity=4 * max_context,
                                 prefill_chunk=64,
                                 host_context_mib=options.get("host_mib", 8192))
    engine = Engine(runner, engine_config, eos_ids=tokenizer.eos_ids)
    engine.start()
    engine.wait_ready(10)
    renderer = ChatRenderer(template or artifact.chat_template, tokenizer,
                            metadata["chat_format"])
    ctx = ServingContext(engine=engine, tokenizer=tokenizer, renderer=renderer,
                         model_id=serve_config.model_id or metadata["name"], config=serve_config,
                         metadata=metadata, max_context=max_context)
    return Harness(ctx, engine, runner, book, create_app(ctx))


def chat(client, content, **fields):
    """One user message to Chat Completions through the Falcon test client."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}
    return client.simulate_post("/v1/chat/completions", json=body)


def wait_for(predicate, timeout=10.0) -> bool:
    """Poll `predicate` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def read_log(h) -> list[dict]:
    """Every request-log line so far (flushed first: the writer is a background thread)."""
    assert h.ctx.extras["request_log"].flush()
    with open(h.ctx.config.request_log_jsonl, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def by_id(lines, request_id, event=None):
    return [r for r in lines if r.get("request_id") == request_id
            and (event is None or r["event"] == event)]


def abandon_stream(h, path: str, body: dict) -> dict:
    """POST a streaming `body` to `path` straight through the WSGI app, read two chunks and
    close it, as a client that goes away does; returns the response headers."""
    from falcon import testing

    environ = testing.create_environ(method="POST", path=path, body=json.dumps(body),
                                     headers={"Content-Type": "application/json"})
    headers: dict = {}
    result = h.app(environ, lambda status, hs, exc_info=None: headers.update(hs))
    stream = iter(result)
    next(stream)
    next(stream)
    result.close()  # the client went away: the consumer stops reading
    return headers
