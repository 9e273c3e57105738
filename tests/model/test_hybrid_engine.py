"""The real hybrid model (model/hybrid.py, random tiny Qwen3.5 weights) through the JaxRunner
and the engine's scheduler: state slots and state checkpoints change no greedy token.
Batched streams equal the same requests alone, a repeated prompt that starts from a
checkpoint copy equals its first run, and pauses under a small KV pool (restored from zero or
from a checkpoint) leave the text unchanged. One runner serves every test: its slots hold
stale state from earlier tests, which a correct engine never reads. The Gated DeltaNet
layer's output projection is scaled up (STATE_GAIN) so that its recurrent state decides the
tokens: at the drawn scale a tiny model repeats one token whatever its state, and a lost
checkpoint copy changed nothing."""
from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from engine_drive import CONTEXT, PAGE, VOCAB, generate, outputs, prompt
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.engine.runner import JaxRunner

LANES, SLOTS = 4, 6
STATE_GAIN = 16.0


@pytest.fixture(scope="module")
def runner():
    config = dataclasses.replace(PRESETS["qwen3.5-tiny"].config, vocab_size=VOCAB,
                                 mtp_num_layers=0, max_position_embeddings=CONTEXT)
    params = random_params(config, seed=3, dtype="f32")
    for layer, kind in zip(params["layers"], config.layer_types):
        if kind == "linear_attention":
            layer["out"] = layer["out"] * STATE_GAIN
    artifact = types.SimpleNamespace(config=config, params=params)
    runner = JaxRunner(artifact, num_pages=64, page_size=PAGE, max_batch=LANES,
                       max_context=CONTEXT, prefill_chunk=16, state_slot_capacity=SLOTS,
                       step_shapes="essential")
    runner.warmup()
    return runner


def test_batched_streams_equal_each_alone(runner):
    prompts = [prompt(5 + 6 * i, salt=i) for i in range(LANES)]
    together, scheduler = generate(runner, prompts, reuse=False)
    alone = [outputs(generate(runner, [p], lanes=1, reuse=False)[0])[0] for p in prompts]
    assert outputs(together) == alone
    assert scheduler.slots.num_used == 0


def test_a_repeated_prompt_from_its_checkpoint_equals_its_first_run(runner):
    ids = prompt(30, salt=11)
    results, scheduler = generate(runner, [ids, ids], lanes=1, together=False)
    (first_cached, first, _), (cached, second, _) = results
    assert first_cached == 0 and cached == 28  # the whole pages before the last token
    assert second == first and len(set(first)) > 2  # not one token repeated
    assert scheduler.checkpoints.num_checkpoints == 1


def test_pauses_restore_from_zero_or_from_a_checkpoint_without_changing_text(runner):
    prompts = [prompt(9, salt=20 + i) for i in range(LANES)]
    reference = outputs(generate(runner, prompts, reuse=False, max_tokens=20)[0])
    assert len({tuple(ids) for ids in reference}) == LANES  # the streams differ
    for reuse in (False, True):
        results, scheduler = generate(runner, prompts, num_pages=12, reuse=reuse,
                                      max_tokens=20)
        assert scheduler.counters.preemptions > 0
        assert outputs(results) == reference
        restored = sum(counters["restored_cached_tokens"] for _, _, counters in results)
        assert (restored > 0) == reuse


def test_pauses_by_snapshot_bring_their_recurrent_state_back_from_host(runner):
    prompts = [prompt(9, salt=20 + i) for i in range(LANES)]
    reference = outputs(generate(runner, prompts, reuse=False, max_tokens=20)[0])
    units = -(-runner.state_bytes // runner.page_bytes)
    for reuse in (False, True):
        results, scheduler = generate(runner, prompts, num_pages=12, reuse=reuse,
                                      max_tokens=20, host_pages=LANES * (units + 8))
        counters = scheduler.counters
        assert counters.preemptions > 0 and counters.snapshot_restores > 0
        assert counters.replayed_tokens == 0
        assert outputs(results) == reference
        # Nothing paused is left there: what is held is the prefix cache's.
        assert scheduler.host.num_used == (len(scheduler.host_holders()) if reuse else 0)


def test_a_conversation_evicted_to_host_resumes_from_its_host_checkpoint(runner):
    """One spare slot and a small pool: other traffic pushes the first turn's pages and its
    checkpoint's slot to the host tier; the next turn loads both and equals a cold run."""
    system = prompt(24, salt=30)
    turns = [system + [5, 6]] + [prompt(30, salt=31 + i) for i in range(3)] + [system + [7]]
    cold, _ = generate(runner, turns[-1:], lanes=1, reuse=False)
    units = -(-runner.state_bytes // runner.page_bytes)
    results, scheduler = generate(runner, turns, lanes=1, slots=2, num_pages=16,
                                  together=False, host_pages=48 + 4 * units)
    cached, warm, _ = results[-1]
    assert cached == 24 and warm == outputs(cold)[0]
    checkpoints = scheduler.checkpoints
    assert checkpoints.spilled >= 1 and checkpoints.loaded == 1
    assert scheduler.cache.loaded_pages > 0
    assert scheduler.host.num_used == len(scheduler.host_holders())
    assert not checkpoints.copies  # every row the runner holds is a held checkpoint's
    assert runner._page_store.num_state_rows == checkpoints.num_host_checkpoints
    scheduler.pool.check(scheduler.page_holders())
    scheduler.slots.check(scheduler.slot_holders())
    scheduler.host.check(scheduler.host_holders())
