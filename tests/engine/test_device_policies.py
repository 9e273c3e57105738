"""Token policies applied by the step (engine/policy_lanes.py) against their host twins.

The oracle is the host policy itself: `expected_output(..., forced=policy.adjust)` runs a
fresh host copy of the policy on the fake model's formula, and a Driver with
device_policies=False serves the same requests through `adjust` on the engine thread. The
device path must commit exactly those tokens (greedy and seeded, alone, together, across
pauses, with penalties, with a stop inside a forced run) while its rows ride the
launch-ahead pipeline: every row after the first token is fed from the step before it. A
forced tool call's name completion starts with a token its name state also keeps; the step's
forced flag is what lets the host mirror (and a lane reload after a pause) follow it."""
from __future__ import annotations

import pytest

from ninfer_jax.engine.policies import ForcedToolCall, ThinkingBudget
from ninfer_jax.engine.request import SamplingParams
from tests.engine.engine_testkit import (
    GREEDY, Driver, expected_output, make_request, prompt_of,
)

OPEN, CLOSE = 950, 951
SUFFIX = [900, 901, 902, CLOSE, 903]
SEEDED = SamplingParams(temperature=0.8, seed=5)
PRESENCE = SamplingParams(temperature=0.0, presence_penalty=0.5)


def budget(budget=3, **fields):
    options = dict(budget=budget, open_id=OPEN, close_id=CLOSE, suffix_ids=SUFFIX,
                   starts_in_reasoning=True, max_tokens=30, stop_ids=frozenset())
    options.update(fields)
    return ThinkingBudget(**options)


def serve(requests, **driver_options):
    driver = Driver(**driver_options)
    return driver, driver.run_all(requests)


def oracle(request, make_policy):
    return expected_output(request.prompt_ids, request.max_tokens, sampling=request.sampling,
                           stop=request.stop_token_ids, forced=make_policy().adjust)


def rows_of(driver, seq_id):
    return [row for plan in driver.schedules for row in plan.rows if row.seq_id == seq_id]


def serve_together(makers, samplings, max_tokens, overlap):
    """One request per (policy maker or None, sampling), served at once: each must commit its
    oracle's tokens (the plain formula's without a policy) and, with overlap, every row of
    each must be fed on the device. Returns the requests."""
    requests = [make_request(prompt_of(6 + 2 * i, i), max_tokens=max_tokens, sampling=s,
                             token_policy=make() if make else None)
                for i, (make, s) in enumerate(zip(makers, samplings))]
    driver, results = serve(requests, max_concurrency=len(requests), overlap=overlap)
    for request, make, result in zip(requests, makers, results):
        expected = (oracle(request, make) if make else expected_output(
            request.prompt_ids, max_tokens, sampling=request.sampling))
        assert list(result.output_ids) == expected
    if overlap:
        for i in range(len(requests)):
            assert all(row.from_previous is not None for row in rows_of(driver, i))
    return requests


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED])
def test_a_budget_applied_on_the_device_commits_the_host_policys_tokens(sampling):
    policy = budget()
    request = make_request(prompt_of(9), max_tokens=30, sampling=sampling,
                           token_policy=policy)
    driver, [result] = serve([request], max_concurrency=1)
    expected = oracle(request, budget)
    assert list(result.output_ids) == expected
    assert expected[3:3 + len(SUFFIX)] == SUFFIX  # the budget bites
    assert policy.applied == 1
    rows = rows_of(driver, 0)
    # one token per step, every row fed on the device: no sit-out
    assert len(rows) == 29 and all(row.from_previous is not None for row in rows)
    assert driver.schedules[0].penalty_loads[0].policy is not None


def test_the_host_twin_sits_out_and_agrees():
    requests = [make_request(prompt_of(9), max_tokens=30, token_policy=budget())
                for _ in range(2)]
    device, [on_device] = serve(requests[:1], max_concurrency=1)
    host, [on_host] = serve(requests[1:], max_concurrency=1, device_policies=False)
    assert on_device.output_ids == on_host.output_ids
    assert requests[0].token_policy.applied == requests[1].token_policy.applied == 1
    assert any(row.from_previous is None for row in rows_of(host, 0))  # it sat out
    assert all(row.from_previous is not None for row in rows_of(device, 0))


def test_a_model_written_open_marker_after_blanks_starts_the_count():
    prompt = prompt_of(11, 2)
    plain = expected_output(prompt, 30)
    blank = {plain[0]}.__contains__  # the first token is whitespace, the second opens
    make = lambda: budget(open_id=plain[1], starts_in_reasoning=False,  # noqa: E731
                          is_blank=blank)
    request = make_request(prompt, max_tokens=30, token_policy=make())
    _, [result] = serve([request], max_concurrency=1)
    expected = oracle(request, make)
    assert list(result.output_ids) == expected and expected[5:5 + len(SUFFIX)] == SUFFIX
    # answer text before an open marker: no block, no cap
    late = make_request(prompt, max_tokens=30, token_policy=budget(
        open_id=plain[1], starts_in_reasoning=False))
    _, [result] = serve([late], max_concurrency=1)
    assert list(result.output_ids) == plain and late.token_policy.applied == 0


