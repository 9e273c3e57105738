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
the same requests alone. The Anthropic Messages and Responses dialects read the same forced
call from the same tokens.
"""
from __future__ import annotations

import pytest

from conftest import early_or_now, start_server
from ninfer_jax.artifact.format import save_artifact
from ninfer_jax.artifact.random_init import init_random
from scripted_tools import (FLAGS, TIME_TOOL, check_concurrent_equals_alone,
                            check_forced_call_round_trip, check_streamed_forced_call, lay_script,
                            model_id)

CHAIN = [("</think>", "Hi"), ("Hi", "<SPECIAL_12>"), ('"', "}"), ("}", "]"),
         ("]", "</TOOLCALL>"), ("</TOOLCALL>", "<SPECIAL_12>")]


def scripted_nemotron(out):
    contents = init_random("nemotron-h-8b", tiny=True, dtype="f32")
    lay_script(contents, CHAIN, ("out", "wo", "w_down"))
    return save_artifact(out, contents)


def start_scripted(folder):
    return start_server(scripted_nemotron(folder / "nemotron-script.ninfer"), *FLAGS)


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


def test_the_anthropic_and_responses_dialects_read_the_same_forced_call(scripted):
    import anthropic

    tool = TIME_TOOL["function"]
    message = anthropic.Anthropic(base_url=scripted.url, api_key="unused", max_retries=0,
                                  timeout=300).messages.create(
        model=model_id(scripted), max_tokens=16, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "What time is it?"}],
        tools=[{"name": tool["name"], "description": tool["description"],
                "input_schema": tool["parameters"]}],
        tool_choice={"type": "tool", "name": "get_time"})
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert (block.name, block.input, message.stop_reason) == ("get_time", {}, "tool_use")
    response = scripted.openai().responses.create(
        model=model_id(scripted), input="What time is it?", temperature=0,
        max_output_tokens=16, tools=[{"type": "function", **tool}],
        tool_choice={"type": "function", "name": "get_time"})
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert (call.name, call.arguments) == ("get_time", "{}")
