"""Text generation through a StepRunner without the engine: a trivial page allocation (each
sequence gets its own contiguous block of pages, optionally shuffled), chunked prefill, then
batched decode until every sequence has its tokens."""
from __future__ import annotations

import math

import numpy as np

from ninfer_jax.engine.penalty_lanes import DUMMY_PENALTY_LANE, uses_output
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec

GREEDY = SamplingParams(temperature=0.0)


def generate(runner, prompts, max_new_tokens: int, sampling=GREEDY, *, chunk: int | None = None,
             shuffle_pages: bool = False, first_page: int = 1):
    """Output token lists for each prompt (a list of id lists), all decoded in one batch.
    `sampling` is one SamplingParams for all or a list with one per prompt; prompt i with
    penalties counts its output in penalty lane i + 1, which the steps keep."""
    per_prompt = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
    lanes = [i + 1 if uses_output(params) else DUMMY_PENALTY_LANE
             for i, params in enumerate(per_prompt)]
    for lane in lanes:
        if lane != DUMMY_PENALTY_LANE:
            runner.load_penalty_lane(lane, ())
    chunk = chunk or runner.chunk_buckets[-1]
    tables = _page_tables(runner, [len(p) + max_new_tokens for p in prompts], shuffle_pages,
                          first_page)
    outputs = []
    for prompt, table, params, lane in zip(prompts, tables, per_prompt, lanes):
        outputs.append([_prefill(runner, prompt, table, params, chunk, lane)])
    while any(len(out) < max_new_tokens for out in outputs):
        active = [i for i, out in enumerate(outputs) if len(out) < max_new_tokens]
        rows = []
        for i in active:
            position = len(prompts[i]) + len(outputs[i]) - 1
            spec = SampleSpec(per_prompt[i], len(outputs[i]), lanes[i])
            rows.append(DecodeRow(i, outputs[i][-1], position,
                                  tables[i][:position // runner.page_size + 1], spec))
        for i, token in zip(active, runner.decode(rows)):
            outputs[i].append(int(token))
    return outputs


def teacher_forced(runner, prompts, continuations, *, chunk: int | None = None):
    """Greedy predictions with the given continuations fed back instead of our own tokens:
    for each prompt, len(continuation) + 1 argmax tokens (after the prompt, then after each
    forced token). All rows stay in one batch to the end (finished rows keep decoding their
    last token, ignored) so a single decode batch bucket is used."""
    chunk = chunk or runner.chunk_buckets[-1]
    lengths = [len(p) + len(c) + 1 for p, c in zip(prompts, continuations)]
    tables = _page_tables(runner, lengths, False, 1)
    predictions = [[_prefill(runner, p, t, GREEDY, chunk)] for p, t in zip(prompts, tables)]
    for step in range(max(len(c) for c in continuations)):
        rows = []
        for i, (prompt, forced) in enumerate(zip(prompts, continuations)):
            k = min(step, len(forced) - 1)  # rows past their end repeat their last step
            position = len(prompt) + k
            rows.append(DecodeRow(i, forced[k], position,
                                  tables[i][:position // runner.page_size + 1],
                                  SampleSpec(GREEDY, k + 1)))
        for i, token in enumerate(runner.decode(rows)):
            if step < len(continuations[i]):
                predictions[i].append(int(token))
    return predictions


def _prefill(runner, prompt, table, params, chunk, lane=DUMMY_PENALTY_LANE) -> int:
    """Ingest the prompt in chunks; the last chunk samples the first output token."""
    token = None
    for start in range(0, len(prompt), chunk):
        piece = np.asarray(prompt[start:start + chunk], np.int32)
        is_last = start + len(piece) == len(prompt)
        covered = table[:math.ceil((start + len(piece)) / runner.page_size)]
        sample = SampleSpec(params, 0, lane) if is_last else None
        token = runner.prefill(PrefillUnit(0, piece, start, covered, sample))
    return token


def _page_tables(runner, lengths, shuffle, first_page):
    """Disjoint page lists covering each length; shuffled pages make tables non-contiguous."""
    needed = [math.ceil(n / runner.page_size) for n in lengths]
    pages = np.arange(first_page, first_page + sum(needed), dtype=np.int32)
    if pages[-1] >= runner.num_pages:
        raise ValueError("the pool is too small for these sequences")
    if shuffle:
        pages = np.random.default_rng(0).permutation(pages)
    return np.split(pages, np.cumsum(needed)[:-1])
