"""End to end: a GLM MoE artifact served by a live `ninfer serve`, through the openai SDK.

The tiny GLM-4.5-Air shape (`init-random --preset glm4.5-air --tiny`, random weights) with a
hand-checkable script laid over it. The first five residual axes are the script's: no other
embedding, no layer output and no other LM-head entry touches them; each of five tokens is a
large embedding along its own axis, which the LM head maps to a chosen next token, so after
those tokens the model's choice is known whatever the layers compute:
    </think> -> "Hi"    "Hi" -> <|user|> (an end token)    <tool_call> -> "Hi"
    "\\n" -> </tool_call>    </tool_call> -> <|observation|> (an end token)
Every other context is the random model's own. The real runner, the GLM forward and the server
run as for any model. With a named tool_choice the server writes <tool_call>get_time\\n in
place of "Hi", the model closes the call, so the reply is a GLM XML call that the glm_xml
parser returns as tool_calls (aggregate and streamed); the tool result goes back rendered by
the GLM template and the model answers "Hi". Thinking replies to ordinary questions are the
random model's: batched they must equal the same requests alone. The checks are
scripted_tools.py's, shared with the other families.
"""
from __future__ import annotations

import pytest

from conftest import early_or_now, start_server
from ninfer_jax.artifact.format import save_artifact
from ninfer_jax.artifact.random_init import init_random
from scripted_tools import (FLAGS, check_concurrent_equals_alone, check_forced_call_round_trip,
                            check_streamed_forced_call, lay_script)

CHAIN = [("</think>", "Hi"), ("Hi", "<|user|>"), ("<tool_call>", "Hi"),
         ("\u010a", "</tool_call>"), ("</tool_call>", "<|observation|>")]


def scripted_glm(out):
    contents = init_random("glm4.5-air", tiny=True, dtype="f32")
    lay_script(contents, CHAIN, ("wo", "w_down", "experts_down", "shared_w_down"))
    return save_artifact(out, contents)


def start_scripted(folder):
    return start_server(scripted_glm(folder / "glm-script.ninfer"), *FLAGS)


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
