"""The scripted tool round trip shared by the family live tests (test_glm_live,
test_gemma_live, test_nemotron_live): a tiny random artifact with a hand-checkable script laid
over it, served by a live `ninfer serve` and driven through the openai SDK.

The script owns the first len(chain) residual axes: no embedding, no layer output and no
other LM-head entry touches them; each chain token is a large embedding along its own axis,
which the LM head maps to the chosen next token, so after those tokens the model's choice is
known whatever the layers compute. Every other context is the random model's own.
"""
from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
from tokenizers import Tokenizer

from conftest import FEW_SHAPES

# Few compiled shapes (each costs warm-up time on CPU); two lanes for batched replies.
FLAGS = ("--max-context", "256", "--prefill-chunk", "64", "--max-concurrency", "2", *FEW_SHAPES)
SCRIPT_EMBED, SCRIPT_HEAD = 100.0, 30.0  # the script's embedding and LM-head scales
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The current time",
    "parameters": {"type": "object", "properties": {}}}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
QUESTIONS = ["Name a colour.", "Count to three.", "Say hello in French."]


def lay_script(contents, chain: list[tuple[str, str]], output_leaves: tuple[str, ...]):
    """`contents` (untied LM head) with the script of `chain` ((token, next token) spellings)
    laid over it; `output_leaves` are the layer leaves that write the residual ([..., H])."""
    tokenizer = Tokenizer.from_str(contents.tokenizer_json)
    ids = {t: tokenizer.token_to_id(t) for pair in chain for t in pair}
    params = contents.params
    params["final_norm"] = np.ones_like(params["final_norm"])
    axes = len(chain)
    for layer in params["layers"]:  # nothing written to the script's axes
        for leaf in output_leaves:
            if leaf in layer:
                layer[leaf][..., :axes] = 0.0
    embed, head = params["embed"], params["lm_head"]
    embed[:, :axes] = 0.0
    head[:axes] = 0.0
    for k, (token, following) in enumerate(chain):
        direction = np.zeros(embed.shape[1], np.float32)
        direction[k] = 1.0
        embed[ids[token]] = SCRIPT_EMBED * direction
        head[:, ids[following]] += SCRIPT_HEAD * direction
    return contents


def model_id(server) -> str:
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


def ask_time(server, **fields):
    """The question with get_time forced by a named tool_choice, thinking off."""
    return server.openai().chat.completions.create(
        model=model_id(server), messages=[{"role": "user", "content": "What time is it?"}],
        tools=[TIME_TOOL], tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0, max_tokens=16, extra_body=NO_THINKING, **fields)


def check_forced_call_round_trip(server, answer_text: str = "Hi") -> None:
    """The forced call comes back as tool_calls; with its result rendered back by the
    family's template, the model answers `answer_text`."""
    reply = ask_time(server)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_time", "{}")
    answer = server.openai().chat.completions.create(
        model=model_id(server), temperature=0, max_tokens=16, tools=[TIME_TOOL],
        extra_body=NO_THINKING, messages=[
            {"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "12:00"}])
    assert answer.choices[0].message.content == answer_text
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.prompt_tokens > reply.usage.prompt_tokens  # the call and result rendered


def check_streamed_forced_call(server) -> None:
    names, arguments, finish = [], "", None
    for chunk in ask_time(server, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            if part.function and part.function.name:
                names.append(part.function.name)
            arguments += (part.function.arguments or "") if part.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_time"] and arguments == "{}" and finish == "tool_calls"


def _think(server, question):
    reply = server.openai().chat.completions.create(
        model=model_id(server), max_tokens=12, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": question}])
    message = reply.choices[0].message
    return reply.usage.completion_tokens, message.content, getattr(message, "reasoning_content",
                                                                   None)


def check_concurrent_equals_alone(server) -> None:
    """Greedy thinking replies (the random model's) batched equal the same requests alone."""
    alone = [_think(server, q) for q in QUESTIONS]
    with concurrent.futures.ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda q: _think(server, q), QUESTIONS))
    assert together == alone
    assert all(tokens == 12 for tokens, _, _ in together)
    assert len({(content, reasoning) for _, content, reasoning in alone}) > 1
