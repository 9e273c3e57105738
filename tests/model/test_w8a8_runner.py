"""W8A8 on a tiny random llama with int8 / fp8 projections: with NINFER_W8A8=1 the runner stores
the codes as [N, K] at load and every product quantizes its activations per token; the logits
of a prefill and of greedy decode steps stay close to the weight-only products' (switch off)
(WEIGHT_ERROR_FACTOR says how close)."""
from __future__ import annotations

import copy
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hf_reference import saved_tiny_model
from ninfer_jax.artifact.convert_common import quantize_projections
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.kernels import quant_matmul
from ninfer_jax.model import llama

PAGE_SIZE = 8
CHUNK = 32
NUM_STEPS = 4
# The yardstick is the model's own sensitivity: how far the weight-only products' logits are
# from the dense model's (the weights' rounding alone). Rounding the activations to the same
# 8-bit grid moves the logits by the same order: fp8 rounds both to the same relative
# precision; an int8 activation row (heavy-tailed after the MLP's gating, max|x| / rms ~ 4-5)
# has up to ~2-3x coarser steps, relative to its rms, than a Gaussian weight column (~2.3).
WEIGHT_ERROR_FACTOR = 3.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return saved_tiny_model("llama", tmp_path_factory.mktemp("w8a8-llama"), seed=3)[1]


def make_runner(tiny, fmt=None):
    params = copy.deepcopy(tiny.params)
    params = quantize_projections(params, fmt) if fmt else params
    artifact = types.SimpleNamespace(config=tiny.config, params=params)
    return JaxRunner(artifact, num_pages=32, page_size=PAGE_SIZE, max_batch=2, max_context=128,
                     prefill_chunk=CHUNK, expand_quantized=False)


def greedy_logits(runner, prompt, forced=None):
    """f32 logits after a one-chunk prefill of `prompt` and after each of NUM_STEPS one-row
    decode steps, which feed back their own argmax or the tokens `forced`; and those tokens."""
    prefill = jax.jit(functools.partial(llama.prefill, config=runner.config,
                                        page_size=PAGE_SIZE))
    decode = jax.jit(functools.partial(llama.decode, config=runner.config, page_size=PAGE_SIZE))
    tokens = np.zeros(CHUNK, np.int32)
    tokens[:len(prompt)] = prompt
    table = jnp.arange(1, 1 + 128 // PAGE_SIZE, dtype=jnp.int32)
    logits, kv = prefill(runner.params, runner.kv, jnp.asarray(tokens), jnp.int32(0),
                         jnp.int32(len(prompt)), table)
    out, fed = [np.asarray(logits)], []
    for step in range(NUM_STEPS):
        fed.append(int(forced[step]) if forced else int(np.argmax(out[-1])))
        logits, kv = decode(runner.params, kv, jnp.asarray([fed[-1]], jnp.int32),
                            jnp.asarray([len(prompt) + step], jnp.int32), table[None])
        out.append(np.asarray(logits[0]))
    return out, fed


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("switch", ["1", "2"])
def test_w8a8_logits_stay_close_to_weight_only(tiny, fmt, switch, monkeypatch):
    """NINFER_W8A8=1: every product, the codes [N, K]; =2: products of 2+ rows (the prefill
    chunk) on the stored [K, N] codes, the one-row decode steps weight-only."""
    prompt = np.random.default_rng(14).integers(0, 96, 19).tolist()
    monkeypatch.delenv(quant_matmul.W8A8_ENV, raising=False)
    off = make_runner(tiny, fmt)
    assert set(off.params["layers"][0]["wqkv"]) == {fmt, "scale"}
    off_logits, tokens = greedy_logits(off, prompt)
    dense_logits, _ = greedy_logits(make_runner(tiny), prompt, forced=tokens)

    monkeypatch.setenv(quant_matmul.W8A8_ENV, switch)
    on = make_runner(tiny, fmt)
    wqkv = on.params["layers"][0]["wqkv"]
    K, N = off.params["layers"][0]["wqkv"][fmt].shape
    if switch == "1":
        assert set(wqkv) == {f"{fmt}_nk", "scale"} and wqkv[f"{fmt}_nk"].shape == (N, K)
    else:
        assert set(wqkv) == {fmt, "scale"} and wqkv[fmt].shape == (K, N)
    on_logits, _ = greedy_logits(on, prompt, forced=tokens)
    for step, (on_step, off_step, dense) in enumerate(zip(on_logits, off_logits, dense_logits)):
        error = np.linalg.norm(on_step - off_step) / np.linalg.norm(off_step)
        weight_error = np.linalg.norm(off_step - dense) / np.linalg.norm(dense)
        assert 0 < error < WEIGHT_ERROR_FACTOR * weight_error, (step, error, weight_error)
