"""JaxRunner on a tiny random llama: greedy text equals transformers' greedy text, batching and
padding never change a row's tokens, seeded sampling is batch-invariant, buckets are honoured."""
from __future__ import annotations

import types

import threading

import numpy as np
import pytest

from hf_reference import hf_greedy, saved_tiny_model
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner import (JaxRunner, chunk_buckets, chunk_row_buckets, fit_bucket,
                                      geometric_buckets, kv_dtype_for, row_buckets)
from ninfer_jax.engine.runner_api import CHUNK_SLOT, DecodeRow, PrefillUnit, SampleSpec, StepPlan
from runner_driver import generate

NUM_NEW = 12
# The `runner` fixture's sizes. A runner built with them and the same params traces to the
# same programs, so its steps come from JAX's in-process cache of compiled executables
# (held for the module) instead of compiling again: each compile of a step costs seconds.
SIZES = dict(num_pages=64, page_size=8, max_batch=8, max_context=128, prefill_chunk=32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return saved_tiny_model("llama", tmp_path_factory.mktemp("runner-llama"), seed=3)


@pytest.fixture(scope="module")
def runner(tiny):
    """Warmed up once: every later step must reuse one of its compiled shapes."""
    runner = JaxRunner(tiny[1], **SIZES)
    runner.warmup()
    yield runner
    assert runner.compiled_shapes == set(runner.step_shapes()), "a step compiled after warm-up"


def prompts(count, seed=5):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 96, int(n)).tolist() for n in rng.integers(3, 45, count)]


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


def test_row_buckets_double_and_can_start_at_two_rows():
    assert row_buckets(8, 1) == (1, 2, 4, 8)
    assert row_buckets(8, 2) == (2, 4, 8)
    assert row_buckets(1, 1) == (1,)
    assert row_buckets(6, 2) == (2, 4, 6)
    assert row_buckets(256, 2) == (2, 4, 8, 16, 32, 64, 128, 256)


def test_chunk_steps_use_fewer_row_buckets():
    gpu_rows = row_buckets(256, 2)
    assert chunk_row_buckets(gpu_rows, growth=2) == (2, 8, 32, 128, 256)
    assert chunk_row_buckets(gpu_rows, growth=4) == (2, 32, 256)
    assert chunk_buckets(1024, growth=4, smallest=64) == (64, 256, 1024)
    assert chunk_row_buckets((1, 2, 4), growth=3) == (1, 4)
    assert chunk_buckets(1024, growth=4) == (16, 64, 256, 1024)
    assert chunk_buckets(64, growth=2) == (16, 32, 64)


def test_a_lone_row_padded_to_two_decodes_the_same_tokens(tiny, runner):
    """The GPU's two-row minimum: one real row plus a padding row (dummy page only)."""
    two_row = JaxRunner(tiny[1], **SIZES, min_rows=2)
    assert two_row.batch_buckets == (2, 4, 8)
    prompt = prompts(1, seed=11)[0]
    assert generate(two_row, [prompt], NUM_NEW) == generate(runner, [prompt], NUM_NEW)


def test_essential_step_shapes_pad_every_step_to_few_shapes_and_keep_the_tokens(tiny, runner):
    """step_shapes="essential" (--step-shapes essential): warm-up compiles only the smallest and
    largest decode steps and the largest chunk step; every step pads to one of them and the
    tokens are those of the runner with every shape."""
    few = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=8, max_context=128,
                    prefill_chunk=32, step_shapes="essential")
    few.warmup()
    assert few.compiled_shapes == set(few.essential_shapes()) == {(0, 1), (0, 8), (32, 8)}
    assert few.compile_progress() == (3, 3)
    batch = prompts(3, seed=13)
    assert generate(few, batch, NUM_NEW) == generate(runner, batch, NUM_NEW)
    assert few.compiled_shapes == set(few.essential_shapes()), "a step compiled after warm-up"
    with pytest.raises(ValueError, match="step_shapes"):
        JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=8, max_context=128,
                  prefill_chunk=32, step_shapes="some")


