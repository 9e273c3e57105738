"""benchmarks/trace_summary.py's source attribution: the kernels of a profile are named after
HLO instructions, and the optimized HLO text says which lines of code each one (and, for a
fusion, each instruction it fused) came from; JaxRunner.step_hlo hands the benches that text
for the step that ran."""
from __future__ import annotations

import dataclasses
import inspect
import types

import jax
import jax.numpy as jnp
import numpy as np

import runner_bench
import trace_summary
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.engine.runner import JaxRunner


def _scaled_sine(x, y):
    a = jnp.sin(x) * y + 1.0
    return jnp.sum(a * a, axis=-1)


def test_a_fusion_is_attributed_to_the_lines_it_fused():
    x = jnp.ones((64, 64))
    text = jax.jit(_scaled_sine).lower(x, x).compile().as_text()
    sources = trace_summary.hlo_sources(text)
    first = inspect.getsourcelines(_scaled_sine)[1]
    lines = {f"test_trace_summary.py:{first + n} (_scaled_sine)" for n in (1, 2)}
    found = {s for sources_of in sources.values() for s in sources_of}
    assert {s.split(" @ ")[1] for s in found} == lines, found  # both lines, nothing else
    assert f"sin @ test_trace_summary.py:{first + 1} (_scaled_sine)" in found
    # a fusion lists the instructions it fused, from both lines here
    assert any(len({s.split(" @ ")[1] for s in sources_of}) == 2
               for sources_of in sources.values()), sources
    assert all("." not in name for name in sources)  # named as a GPU trace names kernels
    assert all(len(found) <= trace_summary.MAX_SOURCES for found in sources.values())


def test_a_bench_gets_no_sources_rather_than_an_error(monkeypatch, capsys):
    assert trace_summary.sources_or_none(None) == {}

    def broken(text):
        raise ValueError("unparsable")

    monkeypatch.setattr(trace_summary, "hlo_sources", broken)
    assert trace_summary.sources_or_none("HloModule m") == {}
    assert "no sources" in capsys.readouterr().err


def test_annotate_adds_the_sources_of_the_kernels_it_knows():
    summary = {"top": [{"name": "loop_add_fusion_1", "ms_per_step": 0.1},
                       {"name": "ninfer_moe_expert_gemv", "ms_per_step": 0.5}]}
    annotated = trace_summary.annotate(summary, {"loop_add_fusion_1": ["add @ a.py:3 (f)"]})
    assert annotated["top"][0]["source"] == ["add @ a.py:3 (f)"]
    assert "source" not in annotated["top"][1]


def test_a_runners_decode_step_hlo_points_into_the_model_code():
    config = dataclasses.replace(PRESETS["qwen3-tiny"].config, vocab_size=256)
    params = jax.tree_util.tree_map(np.asarray, random_params(config, seed=1, dtype="f32"))
    runner = JaxRunner(types.SimpleNamespace(config=config, params=params), num_pages=8,
                       page_size=8, max_batch=2, max_context=32, prefill_chunk=16,
                       background_compile=False, step_shapes="essential")
    assert runner_bench.decode_hlo(runner, 1) is None  # nothing compiled yet
    runner.compile_shapes([(0, 1)])
    text = runner_bench.decode_hlo(runner, 1)
    assert text.startswith("HloModule")
    found = [s for sources in trace_summary.hlo_sources(text).values() for s in sources]
    assert any("ninfer_jax/model/" in s for s in found), found[:20]
    assert runner.step_hlo((0, 1), "greedy") is None  # the CPU compiles no greedy variant
