"""Speculative decoding (--spec ngram) on the real hybrid model (random tiny Qwen3.5 weights,
model/hybrid.py) through the JaxRunner and the scheduler: verify rows chain the Gated
DeltaNet state inside the step and the slot keeps the accepted position's state, so greedy
output equals plain decoding token for token, alone and 8 concurrent, and through pauses.
The reference is a second runner compiled without speculation (the plain row path). As in
test_hybrid_engine.py the DeltaNet output is scaled up (STATE_GAIN) so that a wrong state
changes the tokens. Random weights rarely repeat themselves, so besides the n-gram drafter the
tests use an oracle drafter that proposes the plain run's continuation with planted errors:
rounds then accept every number of drafts from none to all."""
from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

import engine_drive
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import GenerationRequest, SamplingParams
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.speculation import SpeculativeConfig
from ninfer_jax.engine.state_slots import StateSlotPool

VOCAB, PAGE, CONTEXT, LANES, SLOTS, PAGES = 64, 4, 96, 8, 10, 160
SPEC = SpeculativeConfig("ngram", 3)
STATE_GAIN = 16.0
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def artifact():
    config = dataclasses.replace(PRESETS["qwen3.5-tiny"].config, vocab_size=VOCAB,
                                 mtp_num_layers=0, max_position_embeddings=CONTEXT)
    params = random_params(config, seed=5, dtype="f32")
    for layer, kind in zip(params["layers"], config.layer_types):
        if kind == "linear_attention":
            layer["out"] = layer["out"] * STATE_GAIN
    return types.SimpleNamespace(config=config, params=params)


def make_runner(artifact, speculative: bool):
    rows = SPEC.row_capacity(LANES) if speculative else LANES
    runner = JaxRunner(artifact, num_pages=PAGES, page_size=PAGE, max_batch=rows,
                       max_chunk_rows=LANES, max_context=CONTEXT, prefill_chunk=16,
                       state_slot_capacity=SLOTS, step_shapes="essential",
                       speculative=speculative)
    runner.warmup()
    return runner


@pytest.fixture(scope="module")
def spec_runner(artifact):
    return make_runner(artifact, True)


@pytest.fixture(scope="module")
def plain_runner(artifact):
    return make_runner(artifact, False)


def looping_prompt(salt: int) -> list[int]:
    """A random 5-token phrase three times: the n-gram drafter proposes from the start."""
    phrase = np.random.default_rng(salt).integers(1, VOCAB, 5).tolist()
    return phrase * 3


class OracleDrafter:
    """Drafts the reference continuation of whichever prompt `tokens` starts with; output
    positions n with n % 5 == 3 are drafted wrong."""

    name, on_device = "oracle", False

    def __init__(self, prompts, references):
        self.runs = list(zip(prompts, references))

    def propose(self, tokens, k):
        from ninfer_jax.engine.speculation import Draft

        tokens = tokens.tolist()
        prompt, reference = next((p, r) for p, r in self.runs if tokens[:len(p)] == p)
        n = len(tokens) - len(prompt)
        draft = [(t + 1) % VOCAB if (n + j) % 5 == 3 else t
                 for j, t in enumerate(reference[n:n + k])]
        return Draft(np.asarray(draft, np.int32))


def generate(runner, prompts, *, num_pages=PAGES, max_tokens=24, lanes=LANES, drafter=None,
             reuse=False):
    speculative = runner.chained_rows
    config = EngineConfig(max_concurrency=lanes, prefill_chunk=16, max_context=CONTEXT,
                          prefix_reuse=reuse, speculative=SPEC if speculative else None)
    scheduler = Scheduler(config, PagePool(num_pages), page_size=PAGE,
                          max_batch=runner.max_batch, slots=StateSlotPool(SLOTS),
                          max_chunk_rows=runner.max_chunk_rows)
    if drafter is not None:
        scheduler.spec.drafter = drafter
    finals = engine_drive.run_requests(scheduler, runner, [
        GenerationRequest(f"r{i}", list(ids), GREEDY, max_tokens)
        for i, ids in enumerate(prompts)])
    checkpoints = scheduler.checkpoints
    assert scheduler.slots.num_used == (checkpoints.num_checkpoints if checkpoints else 0)
    return [list(f.output_ids) for f in finals], scheduler.counters


def test_greedy_alone_and_eight_concurrent_equal_plain_decoding(spec_runner, plain_runner):
    prompts = [looping_prompt(salt) for salt in range(LANES)]
    plain = [generate(plain_runner, [p], lanes=1)[0][0] for p in prompts]
    assert len({tuple(ids) for ids in plain}) == LANES
    alone, counters = generate(spec_runner, prompts[:1], lanes=1)
    assert alone == plain[:1] and counters.spec_rounds > 0
    together, counters = generate(spec_runner, prompts,
                                  drafter=OracleDrafter(prompts, plain))
    assert together == plain
    # Rounds accepted 0..3 drafts: the settled state is every position's in turn.
    assert counters.spec_rounds >= 40
    assert counters.spec_draft_tokens * 0.5 < counters.spec_accepted_tokens \
        < counters.spec_draft_tokens * 0.9


def test_pauses_and_prefix_reuse_with_speculation_leave_the_text_unchanged(spec_runner,
                                                                          plain_runner):
    prompts = [looping_prompt(salt) for salt in range(10, 10 + LANES)]
    reference, _ = generate(plain_runner, prompts)
    for reuse in (False, True):  # restored from zero, or from a state checkpoint
        paused, counters = generate(spec_runner, prompts, num_pages=40, reuse=reuse,
                                    drafter=OracleDrafter(prompts, reference))
        assert counters.preemptions > 0 and counters.spec_rounds > 0
        assert paused == reference