def test_bf16_kv_pages_on_cpu_keep_the_greedy_tokens(tiny, runner):
    """--kv-dtype bf16: the pool stores bf16 pages (half the bytes), compute stays f32."""
    import jax.numpy as jnp

    assert kv_dtype_for("auto") == jnp.float32 and kv_dtype_for("bf16") == jnp.bfloat16
    # GGUF block weights on the CPU: llama.cpp's f16 pages unless asked otherwise
    assert kv_dtype_for("auto", block_weights=True) == jnp.float16
    assert kv_dtype_for("f32", block_weights=True) == jnp.float32
    with pytest.raises(ValueError, match="int4"):
        kv_dtype_for("int4")
    half = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=2, max_context=128,
                     prefill_chunk=32, kv_dtype=kv_dtype_for("bf16"))
    assert {cache.dtype for layer in half.kv for cache in layer} == {jnp.dtype(jnp.bfloat16)}
    assert half.params["embed"].dtype == jnp.float32
    batch = prompts(2, seed=12)
    assert generate(half, batch, NUM_NEW) == generate(runner, batch, NUM_NEW)


@pytest.mark.parametrize("name", ["fp8", "int8"])
def test_8bit_kv_pages_hold_codes_and_scales_and_bound_the_logit_error(tiny, name):
    """--kv-dtype fp8 / int8: the pool holds 8-bit codes with a scale per token and kv head;
    the prompt's logits stay within a few percent of f32 pages (e4m3 keeps 3 mantissa bits,
    int8 7 bits over each vector's range), and decoding runs on them."""
    import jax.numpy as jnp

    from ninfer_jax.kernels.paged_attention import ScaledPages

    dtype = kv_dtype_for(name)
    narrow = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=2, max_context=128,
                       prefill_chunk=32, kv_dtype=dtype)
    caches = [cache for layer in narrow.kv for cache in layer]
    assert all(isinstance(c, ScaledPages) and c.codes.dtype == dtype for c in caches)
    assert all(c.scale.shape == c.codes.shape[:3] for c in caches)
    wide = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=2, max_context=128,
                     prefill_chunk=32)
    prompt = prompts(1, seed=14)[0]
    narrow_logits, wide_logits = (np.asarray(prefill_logits(r, prompt)) for r in (narrow, wide))
    error = np.linalg.norm(narrow_logits - wide_logits) / np.linalg.norm(wide_logits)
    assert 0 < error < 0.1
    tokens = generate(narrow, prompts(2, seed=12), NUM_NEW)
    assert all(len(row) == NUM_NEW and all(0 <= t < 96 for t in row) for row in tokens)


