"""JaxRunner on a tiny random llama: greedy text equals transformers' greedy text, batching and
padding never change a row's tokens, seeded sampling is batch-invariant, buckets are honoured."""
from __future__ import annotations

import types

import numpy as np
import pytest

from hf_reference import load_params, model_config_from_hf, reference_logits, tiny_hf_model
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner import (JaxRunner, bucket_plan, decode_batch_buckets, fit_bucket,
                                      geometric_buckets, kv_dtype_for)
from ninfer_jax.engine.runner_api import PrefillUnit
from runner_driver import generate

NUM_NEW = 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = tiny_hf_model("llama", seed=3)
    checkpoint = tmp_path_factory.mktemp("runner-llama")
    model.save_pretrained(checkpoint)
    config = model_config_from_hf(model.config)
    return model, types.SimpleNamespace(config=config, params=load_params(checkpoint, config))


@pytest.fixture(scope="module")
def runner(tiny):
    """Warmed up once: every later step must reuse one of its compiled shapes. It buckets
    page-table widths as for the GPU kernels, so rows also move between widths here."""
    runner = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=8, max_context=128,
                       prefill_chunk=32, attention_follows_lengths=False)
    runner.warmup()
    yield runner
    assert runner.compiled_shapes == set(runner.step_shapes()), "a step compiled after warm-up"


def prompts(count, seed=5):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 96, int(n)).tolist() for n in rng.integers(3, 45, count)]


def hf_greedy(model, prompt, num_new):
    tokens = list(prompt)
    for _ in range(num_new):
        tokens.append(int(reference_logits(model, tokens)[-1].argmax()))
    return tokens[len(prompt):]


def test_greedy_generation_matches_transformers(tiny, runner):
    model, _ = tiny
    prompt = prompts(1, seed=9)[0] + prompts(1, seed=10)[0]  # long enough for several chunks
    ours = generate(runner, [prompt], NUM_NEW, chunk=16, shuffle_pages=True)[0]
    assert ours == hf_greedy(model, prompt, NUM_NEW)


def test_batched_greedy_rows_equal_the_same_rows_alone(runner):
    batch = prompts(5)
    together = generate(runner, batch, NUM_NEW, shuffle_pages=True)
    alone = [generate(runner, [p], NUM_NEW, first_page=40)[0] for p in batch]
    assert together == alone


def test_seeded_sampling_is_the_same_alone_and_batched(runner):
    batch = prompts(6, seed=7)
    mixed = [SamplingParams(temperature=1.0, top_p=0.9, seed=1000 + i) for i in range(6)]
    together = generate(runner, batch, NUM_NEW, mixed)
    alone = generate(runner, batch[2:3], NUM_NEW, mixed[2], first_page=40)[0]
    assert together[2] == alone
    reseeded = generate(runner, batch[2:3], NUM_NEW, SamplingParams(temperature=1.0, top_p=0.9,
                                                                    seed=1), first_page=40)[0]
    assert reseeded != alone


def test_frequency_penalty_suppresses_repeats(runner):
    prompt = prompts(1, seed=11)
    plain = generate(runner, prompt, 24)[0]
    assert len(set(plain)) < len(plain)  # the tiny model repeats itself when greedy
    penalized = generate(runner, prompt, 24, SamplingParams(temperature=0.0,
                                                            frequency_penalty=50.0))[0]
    assert len(set(penalized)) == len(penalized)


def test_prefill_without_sample_returns_none_and_oversized_units_are_refused(runner):
    tokens = np.arange(10, dtype=np.int32)
    table = np.array([5, 6], np.int32)
    assert runner.prefill(PrefillUnit(0, tokens, 0, table, None)) is None
    with pytest.raises(ValueError, match="prefill chunk"):
        runner.prefill(PrefillUnit(0, np.zeros(40, np.int32), 0, np.arange(1, 6), None))
    with pytest.raises(ValueError, match="does not cover"):
        runner.prefill(PrefillUnit(0, tokens, 0, table[:1], None))


