"""End to end: a Nemotron-H artifact served by a live `ninfer serve`, through the openai SDK.

The tiny Nemotron-H-8B shape (`init-random --preset nemotron-h-8b --tiny`: a Mamba-2, an
attention and a relu2 MLP layer, random weights, untied head) with a hand-checkable script
laid over it (scripted_tools.lay_script; the Mamba-2, attention and MLP outputs leave the
script's axes alone):
    </think> -> "Hi"    "Hi" -> <SPECIAL_12> (an end token)    '"' -> "}"    "}" -> "]"
    "]" -> </TOOLCALL>    </TOOLCALL> -> <SPECIAL_12>
With a named tool_choice the server writes <TOOLCALL>[{"name": "get_time" and the model closes
the call, so the reply is a Nemotron <TOOLCALL> list that the nemotron parser returns as
tool_calls (aggregate and streamed); the tool result goes back in a <TOOL_RESPONSE> turn
rendered by the Nemotron template and the model answers "Hi". Thinking replies to ordinary
questions are the random model's, carried by the Mamba-2 state slots: batched they must equal
the same requests alone.
"""
from __future__ import annotations

import pytest

from conftest import start_server
from ninfer_jax.artifact.format import save_artifact
from ninfer_jax.artifact.random_init import init_random
from scripted_tools import (FLAGS, check_concurrent_equals_alone, check_forced_call_round_trip,
                            check_streamed_forced_call, lay_script)

CHAIN = [("</think>", "Hi"), ("Hi", "<SPECIAL_12>"), ('"', "}"), ("}", "]"),
         ("]", "</TOOLCALL>"), ("</TOOLCALL>", "<SPECIAL_12>")]


def scripted_nemotron(out):
    contents = init_random("nemotron-h-8b", tiny=True, dtype="f32")
    lay_script(contents, CHAIN, ("out", "wo", "w_down"))
    return save_artifact(out, contents)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    server = start_server(
        scripted_nemotron(tmp_path_factory.mktemp("nemotron") / "nemotron-script.ninfer"),
        *FLAGS)
    yield server
    server.stop()


def test_a_forced_call_comes_back_as_tool_calls_and_the_result_round_trips(scripted):
    check_forced_call_round_trip(scripted)


def test_a_streamed_forced_call_carries_the_same_call(scripted):
    check_streamed_forced_call(scripted)


def test_concurrent_greedy_replies_equal_the_same_requests_alone(scripted):
    check_concurrent_equals_alone(scripted)
