"""Speculative decoding (--spec ngram) on the default model (SmolLM2-135M) through the real
JaxRunner and the scheduler: greedy output equals plain decoding token for token, alone and
8 concurrent; seeded sampled output equals plain sampling with the same seed; an end token
or max_tokens inside an accepted run commits exactly what plain decoding commits. One runner,
sized as `ninfer serve --spec ngram` sizes it, serves every test; plain runs are the same
requests with `speculative=False` (the per-request `draft: false`)."""
from __future__ import annotations

import pytest

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import GenerationRequest, RequestHandle, SamplingParams
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.speculation import SpeculativeConfig
from ninfer_jax.engine.step_loop import StepLoop

LANES, PAGE, CONTEXT, CHUNK, NUM_PAGES = 8, 16, 512, 32, 200
SPEC = SpeculativeConfig("ngram", 3)
GREEDY = SamplingParams(temperature=0.0)
PARAGRAPHS = [
    "The lighthouse stood on a rock at the edge of the bay. Every night the keeper climbed "
    "the stairs, lit the lamp and watched the ships pass in the dark.",
    "To make bread, mix flour, water, salt and yeast. Knead the dough for ten minutes, let "
    "it rise for an hour, shape it and bake it until the crust is brown.",
    "The river runs from the mountains to the sea. In spring it floods the fields, and in "
    "summer children swim in its quiet pools under the willow trees.",
]


@pytest.fixture(scope="module")
def model(default_artifact_path):
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.engine.runner import JaxRunner

    artifact = load_artifact(default_artifact_path, weights=True)
    runner = JaxRunner(artifact, num_pages=NUM_PAGES, page_size=PAGE,
                       max_batch=SPEC.row_capacity(LANES), max_chunk_rows=LANES,
                       max_context=CONTEXT, prefill_chunk=CHUNK, step_shapes="essential")
    runner.warmup()
    yield runner, artifact.load_tokenizer(), artifact.eos_ids
    assert runner.compiled_shapes == set(runner.step_shapes()), "a step compiled after warm-up"


def echo_prompt(tokenizer, index: int) -> list[int]:
    text = (f"<|im_start|>user\nRepeat this paragraph exactly: {PARAGRAPHS[index % 3]}"
            "<|im_end|>\n<|im_start|>assistant\n")
    return tokenizer.encode(text, special=True)


def generate(model, prompts, *, speculative: bool, sampling=GREEDY, max_tokens=40,
             stop_ids=frozenset(), lanes=LANES):
    """Every prompt submitted at once to a fresh scheduler; per request its Finished."""
    runner, _, eos_ids = model
    config = EngineConfig(max_concurrency=lanes, prefill_chunk=CHUNK, max_context=CONTEXT,
                          kv_capacity=(NUM_PAGES - 1) * PAGE, speculative=SPEC)
    scheduler = Scheduler(config, PagePool(NUM_PAGES), page_size=PAGE,
                          max_batch=runner.max_batch, eos_ids=eos_ids,
                          max_chunk_rows=runner.max_chunk_rows)
    loop = StepLoop(scheduler, runner)
    handles = []
    for index, ids in enumerate(prompts):
        request = GenerationRequest(f"r{index}", list(ids), sampling, max_tokens,
                                    stop_token_ids=frozenset(stop_ids),
                                    speculative=speculative)
        handles.append(RequestHandle(request))
        scheduler.add(handles[-1])
    while scheduler.has_work() or loop.in_flight:
        scheduler.apply_controls()
        loop.advance()
    results = []
    for handle in handles:
        events = []
        while (event := handle.next_event(timeout=0)) is not None:
            events.append(event)
        results.append(events[-1])
    return results, scheduler.counters


def ids(results):
    return [list(r.output_ids) for r in results]


def test_greedy_alone_equals_plain_decoding(model):
    prompt = echo_prompt(model[1], 0)
    plain, _ = generate(model, [prompt], speculative=False)
    spec, counters = generate(model, [prompt], speculative=True)
    assert ids(spec) == ids(plain)
    assert counters.spec_rounds > 0
    # An echo task: most drafts hold, so rounds commit several tokens.
    assert counters.spec_accepted_tokens >= counters.spec_draft_tokens / 2
    assert spec[0].counters["decode_rounds"] < len(spec[0].output_ids) / 2


def test_greedy_eight_concurrent_equal_plain_alone(model):
    prompts = [echo_prompt(model[1], i) for i in range(LANES)]
    plain = [generate(model, [p], speculative=False)[0][0] for p in prompts[:3]]
    spec, counters = generate(model, prompts, speculative=True)
    assert ids(spec) == (ids(plain) * 3)[:LANES]  # the prompts repeat with period 3
    assert counters.spec_rounds > 0


def test_seeded_sampling_equals_plain_sampling(model):
    prompts = [echo_prompt(model[1], i) for i in range(2)]
    for seed in (5, 123456789):
        sampling = SamplingParams(temperature=0.7, top_p=0.95, seed=seed)
        plain, _ = generate(model, prompts, speculative=False, sampling=sampling)
        spec, counters = generate(model, prompts, speculative=True, sampling=sampling)
        assert ids(spec) == ids(plain)
        assert counters.spec_accepted_tokens > 0


def test_end_token_and_max_tokens_inside_accepted_runs(model):
    prompt = echo_prompt(model[1], 1)
    plain, _ = generate(model, [prompt], speculative=False)
    reference = ids(plain)[0]
    stop = reference[12]
    spec, _ = generate(model, [prompt], speculative=True, stop_ids={stop})
    assert spec[0].reason == "stop"
    assert list(spec[0].output_ids) == reference[:reference.index(stop) + 1]
    for limit in (5, 6, 7, 8):
        spec, _ = generate(model, [prompt], speculative=True, max_tokens=limit)
        assert list(spec[0].output_ids) == reference[:limit]
        assert spec[0].reason == "length" and spec[0].usage.completion_tokens == limit
