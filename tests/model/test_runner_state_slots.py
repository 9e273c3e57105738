"""JaxRunner with a family that has state slots: the caches come from the family's
init_caches with capacity + 1 slots, each chunk and row reaches the step with its own slot
(padding on the dummy slot), and dense families keep their packed layout.

The family here is a stub with the hybrid cache interface (one linear-attention layer whose
"recurrent" entry is an int32 counter per slot), so the test checks the runner's plumbing
without the Gated DeltaNet model: the token after a unit is its slot's state mod V, the state
being the sum of (token + 1) over everything fed through the slot since a chunk at start 0."""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.engine.runner_api import CHUNK_SLOT, DecodeRow, PrefillUnit, SampleSpec, StepPlan
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.model import ragged_batch, steps
from ninfer_jax.model.config import ModelConfig

VOCAB = 64
GREEDY = SampleSpec(params=SamplingParams(temperature=0.0), sample_index=0)


class StubHybrid:
    """The family interface (cache_shapes, init_caches, ragged) over a per-slot counter."""

    @staticmethod
    def cache_shapes(config, *, num_pages, page_size, num_state_slots, dtype, kv_dtype):
        return [{"conv": jax.ShapeDtypeStruct((num_state_slots, 1, 1), dtype),
                 "recurrent": jax.ShapeDtypeStruct((num_state_slots,), jnp.int32)}]

    @staticmethod
    def init_caches(config, **sizes):
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                            StubHybrid.cache_shapes(config, **sizes))

    @staticmethod
    def ragged(params, kv, batch, prev_out, *, config, page_size):
        state = kv[0]["recurrent"]
        C = ragged_batch.num_chunk_tokens(batch)
        chunk_state = jnp.int32(0)
        if C:
            slot = batch.chunk_state_slot
            fed = jnp.where(jnp.arange(C) < batch.chunk_len, batch.chunk_tokens + 1, 0).sum()
            chunk_state = jnp.where(batch.chunk_start == 0, 0, state[slot]) + fed
            state = state.at[slot].set(chunk_state)
        rows = ragged_batch.step_tokens(batch, prev_out)[C:]
        row_states = state[batch.row_state_slots] + rows + 1
        state = state.at[batch.row_state_slots].set(row_states)
        sampled = jnp.concatenate([chunk_state[None], row_states]) % VOCAB
        logits = jax.nn.one_hot(sampled, VOCAB, dtype=jnp.float32)
        return logits, [{"conv": kv[0]["conv"], "recurrent": state}]


def _hybrid_config():
    return ModelConfig(architecture="qwen3_5", vocab_size=VOCAB, hidden_size=8,
                       intermediate_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                       head_dim=8, layer_types=("linear_attention",), linear_num_key_heads=1,
                       linear_num_value_heads=1, linear_key_head_dim=2,
                       linear_value_head_dim=2, linear_conv_kernel_dim=2)


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setitem(steps.FAMILIES, "qwen3_5", StubHybrid)
    artifact = types.SimpleNamespace(config=_hybrid_config(),
                                     params={"layers": [{"w": np.zeros((2, 2), np.float32)}]})
    runner = JaxRunner(artifact, num_pages=8, page_size=4, max_batch=2, max_context=16,
                       prefill_chunk=16, state_slot_capacity=3, compile_threads=1)
    runner.warmup()
    return runner


def _table(*pages):
    return np.asarray(pages, np.int32)


def test_caches_hold_capacity_plus_the_dummy_slot(runner):
    assert runner.state_slot_capacity == 3 and runner.has_state
    assert runner.kv[0]["recurrent"].shape == (4,)
    assert runner._layout(0, 2).state_slots