def prefill_logits(runner, prompt):
    """The f32 logits after `prompt`, prefilled in one chunk on pages 1.. of a copy of the
    runner's caches (the model's own prefill; the runner's state is left alone)."""
    import jax.numpy as jnp

    from ninfer_jax.model import llama

    tokens = np.zeros(64, np.int32)
    tokens[:len(prompt)] = prompt
    table = jnp.arange(1, 1 + 64 // 8, dtype=jnp.int32)
    logits, _ = llama.prefill(runner.params, runner.kv, jnp.asarray(tokens), jnp.int32(0),
                              jnp.int32(len(prompt)), table, config=runner.config, page_size=8)
    return logits


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_weights_expanded_at_load_decode_the_same_tokens(tiny, fmt):
    """Off the GPU a quantized artifact's leaves are dequantized once at load; the products
    must be exactly those of the per-step reference dequantization."""
    import copy

    from ninfer_jax.artifact.convert_common import quantize_projections

    params = quantize_projections(copy.deepcopy(tiny[1].params), fmt)
    artifact = types.SimpleNamespace(config=tiny[1].config, params=params)
    # (the runner's sizes: the expanded runner, dense again, reuses the runner's steps)
    expanded = JaxRunner(artifact, **SIZES)
    per_step = JaxRunner(artifact, **SIZES, expand_quantized=False)
    assert not any(isinstance(leaf, dict) for leaf in expanded.params["layers"][0].values())
    assert isinstance(per_step.params["layers"][0]["wqkv"], dict)  # int8, int4: fused
    batch = prompts(2, seed=13)
    assert generate(expanded, batch, NUM_NEW) == generate(per_step, batch, NUM_NEW)


def test_fused_and_separate_projections_decode_the_same_tokens(default_artifact_path):
    """On the embedded default model: the runner joins q|k|v and gate|up at load (by
    default) and generates what the separate products do."""
    from ninfer_jax.artifact import load_artifact

    artifact = load_artifact(default_artifact_path)
    common = dict(num_pages=32, page_size=16, max_batch=2, max_context=128, prefill_chunk=32)
    fused = JaxRunner(artifact, **common)
    separate = JaxRunner(artifact, **common, fuse_projections=False)
    assert {"wqkv", "w_gate_up"} <= set(fused.params["layers"][0])
    assert not {"wqkv", "w_gate_up"} & set(separate.params["layers"][0])
    batch = [list(range(100, 140)), list(range(2000, 2011))]
    assert generate(fused, batch, NUM_NEW) == generate(separate, batch, NUM_NEW)


def test_stored_executables_are_keyed_by_the_params_layout(tiny):
    """An executable compiled for separate projections is never loaded for fused ones."""
    common = dict(num_pages=64, page_size=8, max_batch=2, max_context=128, prefill_chunk=32)
    fused = JaxRunner(tiny[1], **common)._fingerprint()
    separate = JaxRunner(tiny[1], **common, fuse_projections=False)._fingerprint()
    assert fused["params"] != separate["params"]
    assert {k: v for k, v in fused.items() if k != "params"} == \
        {k: v for k, v in separate.items() if k != "params"}


def test_warmup_compiles_exactly_the_step_shapes(runner):
    expected = {(0, b) for b in (1, 2, 4, 8)} | {(c, b) for c in (16, 32) for b in (1, 2, 4, 8)}
    assert set(runner.step_shapes()) == expected
    assert runner.compiled_shapes == expected
    assert runner.compile_progress() == (len(expected), len(expected))
    # 100 positions ingested in chunks of 32, batch 3 -> 4.
    generate(runner, [list(range(70)), list(range(5)), list(range(9))], 30)
    assert runner.compiled_shapes == expected


def test_background_compile_serves_from_the_essential_shapes(tiny, runner):
    """Ready after the few shapes that hold any step; the rest compile in a thread, and a
    step meanwhile runs padded in the cheapest compiled shape, with the same tokens."""
    lazy = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=8, max_context=128,
                     prefill_chunk=32, background_compile=True, compile_threads=1)
    assert lazy.essential_shapes() == [(0, 1), (0, 8), (32, 8)]
    lazy.warmup()
    assert set(lazy.essential_shapes()) <= lazy.compiled_shapes
    chunk, rows = lazy._shape_for(5, 3)  # whatever has compiled by now, never a new compile
    assert (chunk, rows) in lazy.compiled_shapes and chunk >= 16 and rows >= 4
    batch = prompts(3, seed=14)
    assert generate(lazy, batch, NUM_NEW) == generate(runner, batch, NUM_NEW)
    assert lazy.compile_done.wait(600)
    assert lazy.compiled_shapes == set(lazy.step_shapes())


