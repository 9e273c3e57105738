"""The real Nemotron-H model (model/nemotron_h.py, random weights in the nemotron-h-tiny shape,
and the nemotron-3-nano-tiny one with a MoE layer) through the JaxRunner and the engine's
scheduler: eight concurrent greedy streams equal each request alone; pauses under a small KV
pool (restored from zero, from a state checkpoint or
from a host snapshot of the Mamba-2 states) and a pool with fewer state slots than lanes leave
the text unchanged. The Mamba-2 output
projection is scaled up (STATE_GAIN) so that its state decides the tokens, as in
test_hybrid_engine."""
from __future__ import annotations

import dataclasses
import types

import pytest

from engine_drive import CONTEXT, PAGE, VOCAB, generate, outputs, prompt
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.engine.runner import JaxRunner

LANES, SLOTS = 8, 10
STATE_GAIN = 16.0


def make_runner(preset: str):
    config = dataclasses.replace(PRESETS[preset].config, vocab_size=VOCAB,
                                 max_position_embeddings=CONTEXT)
    params = random_params(config, seed=3, dtype="f32")
    for layer, kind in zip(params["layers"], config.layer_types):
        if kind == "mamba":
            layer["out"] = layer["out"] * STATE_GAIN
    artifact = types.SimpleNamespace(config=config, params=params)
    runner = JaxRunner(artifact, num_pages=64, page_size=PAGE, max_batch=LANES,
                       max_context=CONTEXT, prefill_chunk=16, state_slot_capacity=SLOTS,
                       step_shapes="essential")
    runner.warmup()
    return runner


@pytest.fixture(scope="module")
def runner():
    return make_runner("nemotron-h-tiny")


def test_moe_layers_eight_concurrent_greedy_streams_equal_each_alone():
    """Nemotron 3's MoE block (nemotron-3-nano-tiny: a Mamba-2, an attention and a MoE
    layer): a step's rows share the routed experts' grouped product, yet each stream's text
    is its own."""
    runner = make_runner("nemotron-3-nano-tiny")
    assert "moe" in runner.config.layer_types
    prompts = [prompt(3 + 5 * i, salt=40 + i) for i in range(LANES)]
    together, _ = generate(runner, prompts, reuse=False)
    alone = [outputs(generate(runner, [p], lanes=1, reuse=False)[0])[0] for p in prompts]
    assert outputs(together) == alone
    assert len({tuple(ids) for ids in alone}) == LANES


def test_eight_concurrent_greedy_streams_equal_each_alone(runner):
    prompts = [prompt(3 + 5 * i, salt=i) for i in range(LANES)]
    together, scheduler = generate(runner, prompts, reuse=False)
    alone = [outputs(generate(runner, [p], lanes=1, reuse=False)[0])[0] for p in prompts]
    assert outputs(together) == alone
    assert len({tuple(ids) for ids in alone}) == LANES  # the streams differ
    assert scheduler.slots.num_used == 0


def test_pauses_and_fewer_state_slots_leave_the_text_unchanged(runner):
    prompts = [prompt(9, salt=20 + i) for i in range(4)]
    reference = outputs(generate(runner, prompts, lanes=4, reuse=False, max_tokens=20)[0])
    for reuse in (False, True):
        results, scheduler = generate(runner, prompts, lanes=4, num_pages=12, reuse=reuse,
                                      max_tokens=20)
        assert scheduler.counters.preemptions > 0
        assert outputs(results) == reference
        restored = sum(counters["restored_cached_tokens"] for _, _, counters in results)
        assert (restored > 0) == reuse
    # two state slots for four lanes: sequences wait for a slot, then run on a reused one
    results, _ = generate(runner, prompts, lanes=4, slots=2, reuse=False, max_tokens=20)
    assert outputs(results) == reference
    # pauses by snapshot: the Mamba-2 conv and SSM states go to the host tier and back
    units = -(-runner.state_bytes // runner.page_bytes)
    results, scheduler = generate(runner, prompts, lanes=4, num_pages=12, reuse=False,
                                  max_tokens=20, host_pages=4 * (units + 8))
    assert scheduler.counters.snapshot_restores > 0 and scheduler.counters.replayed_tokens == 0
    assert outputs(results) == reference
