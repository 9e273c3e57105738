"""On the GPU (the cuDNN batched prefill of kernels/ragged_attention): a step that carries
three prompts' chunks as segments leaves the same K/V in every sequence's pages, and samples
the same greedy tokens, as the same chunks run one per step. Skipped off the GPU (the CPU
runs segments through the reference and the C++ rows: tests/model/test_runner_chunk_segments.py
checks those against transformers)."""
from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.engine.runner_api import PrefillUnit, SampleSpec, StepPlan
from ninfer_jax.model.config import ModelConfig

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")]
PAGE = 16
GREEDY = SampleSpec(SamplingParams(temperature=0.0), 0)


def _runner(config, params, segments):
    artifact = types.SimpleNamespace(config=config, params=params)
    return JaxRunner(artifact, num_pages=64, page_size=PAGE, max_batch=8, max_context=512,
                     prefill_chunk=256, chunk_segments=segments, segment_tokens=64,
                     background_compile=False, step_shapes="essential")


def _pages(runner, table):
    k, v = runner.kv[-1]  # the last layer: its K/V follow every attention before it
    return np.asarray(k[np.asarray(table)], np.float32), np.asarray(v[np.asarray(table)],
                                                                   np.float32)


def test_segments_equal_one_chunk_per_step():
    # head dim 128, as cuDNN's flash attention takes it (a tiny preset's 16 falls back)
    config = ModelConfig(architecture="qwen3", vocab_size=512, hidden_size=256,
                         intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                         head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                         tie_word_embeddings=True, qk_norm=True, max_position_embeddings=4096)
    params = random_params(config, seed=5, dtype="bf16")
    rng = np.random.default_rng(2)
    # (prompt length, start of this chunk): a fresh prompt, one after a cached prefix of 40
    # tokens (written first by both runners), a full segment
    prompts = [rng.integers(0, config.vocab_size, n).astype(np.int32) for n in (37, 90, 64)]
    tables = [np.arange(1 + 8 * i, 1 + 8 * i + 8, dtype=np.int32) for i in range(3)]
    starts = [0, 40, 0]
    results = {}
    for segments in (1, 3):
        runner = _runner(config, params, segments)
        runner.warmup()
        runner.prefill(PrefillUnit(1, prompts[1][:40], 0, tables[1], None))
        units = [PrefillUnit(i, prompts[i][starts[i]:], starts[i], tables[i], GREEDY)
                 for i in range(3)]
        if segments == 1:
            tokens = [runner.prefill(unit) for unit in units]
        else:
            result = runner.collect(runner.launch(StepPlan(chunk=units[0],
                                                           more_chunks=tuple(units[1:]))))
            tokens = [result.chunk_token, *result.more_chunk_tokens]
        results[segments] = (tokens, [_pages(runner, table) for table in tables])
    (one, one_pages), (three, three_pages) = results[1], results[3]
    assert one == three
    for (k1, v1), (k3, v3), prompt in zip(one_pages, three_pages, prompts):
        n = len(prompt)  # rows past n: unused
        k1, v1 = k1.transpose(0, 2, 1, 3), v1.transpose(0, 2, 1, 3)
        k3, v3 = k3.transpose(0, 2, 1, 3), v3.transpose(0, 2, 1, 3)
        flat = lambda a: a.reshape(-1, *a.shape[2:])[:n]  # noqa: E731
        np.testing.assert_allclose(flat(k3), flat(k1), atol=2e-2, rtol=2e-2)
        np.testing.assert_allclose(flat(v3), flat(v1), atol=2e-2, rtol=2e-2)