def test_a_background_compile_that_fails_once_is_retried_and_the_rest_compile(tiny):
    """A shape whose compile fails (run 47: XLA's autotuner found its red zones written)
    costs neither the shapes after it nor itself: the others compile, it is tried again."""
    lazy = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=8, max_context=128,
                     prefill_chunk=32, background_compile=True, compile_threads=1)
    unlucky = next(shape for shape in lazy.step_shapes()
                   if shape not in lazy.essential_shapes())
    compile_shape, tries = lazy._compile, []

    def flaky(shape, variant="draws"):
        if shape == unlucky:
            tries.append(variant)
            if len(tries) == 1:
                raise RuntimeError("NOT_FOUND: All configs failed during profiling")
        compile_shape(shape, variant)

    lazy._compile = flaky
    lazy.warmup()
    assert lazy.compile_done.wait(600)
    assert tries == ["draws", "draws"]
    assert lazy.compiled_shapes == set(lazy.step_shapes())


def test_a_mixed_step_equals_its_parts_and_rows_read_the_previous_output(tiny, runner):
    """One step with a chunk of sequence A and a decode row of sequence B gives the tokens
    the separate steps give; a row naming the previous step's output decodes the token that
    step sampled without the host seeing it."""
    greedy = SamplingParams(temperature=0.0)
    prompt_a, prompt_b = (p[:30] for p in prompts(2, seed=21))  # one chunk each
    table_a, table_b = np.arange(1, 9, dtype=np.int32), np.arange(20, 28, dtype=np.int32)

    def chunk_of(prompt, table):
        return PrefillUnit(0, np.asarray(prompt, np.int32), 0, table, SampleSpec(greedy, 0))

    alone_b = runner.prefill(chunk_of(prompt_b, table_b))
    second_b = runner.decode([DecodeRow(1, alone_b, len(prompt_b), table_b,
                                        SampleSpec(greedy, 1))])[0]
    alone_a = runner.prefill(chunk_of(prompt_a, table_a))
    # Again, B's prompt in one step, then A's chunk mixed with B's first decode row, which
    # takes its token from the previous step's chunk sample.
    first = runner.launch(StepPlan(chunk=chunk_of(prompt_b, table_b)))
    mixed = runner.launch(StepPlan(chunk=chunk_of(prompt_a, table_a), rows=(
        DecodeRow(1, 0, len(prompt_b), table_b, SampleSpec(greedy, 1),
                  from_previous=CHUNK_SLOT),)))
    assert runner.collect(first).chunk_token == alone_b
    result = runner.collect(mixed)
    assert result.chunk_token == alone_a and result.row_tokens.tolist() == [second_b]


def test_a_restart_loads_stored_executables_without_tracing(tiny, runner, tmp_path,
                                                            monkeypatch):
    """With a cache directory the compiled steps are stored; a second runner for the same
    model and shapes loads them (no tracing at all) and decodes the same tokens. Another
    configuration never picks them up."""
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    # The store is off on CPU by default (its executables do not run in another process);
    # within one process, as here, they do.
    common = dict(SIZES, store_executables=True, step_shapes="essential")
    first = JaxRunner(tiny[1], **common)
    first.warmup()
    stored = list((tmp_path / "ninfer-executables").glob("*.exe"))
    assert len(stored) == len(first.step_shapes())

    class NoTracing:
        def lower(self, *args, **kwargs):
            raise AssertionError("a stored executable was traced again")

    second = JaxRunner(tiny[1], **common)
    second._jitted = NoTracing()
    second.warmup()
    batch = prompts(2, seed=15)
    assert generate(second, batch, NUM_NEW) == generate(runner, batch, NUM_NEW)
    other = JaxRunner(tiny[1], **dict(common, max_context=64))
    other._jitted = NoTracing()
    with pytest.raises(AssertionError, match="traced again"):
        other.warmup()


