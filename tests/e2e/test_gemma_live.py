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
requests alone.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from conftest import FEW_SHAPES, start_server
from ninfer_jax.artifact.format import save_artifact
from ninfer_jax.artifact.random_init import init_random, random_tensor

FLAGS = ("--max-context", "256", "--prefill-chunk", "64", "--max-concurrency", "2", *FEW_SHAPES)
SCRIPT_EMBED, SCRIPT_HEAD = 100.0, 30.0
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The current time",
    "parameters": {"type": "object", "properties": {}}}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
QUESTIONS = ["Name a colour.", "Count to three.", "Say hello in French."]
CHAIN = [("<tool_response|>", "Hi"), ("Hi", "<turn|>"), ("{", "}"), ("}", "<tool_call|>"),
         ("<tool_call|>", "<|tool_response>")]


def scripted_gemma(out):
    contents = init_random("gemma4-tiny")
    contents.config = dataclasses.replace(contents.config, tie_word_embeddings=False)
    contents.weight_formats["lm_head"] = "f32"
    params = contents.params
    H, V = contents.config.hidden_size, contents.config.vocab_size
    params["lm_head"] = random_tensor(0, "lm_head", (H, V), 2.0 / np.sqrt(H), "f32")
    tokenizer = Tokenizer.from_str(contents.tokenizer_json)
    ids = {t: tokenizer.token_to_id(t) for pair in CHAIN for t in pair}
    params["final_norm"] = np.ones_like(params["final_norm"])
    axes = len(CHAIN)
    for layer in params["layers"]:  # outputs [..., H]: nothing written to the script's axes
        for leaf in ("wo", "w_down", "ple_proj"):
            layer[leaf][..., :axes] = 0.0
    embed, head = params["embed"], params["lm_head"]
    embed[:, :axes] = 0.0
    head[:axes] = 0.0
    for k, (token, following) in enumerate(CHAIN):
        direction = np.zeros(H, np.float32)
        direction[k] = 1.0
        embed[ids[token]] = SCRIPT_EMBED * direction
        head[:, ids[following]] += SCRIPT_HEAD * direction
    return save_artifact(out, contents)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    server = start_server(
        scripted_gemma(tmp_path_factory.mktemp("gemma") / "gemma-script.ninfer"), *FLAGS)
    yield server
    server.stop()


def model_id(server) -> str:
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


def ask_time(server, **fields):
    return server.openai().chat.completions.create(
        model=model_id(server), messages=[{"role": "user", "content": "What time is it?"}],
        tools=[TIME_TOOL], tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0, max_tokens=16, extra_body=NO_THINKING, **fields)


def test_a_forced_call_comes_back_as_tool_calls_and_the_result_round_trips(scripted):
    reply = ask_time(scripted)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_time", "{}")
    answer = scripted.openai().chat.completions.create(
        model=model_id(scripted), temperature=0, max_tokens=16, tools=[TIME_TOOL],
        extra_body=NO_THINKING, messages=[
            {"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "12:00"}])
    assert answer.choices[0].message.content == "Hi"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.prompt_tokens > reply.usage.prompt_tokens  # the call and result rendered


def test_a_streamed_forced_call_carries_the_same_call(scripted):
    names, arguments, finish = [], "", None
    for chunk in ask_time(scripted, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            if part.function and part.function.name:
                names.append(part.function.name)
            arguments += (part.function.arguments or "") if part.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_time"] and arguments == "{}" and finish == "tool_calls"


def think(server, question):
    reply = server.openai().chat.completions.create(
        model=model_id(server), max_tokens=12, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": question}])
    message = reply.choices[0].message
    return reply.usage.completion_tokens, message.content, getattr(message, "reasoning_content",
                                                                   None)


def test_concurrent_greedy_replies_equal_the_same_requests_alone(scripted):
    alone = [think(scripted, q) for q in QUESTIONS]
    with concurrent.futures.ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda q: think(scripted, q), QUESTIONS))
    assert together == alone
    assert all(tokens == 12 for tokens, _, _ in together)
    assert len({(content, reasoning) for _, content, reasoning in alone}) > 1
