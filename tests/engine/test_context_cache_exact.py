"""Exactness of the context cache on the real JaxRunner: greedy output after a host-tier hit,
after a snapshot restore and after a replay equals a cold run of the same prompt, on a tiny
random llama and on the default model (SmolLM2-135M). Pools are a few pages, so the device
pool spills and pauses within a handful of short prompts."""
from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from ninfer_jax.artifact import convert_common
from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.host_pages import HostPagePool
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import GenerationRequest, RequestHandle, SamplingParams
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.step_loop import StepLoop
from ninfer_jax.model.config import ModelConfig

PAGE, LANES, CONTEXT, CHUNK = 4, 2, 64, 16
GREEDY = SamplingParams(temperature=0.0)


def tiny_llama(head_dim=4):
    config = ModelConfig(architecture="llama", vocab_size=264, hidden_size=16,
                         intermediate_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         head_dim=head_dim)
    rng, params = np.random.default_rng(0), {}
    for name, shape in config.expected_shapes().items():
        convert_common.add_to_params(params, name, rng.standard_normal(shape).astype(np.float32),
                                     config.num_layers)
    return types.SimpleNamespace(config=config, params=params), config.vocab_size


@pytest.fixture(scope="module", params=["tiny", "tiny-int8-pages", "tiny-k8v4-pages",
                                        "tiny-nvfp4-pages", "default"])
def runner(request):
    from ninfer_jax.engine.runner import JaxRunner, kv_dtype_for

    # 8- and 4-bit pages: codes and every scale travel together (4-bit codes come in blocks
    # of 16 elements, so those models have a head dim of 16)
    pages = request.param.removeprefix("tiny-").removesuffix("-pages")
    kv_dtype = kv_dtype_for(pages if request.param.endswith("-pages") else "auto")
    if request.param.startswith("tiny"):
        artifact, vocab = tiny_llama(head_dim=16 if pages in ("k8v4", "nvfp4") else 4)
    else:
        from ninfer_jax.artifact.format import load_artifact

        artifact = load_artifact(request.getfixturevalue("default_artifact_path"), weights=True)
        vocab = artifact.config.vocab_size
    runner = JaxRunner(artifact, num_pages=32, page_size=PAGE, max_batch=LANES,
                       max_context=CONTEXT, prefill_chunk=CHUNK, kv_dtype=kv_dtype)
    # One shape serves every step (decode-only ones too, by padding): compiles dominate
    # this test's time.
    runner.compile_shapes([(CHUNK, LANES)])
    return runner, vocab


def generate(runner, prompts, *, num_pages, host_pages, concurrent, max_tokens,
             prefix_reuse=True):
    """Outputs of `prompts` (submitted together, or each after the last finished) on a fresh
    scheduler over `num_pages` of the runner's pool, and the scheduler."""
    config = EngineConfig(max_concurrency=LANES, prefill_chunk=CHUNK, max_context=CONTEXT,
                          kv_capacity=(num_pages - 1) * PAGE, prefix_reuse=prefix_reuse)
    scheduler = Scheduler(config, PagePool(num_pages), page_size=PAGE, max_batch=LANES,
                          host=HostPagePool(host_pages, runner.page_bytes))
    runner.clear_host_pages()  # the runner outlives this test's pools
    loop = StepLoop(scheduler, runner)
    handles = []
    for index, prompt in enumerate(prompts):
        handles.append(RequestHandle(GenerationRequest(
            f"r{index}", list(prompt), GREEDY, max_tokens, ignore_eos=True)))
        scheduler.add(handles[-1])
        if not concurrent or index == len(prompts) - 1:
            while scheduler.has_work() or loop.in_flight:
                if not loop.advance():
                    loop.drain()
    outputs = []
    for handle in handles:
        events = []
        while (event := handle.next_event(timeout=0)) is not None:
            events.append(event)
        outputs.append(list(events[-1].output_ids))
    return outputs, scheduler


def prompt_of(length, vocab, salt):
    return [(37 * i + 101 * salt + 5) % (vocab - 8) + 4 for i in range(length)]


def test_host_tier_hit_snapshot_and_replay_equal_a_cold_run(runner):
    runner, vocab = runner
    system = prompt_of(12, vocab, salt=9)
    turns = [system + [7, 8], prompt_of(22, vocab, 1), system + [7, 8, 9, 10]]
    # Cold: no prefix reuse, a pool with room for all (batching never changes a row).
    cold, _ = generate(runner, turns, num_pages=32, host_pages=0, concurrent=True,
                       max_tokens=8, prefix_reuse=False)
    # The system prompt leaves the 8-page device pool, then returns from the host tier.
    outputs, scheduler = generate(runner, turns, num_pages=9, host_pages=64, concurrent=False,
                                  max_tokens=3)
    assert outputs == [output[:3] for output in cold]
    assert scheduler.cache.loaded_pages > 0 and scheduler.counters.cached_tokens == 12
    assert scheduler.cache.free_evictions > 0  # the hit read copies written through
    # All at once in a pool too small for both lanes: pauses by snapshot, then by replay.
    for host_pages, route in ((64, "snapshot_restores"), (0, "replay_restores")):
        outputs, scheduler = generate(runner, turns, num_pages=9, host_pages=host_pages,
                                      concurrent=True, max_tokens=8)
        assert outputs == cold, route
        assert getattr(scheduler.counters, route) > 0 and scheduler.counters.preemptions > 0


def test_saves_out_of_host_memory_cost_only_cache(runner, request):
    """The JaxRunner's store loses the first saves to RESOURCE_EXHAUSTED: launch raises
    PageCopyError, the scheduler forgets those copies, and every output is still a cold
    run's (a lost save only makes a later hit shorter)."""
    if request.node.callspec.params["runner"] != "tiny":
        pytest.skip("one runner is enough for the recovery path")
    runner, vocab = runner
    store, failures = runner._page_store, []
    pack = store._pack

    def pack_or_fail(*args):
        if len(failures) < 2:
            failures.append(1)
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of host memory")
        return pack(*args)

    system = prompt_of(12, vocab, salt=9)
    turns = [system + [7, 8], prompt_of(22, vocab, 1), system + [7, 8, 9, 10]]
    cold, _ = generate(runner, turns, num_pages=32, host_pages=0, concurrent=True,
                       max_tokens=3, prefix_reuse=False)
    store._pack = pack_or_fail
    try:
        outputs, scheduler = generate(runner, turns, num_pages=9, host_pages=64,
                                      concurrent=False, max_tokens=3)
    finally:
        store._pack = pack
    assert outputs == cold and len(failures) == 2
    assert scheduler.counters.requests.get("failed", 0) == 0
