"""The Gemma 4 text model (model/gemma.py, random weights in the gemma4-tiny shape: a sliding
layer of window 16 and a full layer) through the JaxRunner and the engine's scheduler. The
sliding layer's KV lives in a ring per state slot (8 pages of 4: window 16 + a chunk of 16
- 1), so these sequences of up to 60 tokens wrap it; pages of the pool hold the full layer
only. Eight concurrent greedy streams equal each request alone; pauses under a small pool
(replayed, restored from a prefix checkpoint of the ring, or from a host snapshot of it) and
fewer slots than lanes leave the text unchanged. The sliding layer's output norm is scaled
up (SLIDING_GAIN) so that its ring decides the tokens (the tied head otherwise repeats the
last token)."""
from __future__ import annotations

import dataclasses
import types

import jax.numpy as jnp
import pytest

import engine_drive
from engine_drive import CONTEXT, PAGE, VOCAB, generate, outputs, prompt
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.kernels.paged_attention import cache_bytes_per_token

LANES, SLOTS = 8, 10
SLIDING_GAIN = 60.0


def gemma_config():
    return dataclasses.replace(PRESETS["gemma4-tiny"].config, vocab_size=VOCAB,
                               vocab_size_per_layer_input=VOCAB,
                               max_position_embeddings=CONTEXT)


def gemma_params(config):
    params = random_params(config, seed=5, dtype="f32")
    params["layers"][0]["post_attn_norm"] = params["layers"][0]["post_attn_norm"] * SLIDING_GAIN
    return params


@pytest.fixture(scope="module")
def runner():
    config = gemma_config()
    artifact = types.SimpleNamespace(config=config, params=gemma_params(config))
    runner = JaxRunner(artifact, num_pages=64, page_size=PAGE, max_batch=LANES,
                       max_context=CONTEXT, prefill_chunk=16, state_slot_capacity=SLOTS,
                       step_shapes="essential")
    runner.warmup()
    return runner


def test_pages_hold_the_full_layer_and_slots_the_sliding_ring(runner):
    config = runner.config
    assert config.ring_layers() == [0] and runner.step_tokens == 16
    full = cache_bytes_per_token(config.layer_kv_heads(1), config.layer_head_dim(1),
                                 jnp.float32)
    sliding = cache_bytes_per_token(config.layer_kv_heads(0), config.layer_head_dim(0),
                                    jnp.float32)
    assert runner.page_bytes == PAGE * full
    assert config.ring_pages(PAGE, 16) == 8 and runner.state_bytes == 8 * PAGE * sliding


def test_eight_concurrent_greedy_streams_equal_each_alone(runner):
    prompts = [prompt(20 + 3 * i, salt=i) for i in range(LANES)]
    together, scheduler = generate(runner, prompts, reuse=False, max_tokens=12)
    alone = [outputs(generate(runner, [p], lanes=1, reuse=False, max_tokens=12)[0])[0]
             for p in prompts]
    assert outputs(together) == alone
    assert len({tuple(ids) for ids in alone}) == LANES  # the streams differ
    assert scheduler.slots.num_used == 0 and scheduler.pool.num_free == 63


def test_pauses_and_fewer_state_slots_leave_the_text_unchanged(runner):
    prompts = [prompt(29, salt=20 + i) for i in range(4)]
    reference = outputs(generate(runner, prompts, lanes=4, reuse=False, max_tokens=24)[0])
    for reuse in (False, True):
        results, scheduler = generate(runner, prompts, lanes=4, num_pages=22, reuse=reuse,
                                      max_tokens=24)
        assert scheduler.counters.preemptions > 0
        assert outputs(results) == reference
        restored = sum(counters["restored_cached_tokens"] for _, _, counters in results)
        assert (restored > 0) == reuse
    results, _ = generate(runner, prompts, lanes=4, slots=2, reuse=False, max_tokens=24)
    assert outputs(results) == reference
    # pauses by snapshot: the rings go to the host tier and back
    units = -(-runner.state_bytes // runner.page_bytes)
    results, scheduler = generate(runner, prompts, lanes=4, num_pages=22, reuse=False,
                                  max_tokens=24, host_pages=4 * (units + 16))
    assert scheduler.counters.snapshot_restores > 0 and scheduler.counters.replayed_tokens == 0
    assert outputs(results) == reference


def test_speculative_rounds_commit_what_plain_decoding_does():
    """--spec ngram: a sequence's verify rows share its slot and write their positions into
    its ring; rejected drafts' KV is overwritten later, as a page's would be (no chaining)."""
    from ninfer_jax.engine.config import EngineConfig
    from ninfer_jax.engine.pages import PagePool
    from ninfer_jax.engine.request import GenerationRequest, SamplingParams
    from ninfer_jax.engine.scheduler import Scheduler
    from ninfer_jax.engine.speculation import SpeculativeConfig
    from ninfer_jax.engine.state_slots import StateSlotPool

    spec, lanes = SpeculativeConfig("ngram", 3), 2
    config = gemma_config()
    runner = JaxRunner(types.SimpleNamespace(config=config, params=gemma_params(config)),
                       num_pages=64, page_size=PAGE, max_batch=spec.row_capacity(lanes),
                       max_chunk_rows=lanes, max_context=CONTEXT, prefill_chunk=16,
                       state_slot_capacity=4, step_shapes="essential", speculative=True)
    assert not runner.chained_rows and runner.step_tokens == 16
    runner.warmup()
    # a prompt that repeats itself, so that n-gram drafts exist from the start
    prompts = [(prompt(6, salt=60 + i) * 4)[:22] for i in range(lanes)]

    def run(speculative: bool):
        scheduler = Scheduler(
            EngineConfig(max_concurrency=lanes, prefill_chunk=16, max_context=CONTEXT,
                         kv_capacity=63 * PAGE, speculative=spec),
            PagePool(64), page_size=PAGE, max_batch=runner.max_batch,
            max_chunk_rows=runner.max_chunk_rows, slots=StateSlotPool(4))
        finals = engine_drive.run_requests(scheduler, runner, [
            GenerationRequest(f"r{i}", ids, SamplingParams(temperature=0.0), 30,
                              speculative=speculative) for i, ids in enumerate(prompts)])
        return [list(f.output_ids) for f in finals], scheduler.counters

    plain, _ = run(False)
    drafted, counters = run(True)
    assert drafted == plain
    assert counters.spec_rounds > 0 and counters.spec_accepted_tokens > 0
