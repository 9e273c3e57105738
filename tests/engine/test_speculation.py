"""Speculative decoding on the fake runner: the n-gram drafter, acceptance, scheduling.

The fake model here mostly repeats its context with a period (so prompt lookup drafts well)
and departs from it at positions fixed by the sample index and seed (so drafts are also
rejected); every speculative output is compared with the same request decoded plainly.
"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_jax.engine.request import Finished, SamplingParams, Tokens
from ninfer_jax.engine.speculation import (
    Draft, NgramDrafter, SpeculativeConfig, TokenHistory, num_accepted,
)
from tests.engine.engine_testkit import VOCAB, Driver, drain, finished, make_request

NGRAM = SpeculativeConfig("ngram", 4)
PERIOD = 5


def echo_model(context: np.ndarray, sample) -> int:
    """Copy the token PERIOD back, except every 7th output position (greedy) or where the
    seeded draw says so (sampled): there the weighted sum of the context instead."""
    weights = np.arange(1, len(context) + 1, dtype=np.int64)
    other = int((weights * context).sum() % VOCAB)
    params, index = sample.params, sample.sample_index
    if params.is_greedy:
        departs = index % 7 == 6
    else:
        departs = (params.seed * 31 + index * 17) % 5 == 0
        other = (other + params.seed + index) % VOCAB
    if departs or len(context) < PERIOD:
        return other
    return int(context[-PERIOD])


def run(requests, *, spec=NGRAM, **driver):
    driver.setdefault("next_token", echo_model)
    driver.setdefault("max_batch", 24)
    driver.setdefault("num_pages", 256)
    d = Driver(speculative=spec, max_concurrency=driver.pop("max_concurrency", 4), **driver)
    handles = [d.submit(r) for r in requests]
    d.run()
    assert d.request_pages() == 0
    return d, [finished(h) for h in handles]


def prompt(length=20, salt=0):
    return [(11 * i + 3 * salt) % PERIOD + 100 * (salt + 1) for i in range(length)]


# ----------------------------------------------------------------------------- the drafter


def test_ngram_proposes_what_followed_the_longest_suffix_match():
    drafter = NgramDrafter(min_n=2, max_n=4)
    tokens = np.array([1, 2, 3, 4, 5, 9, 9, 2, 3, 4], np.int32)
    # Suffix [2, 3, 4] (and [9, 2, 3, 4]? no) matched at 1..3: propose what followed it.
    assert drafter.propose(tokens, 3).tokens.tolist() == [5, 9, 9]
    assert drafter.propose(tokens, 1).tokens.tolist() == [5]


def test_ngram_prefers_the_longer_match_then_the_latest():
    drafter = NgramDrafter(min_n=1, max_n=3)
    # [7, 8] occurs twice, followed by 1 then by 2; [6, 7, 8] only before 2.
    tokens = np.array([6, 7, 8, 2, 0, 7, 8, 1, 5, 6, 7, 8], np.int32)
    assert drafter.propose(tokens, 1).tokens.tolist() == [2]
    tokens = np.array([0, 7, 8, 2, 0, 7, 8, 1, 5, 3, 7, 8], np.int32)
    assert drafter.propose(tokens, 2).tokens.tolist() == [1, 5]  # latest of equal length


def test_ngram_without_a_match_or_below_min_n_proposes_nothing():
    drafter = NgramDrafter(min_n=2, max_n=4)
    assert len(drafter.propose(np.array([1, 2, 3, 4, 5], np.int32), 4).tokens) == 0
    assert len(drafter.propose(np.array([1, 2, 3, 1], np.int32), 4).tokens) == 0  # 1-gram
    assert len(drafter.propose(np.array([5], np.int32), 4).tokens) == 0
    assert len(drafter.propose(np.array([1, 2, 1, 2], np.int32), 0).tokens) == 0


def test_ngram_overlapping_repeats_and_a_short_tail():
    drafter = NgramDrafter(min_n=1, max_n=4)
    tokens = np.array([3, 3, 3, 3, 3], np.int32)
    assert drafter.propose(tokens, 4).tokens.tolist() == [3]  # only one token follows
    tokens = np.array([1, 2, 1, 2, 1, 2], np.int32)
    assert drafter.propose(tokens, 4).tokens.tolist() == [1, 2]


def test_ngram_looks_back_a_bounded_window():
    drafter = NgramDrafter(min_n=2, max_n=2, lookback=8)
    tokens = np.array([4, 5, 6] + [0, 1, 2, 3, 7, 8, 9, 10] + [4, 5], np.int32)
    assert len(drafter.propose(tokens, 2).tokens) == 0  # the match lies beyond the window
    assert NgramDrafter(min_n=2, max_n=2).propose(tokens, 2).tokens.tolist() == [6, 0]


def test_token_history_follows_appends():
    history, tokens = TokenHistory(), list(range(300))
    assert history.view(tokens).tolist() == tokens
    tokens += [7, 8]
    assert history.view(tokens)[-3:].tolist() == [299, 7, 8]


def test_acceptance_takes_the_matching_prefix():
    draft = Draft(np.array([5, 6, 7], np.int32))
    assert num_accepted(draft, np.array([5, 6, 7, 8])) == 3
    assert num_accepted(draft, np.array([5, 9, 7, 8])) == 1
    assert num_accepted(draft, np.array([1, 6, 7, 8])) == 0
    with pytest.raises(NotImplementedError):
        num_accepted(Draft(draft.tokens, probs=np.ones((3, 4))), np.array([5, 6, 7, 8]))


def test_lm_head_draft_needs_a_device_drafter_and_the_component():
    with pytest.raises(ValueError, match="--lm-head-draft needs --spec"):
        SpeculativeConfig.from_options(None, None, lm_head_draft=True)
    with pytest.raises(ValueError, match="--spec ngram has no proposal head"):
        SpeculativeConfig.from_options("ngram", None, lm_head_draft=True)
    with pytest.raises(ValueError, match="1..15"):
        SpeculativeConfig.from_options("dflash2", 16, lm_head_draft=True)

    class Hybrid:
        has_state, is_hybrid, architecture, mtp_num_layers = True, True, "qwen3_5", 1
        has_recurrent_state = True

    spec = SpeculativeConfig.from_options("dflash", 7, lm_head_draft=True)
    spec.check_servable(Hybrid(), {"text": True, "dflash": True, "draft_head": True})
    with pytest.raises(ValueError, match="draft_head component"):
        spec.check_servable(Hybrid(), {"text": True, "dflash": True})
    SpeculativeConfig("mtp", 3, lm_head_draft=True).check_servable(
        Hybrid(), {"text": True, "mtp": True, "draft_head": True})


def test_config_validates_ranges_and_backends():
    assert SpeculativeConfig.from_options(None, None) is None
    assert SpeculativeConfig.from_options("ngram", None).draft_tokens == 4
    with pytest.raises(ValueError, match="needs --spec"):
        SpeculativeConfig.from_options(None, 3)
    with pytest.raises(ValueError, match="1..5"):
        SpeculativeConfig("mtp", 6)
    with pytest.raises(ValueError, match="1..15"):
        SpeculativeConfig("ngram", 16)
    assert SpeculativeConfig("dflash", 15).draft_tokens == 15
    assert NGRAM.row_capacity(1) == 5 and NGRAM.row_capacity(100) == 256
    assert SpeculativeConfig("ngram", 15).row_capacity(256) == 256


def test_unimplemented_backends_and_mtp_without_a_head_are_refused():
    class Dense:
        has_state, is_hybrid, architecture, mtp_num_layers = False, False, "llama", 0
        has_recurrent_state = False

    class Hybrid:
        has_state, is_hybrid, architecture, mtp_num_layers = True, True, "qwen3_5", 1
        has_recurrent_state = True
        has_recurrent_state = True

    class Mamba:  # recurrent state the verify rows cannot chain
        has_state, is_hybrid, architecture, mtp_num_layers = True, False, "nemotron_h", 0
        has_recurrent_state = True

    class Gemma:  # state slots hold sliding KV rings: position-addressed, nothing to chain
        has_state, is_hybrid, architecture, mtp_num_layers = True, False, "gemma4", 0
        has_recurrent_state = False

    NGRAM.check_servable(Dense())
    NGRAM.check_servable(Hybrid())
    NGRAM.check_servable(Gemma())
    for backend in ("dflash", "dflash2"):
        spec = SpeculativeConfig(backend, 15)
        with pytest.raises(ValueError, match="gemma4 is neither"):
            spec.check_servable(Gemma())
        for target in (Hybrid(), Dense()):  # dense llama / qwen3: draft-store slots
            spec.check_servable(target)  # components unknown (no artifact read yet)
            spec.check_servable(target, {"text": True, backend: True})
            with pytest.raises(ValueError, match=f"needs the artifact's {backend} component"):
                spec.check_servable(target, {"text": True, "mtp": True})
        assert spec.dflash_drafts == 15 and spec.mtp_drafts == 0
    SpeculativeConfig("mtp", 3).check_servable(Hybrid())
    with pytest.raises(ValueError, match="MTP head"):
        SpeculativeConfig("mtp", 3).check_servable(Dense())
    assert SpeculativeConfig("mtp", 5).mtp_drafts == 5 and NGRAM.mtp_drafts == 0
    for config in (NGRAM, SpeculativeConfig("mtp", 3)):
        with pytest.raises(ValueError, match="nemotron_h"):
            config.check_servable(Mamba())


# ----------------------------------------------------------------------------- engine


def outputs(results):
    return [r.output_ids for r in results]


@pytest.mark.parametrize("concurrency", [1, 4])
def test_greedy_output_equals_plain_decoding(concurrency):
    requests = lambda: [make_request(prompt(20 + 3 * i, i), max_tokens=40)  # noqa: E731
                        for i in range(6)]
    _, plain = run(requests(), spec=None, max_concurrency=concurrency)
    driver, spec = run(requests(), max_concurrency=concurrency)
    assert outputs(spec) == outputs(plain)
    counters = driver.scheduler.counters
    assert counters.spec_rounds > 0 and counters.spec_accepted_tokens > 0
    assert counters.spec_accepted_tokens < counters.spec_draft_tokens  # some were rejected
    assert any(len(p.verify) for p in driver.schedules)
    # Fewer steps than tokens: rounds committed several tokens at once.
    assert len(driver.schedules) < sum(len(r.output_ids) for r in spec)


@pytest.mark.parametrize("seed", [0, 7, -3])
def test_seeded_sampled_output_equals_plain_decoding(seed):
    sampling = SamplingParams(temperature=0.8, seed=seed)
    requests = lambda: [make_request(prompt(24, i), max_tokens=30, sampling=sampling)  # noqa
                        for i in range(3)]
    _, plain = run(requests(), spec=None)
    driver, spec = run(requests())
    assert outputs(spec) == outputs(plain)
    assert 0 < driver.scheduler.counters.spec_accepted_tokens


def test_rows_never_exceed_the_runner_and_chunk_steps_stay_small():
    requests = [make_request(prompt(40, i), max_tokens=30) for i in range(6)]
    driver, _ = run(requests, max_batch=8, max_chunk_rows=4, prefill_chunk=8,
                    max_concurrency=4)
    for plan in driver.schedules:
        assert len(plan.rows) <= (4 if plan.chunk is not None else 8)
        for span in plan.verify:  # a round's rows: one sequence, consecutive positions
            rows = plan.rows[span.first_row:span.first_row + len(span.draft.tokens) + 1]
            assert {r.seq_id for r in rows} == {span.seq_id}
            assert [r.position for r in rows] == list(range(rows[0].position,
                                                            rows[0].position + len(rows)))
            assert [r.token for r in rows[1:]] == span.draft.tokens.tolist()
    assert any(p.verify for p in driver.schedules if p.chunk is not None)


def test_max_tokens_inside_an_accepted_run_commits_exactly_the_limit():
    for limit in range(1, 12):
        _, plain = run([make_request(prompt(20), max_tokens=limit)], spec=None)
        _, spec = run([make_request(prompt(20), max_tokens=limit)])
        assert outputs(spec) == outputs(plain) and len(spec[0].output_ids) == limit
        assert spec[0].usage.completion_tokens == limit and spec[0].reason == "length"


def test_a_stop_token_inside_an_accepted_run_ends_it_there():
    _, plain = run([make_request(prompt(20), max_tokens=40)], spec=None)
    stop = plain[0].output_ids[9]
    first = plain[0].output_ids.index(stop)
    for ignore_eos in (False, True):  # a request's own stop ids outlive ignore_eos
        _, spec = run([make_request(prompt(20), max_tokens=40, ignore_eos=ignore_eos,
                                    stop_token_ids=frozenset([stop]))])
        assert spec[0].output_ids == plain[0].output_ids[:first + 1]
        assert spec[0].reason == "stop" and spec[0].matched_stop_token == stop


def test_context_end_inside_an_accepted_run():
    for max_context in (27, 30, 33):
        _, plain = run([make_request(prompt(20), max_tokens=max_context - 20)], spec=None,
                       max_context=max_context)
        _, spec = run([make_request(prompt(20), max_tokens=max_context - 20)],
                      max_context=max_context)
        assert outputs(spec) == outputs(plain)
        assert len(spec[0].output_ids) == max_context - 20


def test_stop_at_inside_an_accepted_run_truncates_the_committed_output():
    driver = Driver(speculative=NGRAM, max_concurrency=1, next_token=echo_model,
                    max_batch=5, num_pages=64)
    handle = driver.submit(make_request(prompt(20), max_tokens=40))
    events = []
    while sum(len(e.ids) for e in events if isinstance(e, Tokens)) < 12:
        driver.step()
        events += drain(handle)
    handle.stop_at(10)  # as the HTTP side does when a stop string matched at token 10
    driver.run()
    done = (events + drain(handle))[-1]
    assert isinstance(done, Finished) and done.reason == "stop"
    assert done.usage.completion_tokens == 10 and len(done.output_ids) == 10


def test_draft_false_penalties_and_policies_decode_plainly():
    class Identity:
        def adjust(self, output_ids, sampled):
            return [sampled]

    plain_sampling = SamplingParams(temperature=0.0, presence_penalty=0.5)
    requests = [make_request(prompt(20, 0), max_tokens=20, speculative=False),
                make_request(prompt(20, 1), max_tokens=20, sampling=plain_sampling),
                make_request(prompt(20, 2), max_tokens=20, token_policy=Identity())]
    driver, results = run(requests)
    _, plain = run([make_request(r.prompt_ids, max_tokens=20, sampling=r.sampling,
                                 speculative=False) for r in requests], spec=None)
    assert outputs(results) == outputs(plain)
    assert not any(p.verify for p in driver.schedules)
    counters = driver.scheduler.counters
    assert counters.spec_rounds == 0
    # The draft: false request is not eligible; the other two fell back every step.
    assert results[0].counters["spec_fallback_steps"] == 0
    assert results[1].counters["spec_fallback_steps"] == results[1].counters["decode_rounds"]
    assert counters.spec_fallback_steps == sum(r.counters["spec_fallback_steps"]
                                               for r in results) > 0


def test_request_counters_add_up():
    driver, results = run([make_request(prompt(20, i), max_tokens=40) for i in range(3)])
    for r in results:
        c = r.counters
        assert c["spec_rounds"] + c["spec_fallback_steps"] == c["decode_rounds"]
        assert sum(c["spec_accepted_per_position"]) == c["spec_accepted"] <= c["spec_drafted"]
        per = c["spec_accepted_per_position"]
        assert len(per) == 4 and per == sorted(per, reverse=True)
        # every output token but the prefill's first came from a round or a plain row
        assert len(r.output_ids) - 1 == c["spec_fallback_steps"] + c["spec_rounds"] + \
            c["spec_accepted"]
    counters = driver.scheduler.counters
    assert counters.spec_accepted_tokens == sum(r.counters["spec_accepted"] for r in results)
    assert counters.spec_draft_tokens == sum(r.counters["spec_drafted"] for r in results)


def test_pressure_pauses_and_prefix_reuse_keep_the_output():
    requests = lambda: [make_request(prompt(30, i % 2), max_tokens=50)  # noqa: E731
                        for i in range(5)]
    _, plain = run(requests(), spec=None, num_pages=40)
    driver, spec = run(requests(), num_pages=40)
    assert outputs(spec) == outputs(plain)
    assert driver.scheduler.counters.preemptions > 0
    assert driver.scheduler.counters.cached_tokens > 0


def test_cancel_during_a_round():
    driver = Driver(speculative=NGRAM, max_concurrency=2, next_token=echo_model,
                    max_batch=10, num_pages=64)
    handle = driver.submit(make_request(prompt(20), max_tokens=200))
    other = driver.submit(make_request(prompt(20, 1), max_tokens=30))
    for _ in range(8):
        driver.step()
    handle.cancel()
    driver.run()
    assert finished(handle).reason == "cancelled"
    assert finished(other).reason == "length" and driver.request_pages() == 0


def test_the_engine_refuses_speculation_on_state_slots_that_do_not_chain():
    from ninfer_jax.engine.config import EngineConfig
    from ninfer_jax.engine.engine import Engine
    from ninfer_jax.engine.fake import FakeRunner

    with pytest.raises(ValueError, match="hybrid"):
        Engine(FakeRunner(state_slot_capacity=2),
               EngineConfig(max_concurrency=1, speculative=NGRAM))
    Engine(FakeRunner(state_slot_capacity=2, chained_rows=True),
           EngineConfig(max_concurrency=1, speculative=NGRAM))
    Engine(FakeRunner(), EngineConfig(max_concurrency=1, speculative=NGRAM))