def test_every_unit_runs_on_its_own_slot(runner):
    prompt_a, prompt_b = [1, 2, 3], [5, 6]
    a = runner.prefill(PrefillUnit(0, np.asarray(prompt_a, np.int32), 0, _table(1), GREEDY,
                                   state_slot=2))
    assert a == sum(t + 1 for t in prompt_a) % VOCAB
    # b's chunk and a's row in one step, a's row fed back from the previous step's output
    plan = StepPlan(chunk=PrefillUnit(1, np.asarray(prompt_b, np.int32), 0, _table(2), GREEDY,
                                      state_slot=3),
                    rows=(DecodeRow(0, 0, 3, _table(1), GREEDY, from_previous=CHUNK_SLOT,
                                    state_slot=2),))
    result = runner.collect(runner.launch(plan))
    assert result.chunk_token == sum(t + 1 for t in prompt_b) % VOCAB
    assert int(result.row_tokens[0]) == (a + (a + 1)) % VOCAB
    # a continuation chunk (start > 0) continues its slot's state
    more = runner.prefill(PrefillUnit(1, np.asarray([7], np.int32), 2, _table(2), GREEDY,
                                      state_slot=3))
    assert more == (result.chunk_token + 8) % VOCAB
    state = np.asarray(runner.kv[0]["recurrent"])
    assert state[1] == 0  # never named: untouched
    for slot in (0, 4):  # the dummy slot, past the pool
        with pytest.raises(ValueError, match="outside 1..3"):
            runner.prefill(PrefillUnit(2, np.asarray([1], np.int32), 0, _table(3), GREEDY,
                                       state_slot=slot))


def test_dense_families_keep_their_layout(monkeypatch):
    config = ModelConfig(architecture="llama", vocab_size=VOCAB, hidden_size=8,
                         intermediate_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                         head_dim=8)
    artifact = types.SimpleNamespace(config=config, params={"layers": [{}]})
    runner = JaxRunner(artifact, num_pages=8, page_size=4, max_batch=2, max_context=16,
                       prefill_chunk=16, state_slot_capacity=5)
    assert not runner.has_state and runner.state_slot_capacity == 0
    assert not runner._layout(16, 2).state_slots
    assert "state_slots" not in runner._fingerprint()
    assert "chunk_state_slot" not in runner._host_batch((), (), 0, 1)


def test_state_copies_run_in_order_before_the_step(runner):
    compiled = runner._copy_slot._cache_size()  # (shared by every runner in the process)
    first = runner.prefill(PrefillUnit(0, np.asarray([4, 4], np.int32), 0, _table(1), GREEDY,
                                       state_slot=1))
    assert first == 10
    # 1 -> 2, then 2 -> 3: slot 3 ends with slot 1's state only if they run in order; the
    # chunk continues on slot 3 after both.
    plan = StepPlan(chunk=PrefillUnit(0, np.asarray([2], np.int32), 2, _table(1), GREEDY,
                                      state_slot=3), state_copies=((1, 2), (2, 3)))
    assert runner.collect(runner.launch(plan)).chunk_token == 13
    state = np.asarray(runner.kv[0]["recurrent"])
    assert list(state[1:]) == [10, 10, 13]
    assert runner._copy_slot._cache_size() == compiled  # warm-up compiled the copy launch runs


def test_a_state_snapshots_copy_compiles_off_the_engine_thread(runner):
    """With the host tier on, the state snapshot's save and load (and the page runs, here
    with no paged layer to copy) compile on the copy compile thread; the engine thread's
    first runs compile nothing, and a snapshot saved and loaded round-trips the state."""
    from ninfer_jax.engine.compile_clock import COMPILE_CLOCK
    from ninfer_jax.engine.host_pages import LOAD, SAVE, StateCopy

    runner.use_host_tier()
    assert runner.copies_compiled.wait(120)
    before = COMPILE_CLOCK.here()
    while runner.prime_one():
        pass
    ready, planned = runner.compile_progress()
    assert ready == planned
    runner.prefill(PrefillUnit(0, np.asarray([4, 4], np.int32), 0, _table(1), GREEDY,
                               state_slot=1))
    for copy in (StateCopy(SAVE, 1, 7), StateCopy(LOAD, 2, 7)):  # as launch applies them
        runner.kv = runner._page_store.apply_state(runner.kv, copy)
    assert list(np.asarray(runner.kv[0]["recurrent"])[1:3]) == [10, 10]
    assert COMPILE_CLOCK.here() == before