@pytest.mark.parametrize("limit", [0, 2])
def test_a_two_token_open_marker_counts_from_after_its_tail(limit):
    """Gemma 4's <|channel>thought: the tail is part of the marker, not counted thinking
    (a budget of 0 still cuts in there, as the host policy does)."""
    prompt = prompt_of(11, 2)
    plain = expected_output(prompt, 30)
    make = lambda: budget(limit, open_id=plain[0], starts_in_reasoning=False,  # noqa: E731
                          open_tail=1)
    request = make_request(prompt, max_tokens=30, token_policy=make())
    _, [result] = serve([request], max_concurrency=1)
    expected = oracle(request, make)
    assert list(result.output_ids) == expected
    start = 1 + (1 if limit else 0) + limit
    assert expected[start:start + len(SUFFIX)] == SUFFIX
    assert request.token_policy.applied == 1


def test_no_room_for_the_suffix_keeps_the_samples():
    make = lambda: budget(budget=3, max_tokens=8)  # noqa: E731
    request = make_request(prompt_of(9), max_tokens=8, token_policy=make())
    _, [result] = serve([request], max_concurrency=1)
    assert list(result.output_ids) == oracle(request, make) == expected_output(prompt_of(9), 8)
    assert request.token_policy.applied == 0


def test_a_stop_inside_the_forced_run_ends_the_request_there():
    stop = SUFFIX[2]
    make = lambda: budget(stop_ids=frozenset({stop}))  # noqa: E731
    request = make_request(prompt_of(9), max_tokens=30, token_policy=make(),
                           stop_token_ids=(stop,))
    driver, [result] = serve([request], max_concurrency=1)
    assert list(result.output_ids) == oracle(request, make)
    assert result.output_ids[-1] == stop and result.reason == "stop"


@pytest.mark.parametrize("overlap", [True, False])
def test_concurrent_budgets_penalties_and_plain_requests(overlap):
    makers = [lambda: budget(2), lambda: budget(5), lambda: budget(0), None,
              lambda: budget(4)]
    samplings = [GREEDY, SEEDED, PRESENCE, PRESENCE, SamplingParams(
        temperature=0.7, seed=3, frequency_penalty=0.25)]
    requests = serve_together(makers, samplings, 24, overlap)
    assert all(r.token_policy.applied == 1 for r in requests if r.token_policy)


@pytest.mark.parametrize("host_pages", [0, 64])  # paused by replay, or by snapshot
def test_paused_requests_come_back_in_the_automatons_state(host_pages):
    makers = [lambda b=b: budget(b, max_tokens=26) for b in (1, 4, 7, 10)]
    samplings = [GREEDY, SEEDED, PRESENCE, GREEDY]
    requests = [make_request(prompt_of(8, i), max_tokens=26, sampling=s, token_policy=m())
                for i, (m, s) in enumerate(zip(makers, samplings))]
    driver, results = serve(requests, num_pages=16, max_concurrency=4,
                            host_pages=host_pages, prefix_reuse=True)
    assert sum(r.counters["preemptions"] for r in results) > 0
    for request, make, result in zip(requests, makers, results):
        assert list(result.output_ids) == oracle(request, make)
        assert request.token_policy.applied == 1
    restores = sum(r.counters["replay_restores"] + r.counters["snapshot_restores"]
                   for r in results)
    loads = [load for plan in driver.schedules for load in plan.penalty_loads]
    assert len(loads) == 4 + restores and all(load.policy is not None for load in loads)
    # some restore landed inside a forced run: its lane came back mid-chain
    assert any(load.policy[0] >= 3 for load in loads)


# A vocabulary where names are spelled one character per token, so the fake model's samples
# often extend an offered name (kept) and the forced completion starts with a token the name
# state keeps: which of the two happened is the step's forced flag, not the output.
ALPHABET = 'abcd"'
BLANK = 9


def tool_text(token: int) -> str:
    if token == BLANK:
        return " "
    if token >= 100:
        return ALPHABET[token % len(ALPHABET)]
    return f"<{token}>"


def tool_decode(ids):
    return "".join(tool_text(i) for i in ids)


def tool_encode(text):
    return [100 + ALPHABET.index(c) for c in text]


def tool_call(names=("abca", "abd", "cab"), **fields):
    options = dict(decode=tool_decode, encode=tool_encode, prefix_ids=[7, 8], names=list(names),
                   terminator='"', open_id=None, close_id=None, starts_in_reasoning=False,
                   may_open_thinking=False)
    options.update(fields)
    return ForcedToolCall(**options)


def name_runs(output):
    """How the output's name was committed: the tokens after the call prefix."""
    text = tool_decode(output)
    return text.split("<7><8>", 1)[1] if "<7><8>" in text else None


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED, SamplingParams(temperature=0.9, seed=11)])
def test_a_forced_tool_call_on_the_device_commits_the_host_policys_tokens(sampling):
    for salt in range(6):
        request = make_request(prompt_of(9, salt), max_tokens=14, sampling=sampling,
                               token_policy=tool_call())
        driver, [result] = serve([request], max_concurrency=1)
        expected = oracle(request, tool_call)
        assert list(result.output_ids) == expected
        assert name_runs(expected) is not None  # the call was forced
        rows = rows_of(driver, 0)
        assert rows and all(row.from_previous is not None for row in rows)  # no sit-out
        assert driver.schedules[0].penalty_loads[0].policy is not None


