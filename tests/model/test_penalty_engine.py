"""Presence/frequency penalties on a real JaxRunner (a tiny random llama) driven by the
scheduler: the device-resident output counts, updated by the steps themselves while
penalised rows ride the launch-ahead pipeline, give exactly the tokens of the host
implementation they replace, which rebuilt each row's counts from its committed output
before every step (`host_counted`: a synchronous decode that loads the lane from the
committed output each time). The penalties here (0.5, 0.25) make the bias bit-identical
to that implementation's f64 formula (tests/model/test_sampling.py)."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hf_reference import saved_tiny_model
from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import GenerationRequest, RequestHandle, SamplingParams
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.step_loop import StepLoop

PAGE, CONTEXT, LANES = 8, 128, 3
PRESENCE = SamplingParams(temperature=0.0, presence_penalty=0.5)
SEEDED = SamplingParams(temperature=0.9, seed=3, presence_penalty=0.5, frequency_penalty=0.25)
PLAIN = SamplingParams(temperature=0.0)


# A comparison between KV computed by a prefill chunk (a replay after a pause, a forced run
# the host path commits at once) and KV computed by decode rows is bit-exact on the CPU only,
# where prefill and decode share row-invariant kernels and reductions. On a GPU the two round
# differently and a tiny random model's near-tied logits then diverge a few tokens later: H100
# runs 38 and 39 (benchmarks/results/run38/h100-lanes/, run39/h100-lanes-kv/) passed the
# comparisons without such a mix and failed most of the others, natively, at "highest"
# precision and with NINFER_FORCE_REFERENCE=1 alike (that run computed in bf16, the GPU's
# default; the runner here is f32 on every backend since, and
# benchmarks/results/run39/device_run39.sh "lanesref" lifts this mark on the device's copy).
CPU_EXACT = pytest.mark.skipif(jax.default_backend() != "cpu",
                               reason="prefill-vs-decode KV equality holds on the CPU only")


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    artifact = saved_tiny_model("llama", tmp_path_factory.mktemp("penalty-llama"), seed=3)[1]
    runner = JaxRunner(artifact, num_pages=64, page_size=PAGE, max_batch=LANES,
                       max_context=CONTEXT, prefill_chunk=32, dtype=jnp.float32)
    runner.warmup()
    return runner


def prompt(length: int, salt: int) -> list[int]:
    return np.random.default_rng(salt).integers(1, 96, length).tolist()


def host_counted(runner, ids, params, max_tokens) -> list[int]:
    """One request decoded synchronously, its lane loaded from the committed output before
    every sample (the host implementation's semantics)."""
    table = np.arange(1, 1 + math.ceil((len(ids) + max_tokens) / PAGE), dtype=np.int32)
    runner.load_penalty_lane(1, ())
    output = [runner.prefill(PrefillUnit(0, np.asarray(ids, np.int32), 0, table,
                                         SampleSpec(params, 0, 1)))]
    while len(output) < max_tokens:
        runner.load_penalty_lane(1, output)
        position = len(ids) + len(output) - 1
        row = DecodeRow(0, output[-1], position, table, SampleSpec(params, len(output), 1))
        output.append(int(runner.decode([row])[0]))
    return output


def served(runner, requests, *, num_pages=64, lanes=LANES, vocab_size=None):
    """The requests submitted at once to a fresh scheduler over `runner`, the engine's
    pipelined loop; (final events, launched plans). With `vocab_size` the scheduler compiles
    token policies into device automata (test_policy_engine.py)."""
    config = EngineConfig(max_concurrency=lanes, prefill_chunk=32, max_context=CONTEXT)
    scheduler = Scheduler(config, PagePool(num_pages), page_size=PAGE,
                          max_batch=runner.max_batch, vocab_size=vocab_size)
    loop = StepLoop(scheduler, runner)
    plans = []
    loop.on_step = plans.append
    handles = [RequestHandle(r) for r in requests]
    for handle in handles:
        scheduler.add(handle)
    for _ in range(10_000):
        scheduler.apply_controls()
        if not loop.advance() and not scheduler.has_work():
            loop.drain()
            break
    finals = []
    for handle in handles:
        events = []
        while (event := handle.next_event(timeout=0)) is not None:
            events.append(event)
        finals.append(events[-1])
    return finals, plans


def request(ids, params, max_tokens=24) -> GenerationRequest:
    return GenerationRequest(f"r{len(ids)}-{id(params)}", list(ids), params, max_tokens)


@pytest.mark.parametrize("params", [PRESENCE, SEEDED], ids=["greedy", "seeded"])
def test_a_penalised_request_alone_matches_the_host_counts(runner, params):
    ids = prompt(11, 1)
    expected = host_counted(runner, ids, params, 24)
    assert expected != host_counted(runner, ids, PLAIN if params.is_greedy else
                                    SamplingParams(temperature=0.9, seed=3), 24)
    [final], plans = served(runner, [request(ids, params)])
    assert list(final.output_ids) == expected
    rows = [row for plan in plans for row in plan.rows]
    # pipelined: every row after the first token was fed from the step before on the device
    assert len(rows) == 23 and all(row.from_previous is not None for row in rows)


def test_concurrent_requests_match_the_host_counts(runner):
    params = [PRESENCE, SEEDED, PLAIN]
    prompts = [prompt(9 + 4 * i, 10 + i) for i in range(3)]
    expected = [host_counted(runner, ids, p, 24) for ids, p in zip(prompts, params)]
    finals, _ = served(runner, [request(ids, p) for ids, p in zip(prompts, params)])
    assert [list(f.output_ids) for f in finals] == expected


@CPU_EXACT
def test_paused_requests_match_the_host_counts(runner):
    params = [SEEDED, PRESENCE, SEEDED]
    prompts = [prompt(14, 20 + i) for i in range(3)]
    expected = [host_counted(runner, ids, p, 30) for ids, p in zip(prompts, params)]
    # 13 pages of 8 tokens: not enough for three 44-token sequences at once
    finals, _ = served(runner, [request(ids, p, 30) for ids, p in zip(prompts, params)],
                       num_pages=14)
    assert sum(f.counters["preemptions"] for f in finals) > 0
    assert [list(f.output_ids) for f in finals] == expected
