"""End to end: a Gemma 4 artifact served by a live `ninfer serve`, through the openai SDK.

The tiny Gemma 4 shape (`init-random --preset gemma4-tiny`: a sliding and a full layer,
per-layer inputs, random weights), given an untied LM head so a hand-checkable script can be
laid over it. The first five residual axes are the script's: no embedding, no layer output
(attention, MLP, per-layer input) and no other LM-head entry touches them; each of five tokens
is a large embedding along its own axis, which the LM head maps to a chosen next token:
    <tool_response|> -> "Hi"    "Hi" -> <turn|> (an end token)    "{" -> "}"
    "}" -> <tool_call|>    <tool_call|> -> <|tool_response> (an end token)
Every other context is the random model's own. With a named tool_choice the server writes
<|tool_call>call:get_time{ and the model closes the call, so the reply is a Gemma call that the
gemma4 parser returns as tool_calls (aggregate and streamed); the tool result goes back inside
the same model turn, rendered by the Gemma template, and the model answers "Hi". Thinking
replies to ordinary questions are the random model's: batched they must equal the same
requests alone. The checks are scripted_tools.py's, shared with the other families.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import early_or_now, start_server
from ninfer_jax.artifact.format import save_artifact
from ninfer_jax.artifact.random_init import init_random, random_tensor
from scripted_tools import (FLAGS, check_concurrent_equals_alone, check_forced_call_round_trip,
                            check_streamed_forced_call, lay_script)

CHAIN = [("<tool_response|>", "Hi"), ("Hi", "<turn|>"), ("{", "}"), ("}", "<tool_call|>"),
         ("<tool_call|>", "<|tool_response>")]


def scripted_gemma(out):
    contents = init_random("gemma4-tiny")
    contents.config = dataclasses.replace(contents.config, tie_word_embeddings=False)
    contents.weight_formats["lm_head"] = "f32"
    H, V = contents.config.hidden_size, contents.config.vocab_size
    contents.params["lm_head"] = random_tensor(0, "lm_head", (H, V), 2.0 / np.sqrt(H), "f32")
    lay_script(contents, CHAIN, ("wo", "w_down", "ple_proj"))
    return save_artifact(out, contents)


def start_scripted(folder):
    return start_server(scripted_gemma(folder / "gemma-script.ninfer"), *FLAGS)


EARLY_STARTS = {"scripted": start_scripted}


@pytest.fixture(scope="module")
def scripted():
    server = early_or_now(start_scripted)
    yield server
    server.stop(wait=False)


def test_a_forced_call_comes_back_as_tool_calls_and_the_result_round_trips(scripted):
    check_forced_call_round_trip(scripted)


def test_a_streamed_forced_call_carries_the_same_call(scripted):
    check_streamed_forced_call(scripted)


def test_concurrent_greedy_replies_equal_the_same_requests_alone(scripted):
    check_concurrent_equals_alone(scripted)