def test_sampled_and_forced_name_tokens_both_occur_and_both_match_the_host():
    """Over seeds, some name gets a freely sampled token that is also the first token of the
    completion the state would force, and some gets a forced completion: both equal the host."""
    kinds = set()
    for seed in range(12):
        sampling = SamplingParams(temperature=1.0, seed=seed)
        request = make_request(prompt_of(7, seed), max_tokens=12, sampling=sampling,
                               token_policy=tool_call())
        host = make_request(prompt_of(7, seed), max_tokens=12, sampling=sampling,
                            token_policy=tool_call())
        _, [on_device] = serve([request], max_concurrency=1)
        _, [on_host] = serve([host], max_concurrency=1, device_policies=False)
        reference = tool_call()

        def watched(output, sampled):
            adjusted = reference.adjust(output, sampled)
            in_name = 8 in output and '"' not in tool_decode(output[output.index(8):])
            if in_name and tool_text(sampled) in ALPHABET:
                kinds.add("kept" if adjusted == [sampled] else "forced")
            return adjusted
        expected = expected_output(request.prompt_ids, 12, sampling=sampling, forced=watched)
        assert list(on_device.output_ids) == list(on_host.output_ids) == expected
    assert kinds == {"kept", "forced"}


def test_a_blank_prefix_then_the_call_and_a_model_opened_think_block():
    for salt in range(4):
        prompt = prompt_of(8, salt)
        plain = expected_output(prompt, 14)
        make = lambda: tool_call(decode=lambda ids: "".join(  # noqa: E731
            " " if i == plain[0] else tool_text(i) for i in ids),
            open_id=plain[1], close_id=plain[2], may_open_thinking=True)
        request = make_request(prompt, max_tokens=14, token_policy=make())
        driver, [result] = serve([request], max_concurrency=1)
        expected = oracle(request, make)
        assert list(result.output_ids) == expected
        assert expected[:3] == plain[:3]  # blank, the model's open marker, its close marker
        assert all(row.from_previous is not None for row in rows_of(driver, 0))


def test_a_stop_inside_the_forced_prefix_ends_the_request_there():
    request = make_request(prompt_of(9), max_tokens=14, token_policy=tool_call(),
                           stop_token_ids=(8,))
    _, [result] = serve([request], max_concurrency=1)
    assert list(result.output_ids) == oracle(request, tool_call)
    assert result.output_ids[-1] == 8 and result.reason == "stop"


@pytest.mark.parametrize("overlap", [True, False])
def test_concurrent_tool_calls_budgets_and_plain_requests(overlap):
    makers = [tool_call, lambda: budget(3), None, lambda: tool_call(("dab", "ab")), tool_call]
    samplings = [SEEDED, GREEDY, PRESENCE, SamplingParams(temperature=1.0, seed=4), PRESENCE]
    serve_together(makers, samplings, 16, overlap)


@pytest.mark.parametrize("host_pages", [0, 64])  # paused by replay, or by snapshot
def test_paused_tool_calls_come_back_in_the_automatons_state(host_pages):
    samplings = [SamplingParams(temperature=1.0, seed=s) for s in range(6)]
    requests = [make_request(prompt_of(8, i), max_tokens=24, sampling=s,
                             token_policy=tool_call(("abcabca", "abdd", "cabb")))
                for i, s in enumerate(samplings)]
    driver, results = serve(requests, num_pages=16, max_concurrency=6,
                            host_pages=host_pages, prefix_reuse=True)
    assert sum(r.counters["preemptions"] for r in results) > 0
    for request, result in zip(requests, results):
        assert list(result.output_ids) == oracle(
            request, lambda: tool_call(("abcabca", "abdd", "cabb")))
    loads = [load for plan in driver.schedules for load in plan.penalty_loads]
    assert all(load.policy is not None for load in loads)
    nodes = requests[0].token_policy.automaton(1000).nodes
    chain = {i for i, node in enumerate(nodes) if node.forced >= 0 and not node.entries}
    # some restore landed inside a forced run: its lane came back mid-chain
    assert any(int(load.policy[0]) in chain for load in loads[len(requests):])


def test_a_tool_call_past_a_lanes_size_stays_on_the_host_and_sits_out():
    names = ["".join(ALPHABET[(i * 7 + j) % 4] for j in range(40)) for i in range(12)]
    make = lambda: tool_call(names)  # noqa: E731
    request = make_request(prompt_of(9), max_tokens=12, token_policy=make())
    driver, [result] = serve([request], max_concurrency=1)
    assert list(result.output_ids) == oracle(request, make)
    assert driver.schedules[0].penalty_loads == ()
    assert any(row.from_previous is None for row in rows_of(driver, 0))