def test_the_host_tiers_copy_shapes_compile_off_the_engine_thread(tiny):
    """With the engine's host tier on, every save / load run length compiles on a thread of
    its own and runs once in prime_one (the engine idle), counted in compile_progress until
    it has; the thread calling prime_one compiles nothing (run 44: 27-31 s of compiles
    there on the GPU), and after that a spill of any length compiles nothing inside a launch
    (run 41: a 32-page save compiled for 0.39 s there, every stream waiting)."""
    from ninfer_jax.engine import page_store
    from ninfer_jax.engine.host_pages import SAVE, PageCopy
    from ninfer_jax.engine.compile_clock import COMPILE_CLOCK

    COMPILE_CLOCK.install()
    warmed = JaxRunner(tiny[1], num_pages=300, page_size=8, max_batch=2, max_context=128,
                       prefill_chunk=32, step_shapes="essential")
    warmed.use_host_tier()
    warmed.warmup()
    ready, planned = warmed.compile_progress()
    sizes = warmed._page_store.run_sizes
    assert sizes == page_store.RUN_SIZES[:2]  # the CPU's: runs of at most 32 pages
    assert planned - ready == len(sizes) - 1  # warm-up compiled the smallest
    assert warmed.copies_compiled.wait(300)
    before = COMPILE_CLOCK.here()
    primed = 0
    while warmed.prime_one():
        primed += 1
    assert primed == len(sizes) - 1
    assert COMPILE_CLOCK.here() == before
    assert warmed.compile_progress() == (planned, planned)
    before = COMPILE_CLOCK.here()
    for length in (1, 20, 40, 100, 200):  # runs of 16 and 32 pages (32 + 8, ...)
        copies = tuple(PageCopy(SAVE, 1 + i, length * 1000 + i) for i in range(length))
        warmed.kv = warmed._page_store.apply(warmed.kv, copies)
    assert COMPILE_CLOCK.here() == before


def test_the_pinned_reservation_runs_beside_warm_up(tiny, monkeypatch):
    """On a GPU the host tier's pinned memory (seconds: run 45 took 4.4 s for 8 GiB) is taken
    on a thread of its own while warm-up compiles; the runner is warm only once it is done,
    so no save grows XLA's pinned pool on the engine thread."""
    from ninfer_jax.engine.page_store import HostPageStore

    calls = []
    release = threading.Event()

    def reserve(store, nbytes):
        calls.append((threading.current_thread().name, nbytes))
        assert release.wait(60)
        return 0.5

    waiting = threading.Event()  # warm-up reached the wait with a reservation running
    wait_pinned = JaxRunner._wait_pinned

    def wait(runner):
        if runner._pinning is not None:
            waiting.set()
        wait_pinned(runner)

    monkeypatch.setattr(HostPageStore, "pins_host", property(lambda store: True))
    monkeypatch.setattr(HostPageStore, "reserve_pinned", reserve)
    monkeypatch.setattr(JaxRunner, "_wait_pinned", wait)
    runner = JaxRunner(tiny[1], **SIZES, background_compile=False, step_shapes="essential")
    runner.use_host_tier(10)  # returns at once: the reservation waits on `release`
    assert calls == [("ninfer-pin", 10 * runner.page_bytes)]
    warming = threading.Thread(target=runner.warmup)
    warming.start()
    assert waiting.wait(300)
    warming.join(0.5)
    assert warming.is_alive() and not runner.is_warm  # compiled, waiting for the memory
    release.set()
    warming.join(300)
    assert runner.is_warm


