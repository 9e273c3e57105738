"""Thinking budgets and forced tool calls on a real JaxRunner (a tiny random llama) driven by the scheduler: the
automaton the compiled step applies (model/token_automaton.py, engine/policy_lanes.py)
commits exactly the tokens of the host policy it replaces, which the same scheduler runs
through `adjust` when it is given no vocabulary (rows sitting out while their token is
pending, a forced run committed at once and prefilled). Alone (greedy, seeded), together
with penalties and plain requests, across pauses, and with a stop inside the forced run."""
from __future__ import annotations

import pytest

import test_penalty_engine as penalty_engine
from ninfer_jax.engine.policies import ForcedToolCall, ThinkingBudget
from ninfer_jax.engine.request import GenerationRequest, SamplingParams
from test_penalty_engine import CPU_EXACT, PRESENCE, SEEDED, prompt, runner  # noqa: F401

# The comparisons that go on decoding after a forced run (which the host path prefills) or a
# pause mix KV from a prefill chunk with KV from decode rows: see CPU_EXACT. The stop inside
# the forced run ends before that and runs everywhere (it passed on the H100).

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.9, seed=7)
CLOSE = 90
SUFFIX = [80, 81, 82, CLOSE, 83]


def budget(budget=3, max_tokens=24, stop_ids=frozenset()):
    return ThinkingBudget(budget=budget, open_id=None, close_id=CLOSE, suffix_ids=SUFFIX,
                          starts_in_reasoning=True, max_tokens=max_tokens, stop_ids=stop_ids)


def served(runner, make_requests, *, on_device: bool, num_pages=64, lanes=3):
    """Fresh requests (and policies) served by a scheduler over `runner`: (finals, plans,
    requests)."""
    requests = make_requests()
    finals, plans = penalty_engine.served(
        runner, requests, num_pages=num_pages, lanes=lanes,
        vocab_size=runner.vocab_size if on_device else None)
    return finals, plans, requests


def both_ways(runner, make_requests, **options):
    device = served(runner, make_requests, on_device=True, **options)
    host = served(runner, make_requests, on_device=False, **options)
    return device, host


def outputs(finals):
    return [list(f.output_ids) for f in finals]


def make(ids, params, policy=None, max_tokens=24, **fields):
    return GenerationRequest(f"r{len(ids)}-{id(params)}", list(ids), params, max_tokens,
                             token_policy=policy, **fields)


@CPU_EXACT
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_a_budget_alone_matches_the_host_policy(runner, params):
    ids = prompt(11, 1)
    (finals, plans, requests), (host_finals, _, host_requests) = both_ways(
        runner, lambda: [make(ids, params, budget())])
    assert outputs(finals) == outputs(host_finals)
    assert outputs(finals)[0][3:3 + len(SUFFIX)] == SUFFIX
    assert requests[0].token_policy.applied == host_requests[0].token_policy.applied == 1
    rows = [row for plan in plans for row in plan.rows]
    assert len(rows) == 23 and all(row.from_previous is not None for row in rows)


@CPU_EXACT
def test_budgets_penalties_and_plain_requests_together(runner):
    def requests():
        return [make(prompt(9, 2), SEEDED, budget(2)), make(prompt(13, 3), GREEDY, budget(6)),
                make(prompt(7, 4), PRESENCE)]
    (finals, _, _), (host_finals, _, _) = both_ways(runner, requests)
    assert outputs(finals) == outputs(host_finals)


@CPU_EXACT
def test_paused_budgets_match_the_host_policy(runner):
    def requests():
        return [make(prompt(14, 20 + i), p, budget(b, 30), 30)
                for i, (p, b) in enumerate([(SEEDED, 2), (GREEDY, 5), (SAMPLED, 8)])]
    (finals, _, _), (host_finals, _, _) = both_ways(runner, requests, num_pages=14)
    assert sum(f.counters["preemptions"] for f in finals) > 0
    assert outputs(finals) == outputs(host_finals)


def test_a_stop_inside_the_forced_run(runner):
    stop = SUFFIX[2]
    (finals, _, _), (host_finals, _, _) = both_ways(runner, lambda: [make(
        prompt(11, 1), GREEDY, budget(stop_ids=frozenset({stop})), stop_token_ids=(stop,))])
    assert outputs(finals) == outputs(host_finals)
    assert finals[0].reason == "stop" and finals[0].output_ids[-1] == stop


# A forced tool call over a vocabulary that spells names one character per token: the
# completion the name state forces starts with a token it would also keep, so the runner's
# forced flag (FORCED_BIT in `out`, masked where a fed-back token is read) is what the host
# mirror follows; a flag left in a fed-back token would read past the embedding.
ALPHABET = 'abcd"'


def tool_decode(ids):
    return "".join(ALPHABET[i % 5] if i >= 20 else f"<{i}>" for i in ids)


def tool_encode(text):
    return [20 + ALPHABET.index(c) for c in text]


def tool_call():
    return ForcedToolCall(decode=tool_decode, encode=tool_encode, prefix_ids=[3, 4],
                          names=["abca", "abd", "cab"], terminator='"', open_id=None,
                          close_id=None, starts_in_reasoning=False, may_open_thinking=False)


@CPU_EXACT
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_a_forced_tool_call_alone_matches_the_host_policy(runner, params):
    ids = prompt(11, 5)
    (finals, plans, _), (host_finals, _, _) = both_ways(
        runner, lambda: [make(ids, params, tool_call(), 16)])
    assert outputs(finals) == outputs(host_finals)
    assert "<3><4>" in tool_decode(outputs(finals)[0])  # the call was forced
    assert plans[0].penalty_loads[0].policy is not None
    rows = [row for plan in plans for row in plan.rows]
    assert len(rows) == 15 and all(row.from_previous is not None for row in rows)


@CPU_EXACT
def test_tool_calls_budgets_and_plain_requests_together_and_paused(runner):
    def requests():
        return [make(prompt(14, 30), SAMPLED, tool_call(), 30),
                make(prompt(13, 31), SEEDED, budget(4, 30), 30),
                make(prompt(12, 32), GREEDY, tool_call(), 30)]
    (finals, _, _), (host_finals, _, _) = both_ways(runner, requests, num_pages=14)
    assert sum(f.counters["preemptions"] for f in finals) > 0
    assert outputs(finals) == outputs(host_finals)
