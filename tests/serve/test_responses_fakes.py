"""Shared fakes for the Responses and Anthropic service tests (this module holds no tests).

A ServingContext backed by the real Engine running a scripted FakeRunner (the reply's text
is fixed per context, encoded with the default model's real tokenizer), a small ChatML
renderer that records what it rendered, and a plain incremental detokenizer. The chat
format declares <think> reasoning and hermes tool calls, so reasoning and tool parsing run
on real parser code.
"""
from __future__ import annotations

import json
import pathlib
import types

from falcon.testing.helpers import DEFAULT_HOST

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.engine import Engine
from ninfer_jax.engine.fake import FakeRunner, scripted
from ninfer_jax.serve.config import ServeConfig
from ninfer_jax.serve.core.context import ServingContext
from ninfer_jax.text.tokenizer import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER_JSON = ROOT / "artifacts" / "smollm2-135m-instruct.ninfer" / "tokenizer.json"
MODEL_ID = "test-model"
EOS = 2
PAGE_SIZE = 16
CHAT_FORMAT = {"tool_call_format": "hermes",
               "reasoning": {"open": "<think>", "close": "</think>"},
               "thinking_default": False}

_tokenizer = None


def tokenizer() -> Tokenizer:
    global _tokenizer
    if _tokenizer is None:
        if not TOKENIZER_JSON.exists():
            raise RuntimeError(f"{TOKENIZER_JSON} is missing: run `make setup` first")
        _tokenizer = Tokenizer.from_file(TOKENIZER_JSON, eos_ids=[EOS])
    return _tokenizer


class ChatMLRenderer:
    """Renders a Conversation as ChatML text; remembers every conversation it rendered."""

    def __init__(self, tok: Tokenizer):
        self.tokenizer = tok
        self.conversations = []

    def render(self, conversation, *, max_tokens=None):
        self.conversations.append(conversation)
        options = conversation.options
        text = ""
        if conversation.tools:
            names = [tool.qualified_name for tool in conversation.tools]
            text += f"<|im_start|>system\nTools: {json.dumps(names)}<|im_end|>\n"
        for number, message in enumerate(conversation.messages):
            text += f"<|im_start|>{message.role}\n"
            if message.reasoning is not None:
                text += f"<think>{message.reasoning}</think>"
            text += message.content
            for call in message.tool_calls:
                name = f"{call.namespace}.{call.name}" if call.namespace else call.name
                text += f"<tool_call>{name} {call.arguments}</tool_call>"
            is_last = number == len(conversation.messages) - 1
            if not (is_last and options.continue_final_message):
                text += "<|im_end|>\n"
        starts_in_reasoning = False
        if options.add_generation_prompt:
            text += "<|im_start|>assistant\n"
            if options.enable_thinking:
                text += "<think>\n"
                starts_in_reasoning = True
        ids = self.tokenizer.encode(text)
        return types.SimpleNamespace(text=text, ids=ids, breakpoints=(),
                                     starts_in_reasoning=starts_in_reasoning)


class PlainDetokenizer:
    """Incremental decode by difference (the tests' replies are ASCII)."""

    def __init__(self, tok: Tokenizer):
        self.tokenizer, self.ids, self.emitted = tok, [], ""

    def push(self, ids) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids)
        new, self.emitted = text[len(self.emitted):], text
        return new

    def flush(self) -> str:
        return ""


class FakeContext(ServingContext):
    def new_detokenizer(self):
        return PlainDetokenizer(self.tokenizer)


def make_context(reply: str, *, max_context: int = 2048, decode_sleep: float = 0.0,
                 chat_format: dict | None = None, fail_at_step: int | None = None,
                 **config) -> FakeContext:
    """A context whose model always writes `reply` (then EOS). Call `.engine.shutdown()`."""
    tok = tokenizer()
    script = tok.encode(reply)
    engine_config = EngineConfig(max_context=max_context,
                                 pending_timeout=config.get("pending_timeout_ms", 30000) / 1000,
                                 max_pending=config.get("max_pending_requests", 16))
    runner = FakeRunner(num_pages=engine_config.num_pages(PAGE_SIZE), page_size=PAGE_SIZE,
                        vocab_size=tok.vocab_size, next_token=scripted(script, EOS),
                        decode_sleep=decode_sleep, fail_at_step=fail_at_step)
    engine = Engine(runner, engine_config, eos_ids=[EOS])
    engine.start()
    assert engine.wait_ready(30)
    metadata = {"name": MODEL_ID, "architecture": "llama",
                "special_tokens": {"eos_ids": [EOS]},
                "chat_format": CHAT_FORMAT if chat_format is None else chat_format}
    return FakeContext(engine=engine, tokenizer=tok, renderer=ChatMLRenderer(tok),
                       model_id=MODEL_ID, config=ServeConfig(artifact="fake", allowed_hosts=(DEFAULT_HOST,), **config),
                       metadata=metadata, max_context=max_context)