def test_all_greedy_steps_use_the_variant_without_draws(tiny, runner):
    """With greedy variants (the GPU's default) every decode-only shape compiles twice; a step
    whose rows are all greedy runs the variant without the draws, any sampled row the full
    one, and the tokens are those of a runner without variants."""
    every = JaxRunner(tiny[1], **SIZES, greedy_variants=True)  # (not compiled)
    assert every.greedy_shapes() == [(0, b) for b in every.row_buckets]
    # Compiled: the essential shapes (their draws variants are the runner's), whose two
    # decode-only shapes get greedy variants.
    variants = JaxRunner(tiny[1], **SIZES, greedy_variants=True, step_shapes="essential")
    assert variants.greedy_shapes() == [(0, 1), (0, 8)]
    variants.warmup()
    assert variants.compile_done.wait(600)
    num_shapes = len(variants.step_shapes()) + len(variants.greedy_shapes())
    # What compiled after warm-up runs once on padding when the engine is idle, then no more;
    # until then it does not count as ready (the step shapes all ran in warm-up here).
    assert variants.compile_progress() == (len(variants.step_shapes()), num_shapes)
    primed = 0
    while variants.prime_one():
        primed += 1
    assert primed == len(variants.greedy_shapes())
    assert variants.compile_progress() == (num_shapes, num_shapes)
    used = []
    for shape, executable in list(variants._greedy_executables.items()):
        def recording(*args, _shape=shape, _executable=executable):
            used.append(_shape)
            return _executable(*args)
        variants._greedy_executables[shape] = recording
    batch = prompts(3, seed=16)
    assert generate(variants, batch, NUM_NEW) == generate(runner, batch, NUM_NEW)
    assert used and all(chunk == 0 for chunk, _ in used)
    used.clear()
    seeded = SamplingParams(temperature=0.8, seed=5)
    assert generate(variants, batch, NUM_NEW, sampling=seeded) == \
        generate(runner, batch, NUM_NEW, sampling=seeded)
    assert not used, "a step with a sampled row ran without draws"
    # A decode shape pinned outside the plan (a benchmark's) gets its greedy variant too.
    variants.compile_shapes([(0, 2)])
    assert (0, 2) in variants._greedy_executables and (0, 2) not in variants.greedy_shapes()


def test_no_executable_store_on_cpu_by_default(tiny, tmp_path, monkeypatch):
    """A CPU executable deserialised in a new process fails to run, so the CPU keeps none."""
    import jax

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    cpu = JaxRunner(tiny[1], **SIZES)
    cpu.compile_shapes([(0, 1)])
    assert jax.default_backend() != "cpu" or not (tmp_path / "ninfer-executables").exists()


def _pipelined(runner, prompt, num_new, params):
    """Greedy/sampled tokens with every step launched before the previous one is collected,
    each row fed the previous step's token on the device (as the engine's step loop runs)."""
    table = np.arange(1, 1 + -(-(len(prompt) + num_new) // runner.page_size), dtype=np.int32)
    first = runner.prefill(PrefillUnit(0, np.asarray(prompt, np.int32), 0,
                                       table, SampleSpec(params, 0)))
    tokens, position = [first], len(prompt)
    in_flight = runner.launch(StepPlan(chunk=None, rows=(
        DecodeRow(0, first, position, table, SampleSpec(params, 1)),)))
    for index in range(2, num_new):
        position += 1
        launched = runner.launch(StepPlan(chunk=None, rows=(
            DecodeRow(0, 0, position, table, SampleSpec(params, index), from_previous=0),)))
        tokens.append(int(runner.collect(in_flight).row_tokens[0]))
        in_flight = launched
    tokens.append(int(runner.collect(in_flight).row_tokens[0]))
    return tokens


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0),
                                    SamplingParams(temperature=0.8, seed=11)])
def test_stable_buffers_keep_addresses_and_tokens(tiny, runner, params):
    """The GPU's stable-buffer launch (staging buffers donated back to themselves, prev_out
    donated, the host reading a copy): pipelined decoding gives the tokens of the plain
    launch, and the step's inputs and prev_out keep their device addresses across launches
    (what keeps XLA from updating its CUDA graph at every launch)."""
    stable = JaxRunner(tiny[1], num_pages=64, page_size=8, max_batch=1, max_context=128,
                       prefill_chunk=32, stable_buffers=True, step_shapes="essential")
    stable.warmup()
    prompt = prompts(1, seed=21)[0]
    assert _pipelined(stable, prompt, NUM_NEW, params) == \
        _pipelined(runner, prompt, NUM_NEW, params)

    def addresses():
        return ({shape: tuple(a.unsafe_buffer_pointer() for a in arrays)
                 for shape, arrays in stable._staging.items()},
                stable._prev_out.unsafe_buffer_pointer())
    before = addresses()
    assert _pipelined(stable, prompt, 4, params) == _pipelined(runner, prompt, 4, params)
    assert addresses() == before