def test_buckets():
    assert geometric_buckets(16, 1024, 4) == (16, 64, 256, 1024)
    assert geometric_buckets(16, 100, 4) == (16, 64, 100)
    assert geometric_buckets(8, 4, 4) == (4,)
    assert fit_bucket((1, 2, 4, 8), 3, "batch") == 4
    with pytest.raises(ValueError):
        fit_bucket((1, 2), 3, "batch")


def test_decode_batch_buckets_can_start_at_two_rows():
    assert decode_batch_buckets(8, 1) == (1, 2, 4, 8)
    assert decode_batch_buckets(8, 2) == (2, 4, 8)
    assert decode_batch_buckets(1, 1) == (1,)
    assert decode_batch_buckets(6, 2) == (2, 4, 6)


def test_a_lone_row_padded_to_two_decodes_the_same_tokens(tiny, runner):
    """The GPU's two-row minimum: one real row plus a padding row (dummy page only)."""
    two_row = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=2, max_context=128,
                        prefill_chunk=32, min_decode_batch=2)
    assert two_row.batch_buckets == (2,)
    prompt = prompts(1, seed=11)[0]
    assert generate(two_row, [prompt], NUM_NEW) == generate(runner, [prompt], NUM_NEW)


def test_bf16_kv_pages_on_cpu_keep_the_greedy_tokens(tiny, runner):
    """--kv-dtype bf16: the pool stores bf16 pages (half the bytes), compute stays f32."""
    import jax.numpy as jnp

    assert kv_dtype_for("auto") == jnp.float32 and kv_dtype_for("bf16") == jnp.bfloat16
    with pytest.raises(ValueError, match="fp8"):
        kv_dtype_for("fp8")
    half = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=2, max_context=128,
                     prefill_chunk=32, kv_dtype=kv_dtype_for("bf16"))
    assert {cache.dtype for layer in half.kv for cache in layer} == {jnp.dtype(jnp.bfloat16)}
    assert half.params["embed"].dtype == jnp.float32
    batch = prompts(2, seed=12)
    assert generate(half, batch, NUM_NEW) == generate(runner, batch, NUM_NEW)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_weights_expanded_at_load_decode_the_same_tokens(tiny, fmt):
    """Off the GPU a quantized artifact's leaves are dequantized once at load; the products
    must be exactly those of the per-step reference dequantization."""
    import copy

    from ninfer_jax.artifact.convert_common import quantize_projections

    params = quantize_projections(copy.deepcopy(tiny[1].params), fmt)
    artifact = types.SimpleNamespace(config=tiny[1].config, params=params)
    common = dict(num_pages=64, page_size=8, max_batch=2, max_context=128, prefill_chunk=32)
    expanded = JaxRunner(artifact, **common)
    per_step = JaxRunner(artifact, **common, expand_quantized=False)
    assert not any(isinstance(leaf, dict) for leaf in expanded.params["layers"][0].values())
    assert isinstance(per_step.params["layers"][0]["wq"], dict)
    batch = prompts(2, seed=13)
    assert generate(expanded, batch, NUM_NEW) == generate(per_step, batch, NUM_NEW)


def test_bucket_plan_gives_the_references_one_width_and_finer_chunks():
    assert bucket_plan(64, 64, width_growth=4, attention_follows_lengths=True) == (
        (16, 32, 64), (64,))
    assert bucket_plan(64, 64, width_growth=4, attention_follows_lengths=False) == (
        (16, 64), (8, 32, 64))
    assert bucket_plan(1024, 256, width_growth=2, attention_follows_lengths=False)[1] == (
        8, 16, 32, 64, 128, 256)


def test_warmup_compiles_exactly_the_step_shapes(runner):
    expected = {("decode", b, w) for b in (1, 2, 4, 8) for w in (8, 16)}
    expected |= {("prefill", c, w) for c in (16, 32) for w in (8, 16)}
    assert set(runner.step_shapes()) == expected
    assert runner.compiled_shapes == expected
    # 100 positions ingested in chunks of 32 (both chunk buckets, the wide table), batch 3 -> 4.
    generate(runner, [list(range(70)), list(range(5)), list(range(9))], 30)
    assert runner.compiled_shapes == expected
