"""JaxRunner steps that carry several sequences' chunks (StepPlan.more_chunks, run as chunk
segments): every sequence's greedy text equals transformers', rows read any chunk's sample
from the previous step on the device, seeded sampling is the same as alone, and the shapes
and limits are the runner's."""
from __future__ import annotations

import numpy as np
import pytest

from hf_reference import hf_greedy, saved_tiny_model
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec, StepPlan, chunk_slot
from runner_driver import generate

GREEDY = SamplingParams(temperature=0.0)
SEGMENT = 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return saved_tiny_model("llama", tmp_path_factory.mktemp("segments-llama"), seed=4)


@pytest.fixture(scope="module")
def runner(tiny):
    # essential shapes only (each compile costs the suite seconds): every step below pads
    # to one of them, the segment shape among them
    runner = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=4, max_context=128,
                       prefill_chunk=32, chunk_segments=3, segment_tokens=SEGMENT,
                       step_shapes="essential")
    runner.warmup()
    yield runner
    assert runner.compiled_shapes == set(runner.step_shapes()), "a step compiled after warm-up"


def _prompts():
    rng = np.random.default_rng(11)
    return {name: rng.integers(0, 96, n).tolist()
            for name, n in (("a", 10), ("b", 16), ("c", 23), ("d", 5))}


def _tables():
    return {"a": np.arange(1, 4), "b": np.arange(4, 7), "c": np.arange(7, 11),
            "d": np.arange(11, 13)}


def _unit(seq, prompt, start, end, table, sampling=GREEDY, index=0):
    sample = SampleSpec(sampling, index) if end == len(prompt) else None
    return PrefillUnit(seq, np.asarray(prompt[start:end], np.int32), start,
                       np.asarray(table, np.int32), sample)


def test_segment_shapes_are_compiled(runner):
    assert runner.chunk_segments == 3 and runner.segment_tokens == SEGMENT
    segmented = [s for s in runner.essential_shapes() if len(s) == 3]
    assert segmented == [(3 * SEGMENT, runner.chunk_rows[-1], 3)]


def test_several_chunks_per_step_generate_transformers_text(tiny, runner):
    """Step 1: a's and b's whole prompts and c's first segment; step 2: c's rest and d's
    prompt beside a's and b's first rows (their tokens from step 1's chunk samples on the
    device); then rows only, the first rows of c and d reading step 2's chunk samples."""
    model, _ = tiny
    prompts, tables = _prompts(), _tables()
    ids = {"a": 0, "b": 1, "c": 2, "d": 3}
    a, b, c, d = (prompts[n] for n in "abcd")
    first = runner.launch(StepPlan(chunk=_unit(0, a, 0, 10, tables["a"]), more_chunks=(
        _unit(1, b, 0, 16, tables["b"]), _unit(2, c, 0, SEGMENT, tables["c"]))))

    def row(name, position, index, slot=None, token=0):
        return DecodeRow(ids[name], token, position, np.asarray(tables[name], np.int32),
                         SampleSpec(GREEDY, index), from_previous=slot)

    second = runner.launch(StepPlan(
        chunk=_unit(2, c, SEGMENT, 23, tables["c"]),
        more_chunks=(_unit(3, d, 0, 5, tables["d"]),),
        rows=(row("a", 10, 1, chunk_slot(0)), row("b", 16, 1, chunk_slot(1)))))
    third = runner.launch(StepPlan(chunk=None, rows=(
        row("a", 11, 2, 0), row("b", 17, 2, 1), row("c", 23, 1, chunk_slot(0)),
        row("d", 5, 1, chunk_slot(1)))))
    results = [runner.collect(h) for h in (first, second, third)]
    out = {"a": [results[0].chunk_token], "b": [results[0].more_chunk_tokens[0]]}
    assert results[0].more_chunk_tokens[1] is None  # c's first segment does not sample
    out["c"], out["d"] = [results[1].chunk_token], [results[1].more_chunk_tokens[0]]
    out["a"].append(int(results[1].row_tokens[0]))
    out["b"].append(int(results[1].row_tokens[1]))
    for name, token in zip("abcd", results[2].row_tokens):
        out[name].append(int(token))
    for name in "cd":  # one more token from the host, as a plain decode
        prompt = prompts[name]
        position = len(prompt) + len(out[name]) - 1
        out[name].append(int(runner.decode([row(name, position, len(out[name]),
                                                token=out[name][-1])])[0]))
    for name, tokens in out.items():
        assert tokens == hf_greedy(model, prompts[name], len(tokens)), name


def test_seeded_samples_equal_the_same_request_alone(runner):
    prompts, tables = _prompts(), _tables()
    seeded = [SamplingParams(temperature=1.0, top_p=0.9, seed=70 + i) for i in range(3)]
    together = runner.collect(runner.launch(StepPlan(
        chunk=_unit(0, prompts["a"], 0, 10, tables["a"], seeded[0]),
        more_chunks=(_unit(1, prompts["b"], 0, 16, tables["b"], seeded[1]),
                     _unit(3, prompts["d"], 0, 5, tables["d"], seeded[2])))))
    tokens = [together.chunk_token, *together.more_chunk_tokens]
    alone = [generate(runner, [prompts[n]], 1, seeded[i], first_page=20)[0][0]
             for i, n in enumerate("abd")]
    assert tokens == alone


def test_limits(runner):
    prompts, tables = _prompts(), _tables()
    too_long = _unit(2, prompts["c"], 0, 23, tables["c"])
    with pytest.raises(ValueError, match="over 16 tokens"):
        runner.launch(StepPlan(chunk=_unit(0, prompts["a"], 0, 10, tables["a"]),
                               more_chunks=(too_long,)))
    four = tuple(_unit(i, prompts["d"], 0, 5, tables["d"]) for i in range(3))
    with pytest.raises(ValueError, match="at most 3"):
        runner.launch(StepPlan(chunk=_unit(0, prompts["a"], 0, 10, tables["a"]),
                               more_chunks=four))


def test_every_chunk_row_bucket_gets_a_segment_shape(tiny):
    every = JaxRunner(tiny[1], num_pages=16, page_size=8, max_batch=4, max_context=64,
                      prefill_chunk=32, chunk_segments=3, segment_tokens=SEGMENT)
    segmented = [s for s in every.step_shapes() if len(s) == 3]
    assert segmented == [(3 * SEGMENT, rows, 3) for rows in every.chunk_rows]


def test_one_chunk_by_default_on_the_cpu(tiny):
    plain = JaxRunner(tiny[1], num_pages=16, page_size=8, max_batch=2, max_context=64,
                      prefill_chunk=16, background_compile=False, step_shapes="essential")
    assert plain.chunk_segments == 1
    assert all(len(shape) == 2 for shape in plain.step_shapes())
