"""Serve-test fixtures: one app over the real Engine with a scripted fake model, shared by
the module's tests (building one is cheap, but the engine thread is reused)."""
from __future__ import annotations

import sys
import pathlib

import pytest
from falcon import testing

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from harness import RandomQwen, build_harness  # noqa: E402


@pytest.fixture(scope="module")
def harness(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer)
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(harness):
    return testing.TestClient(harness.app)


@pytest.fixture(scope="session")
def qwen35():
    """Qwen3.5-style: XML tool calls, the generation prompt opens <think> (the dense stand-in
    with Qwen3.5's tokenizer and template: these tests never run the hybrid body)."""
    return RandomQwen.build("qwen3.5-dense-tiny")


@pytest.fixture(scope="session")
def qwen3():
    """Qwen3-style: hermes JSON tool calls, the model writes <think> itself."""
    return RandomQwen.build("qwen3-tiny")
