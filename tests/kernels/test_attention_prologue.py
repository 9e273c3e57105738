"""The attention prologue (kernels/attention_prologue): the Pallas kernel against its jnp twin
in interpret mode (bfloat16 and float32 rows, with and without QK-norm, slots across pages
and one past the pool that must write nothing; the hybrid family's gated q heads,
zero-centred norms and partial RoPE), the twin against the models' own norms, RoPE and
write_kv, the CUDA lowering at the 8B and 35B-A3B shapes, natively on the GPU (`-m gpu`),
the cases it leaves to the model, the switch, and the tiny Qwen3, Llama and Qwen3.6-MoE
models' logits and caches with the kernel forced on (interpret mode) against it off."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_testkit import (assert_gpu_switch, cpu_only, interpret_calls, lowers_for_cuda,
                            needs_gpu)

from ninfer_jax.kernels import attention_prologue, paged_attention
from ninfer_jax.kernels.attention_prologue import kernel, reference
from ninfer_jax.model import layers


def inputs(rng, *, tokens, heads, kv_heads, dim, pages, page_size, dtype, normed,
           cache_dtype=jnp.bfloat16, gated=False, rotary=None):
    q_width = 2 if gated else 1
    qkv = jnp.asarray(rng.standard_normal((tokens, (q_width * heads + 2 * kv_heads) * dim)) * 2,
                      dtype)
    norms = ((jnp.asarray(rng.standard_normal(dim), jnp.float32),
              jnp.asarray(rng.standard_normal(dim), jnp.float32)) if normed else (None, None))
    angles = rng.uniform(0, 50, (tokens, (rotary or dim) // 2))
    cos, sin = jnp.asarray(np.cos(angles), jnp.float32), jnp.asarray(np.sin(angles), jnp.float32)
    # distinct slots over several pages; the last one past the pool (written nowhere)
    slots = rng.permutation(pages * page_size)[:tokens].astype(np.int32)
    slots[-1] = pages * page_size + 3
    shape = (pages, kv_heads, page_size, dim)
    caches = (jnp.asarray(rng.standard_normal(shape), cache_dtype),
              jnp.asarray(rng.standard_normal(shape), cache_dtype))
    return (qkv, *norms, cos, sin, jnp.asarray(slots), *caches)


def test_reference_is_the_models_norm_rope_and_write():
    rng = np.random.default_rng(0)
    H, K, D = 4, 2, 16
    qkv, qn, kn, cos, sin, slots, kc, vc = inputs(rng, tokens=3, heads=H, kv_heads=K, dim=D,
                                                  pages=4, page_size=4, dtype=jnp.float32,
                                                  normed=True, cache_dtype=jnp.float32)
    slots = slots.at[-1].set(5)  # in the pool here: the model's write_kv drops nothing
    q, kc2, vc2 = reference.attention_prologue(qkv, qn, kn, cos, sin, slots, kc, vc,
                                               num_heads=H, num_kv_heads=K, eps=1e-6)
    heads = qkv.reshape(3, H + 2 * K, D)
    want_q = layers.apply_rope(layers.rms_norm(heads[:, :H], qn, 1e-6), cos, sin)
    want_k = layers.apply_rope(layers.rms_norm(heads[:, H:H + K], kn, 1e-6), cos, sin)
    want_kc, want_vc = paged_attention.reference.write_kv(kc, vc, want_k, heads[:, H + K:],
                                                          slots)
    np.testing.assert_allclose(np.asarray(q), np.asarray(want_q), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(kc2), np.asarray(want_kc), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(vc2), np.asarray(want_vc))


def test_reference_drops_a_slot_past_the_pool():
    rng = np.random.default_rng(1)
    args = inputs(rng, tokens=2, heads=2, kv_heads=1, dim=8, pages=2, page_size=4,
                  dtype=jnp.float32, normed=False)
    _, kc, vc = reference.attention_prologue(*args, num_heads=2, num_kv_heads=1, eps=1e-6)
    first = int(args[5][0])
    page, offset = first // 4, first % 4
    changed = np.argwhere(np.any(np.asarray(kc != args[6]), axis=-1))
    assert [tuple(c) for c in changed] == [(page, 0, offset)]
    assert np.any(np.asarray(vc != args[7]))


@cpu_only
@pytest.mark.parametrize("heads,kv_heads,dim,dtype,normed",
                         [(4, 2, 64, jnp.float32, True), (4, 2, 64, jnp.bfloat16, True),
                          (4, 2, 64, jnp.bfloat16, False), (8, 8, 32, jnp.float32, False),
                          (6, 1, 128, jnp.bfloat16, True)])
def test_kernel_in_interpret_mode_matches_the_reference(heads, kv_heads, dim, dtype, normed):
    rng = np.random.default_rng(heads * dim + normed)
    args = inputs(rng, tokens=5, heads=heads, kv_heads=kv_heads, dim=dim, pages=6,
                  page_size=8, dtype=dtype, normed=normed)
    options = dict(num_heads=heads, num_kv_heads=kv_heads, eps=1e-6)
    got = jax.jit(functools.partial(kernel.attention_prologue, **options, interpret=True))(*args)
    want = reference.attention_prologue(*args, **options)
    assert got[0].shape == (5, heads, dim) and got[0].dtype == dtype
    np.testing.assert_allclose(np.asarray(got[0], np.float32), np.asarray(want[0], np.float32),
                               rtol=1e-5, atol=1e-5 if dtype == jnp.float32 else 2e-2)
    for a, b in zip(got[1:], want[1:]):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=1e-2, atol=2e-2)
    # only the written rows changed, and v is copied exactly
    np.testing.assert_array_equal(np.asarray(got[2], np.float32),
                                  np.asarray(want[2], np.float32))


@cpu_only
@pytest.mark.parametrize("dim,rotary,dtype", [(64, 16, jnp.float32), (256, 64, jnp.bfloat16),
                                              (32, 32, jnp.bfloat16)])
def test_kernel_in_the_hybrid_form_matches_the_reference(dim, rotary, dtype):
    """Qwen3.5 / 3.6 attention: each q head followed by its output gate's columns,
    zero-centred norms, RoPE on the first quarter of the head."""
    rng = np.random.default_rng(dim + rotary)
    args = inputs(rng, tokens=4, heads=4, kv_heads=2, dim=dim, pages=5, page_size=8,
                  dtype=dtype, normed=True, gated=True, rotary=rotary)
    options = dict(num_heads=4, num_kv_heads=2, eps=1e-6, zero_centred=True, gated=True)
    got = jax.jit(functools.partial(kernel.attention_prologue, **options, interpret=True))(*args)
    want = reference.attention_prologue(*args, **options)
    assert got[0].shape == (4, 4, dim)
    tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(got[0], np.float32), np.asarray(want[0], np.float32),
                               rtol=tolerance, atol=tolerance)
    for a, b in zip(got[1:], want[1:]):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=1e-2, atol=2e-2)


def test_reference_in_the_hybrid_form_is_the_hybrid_models_computation():
    rng = np.random.default_rng(9)
    H, K, D, R = 2, 1, 16, 4
    qkv, qn, kn, cos, sin, slots, kc, vc = inputs(
        rng, tokens=3, heads=H, kv_heads=K, dim=D, pages=3, page_size=4, dtype=jnp.float32,
        normed=True, cache_dtype=jnp.float32, gated=True, rotary=R)
    slots = slots.at[-1].set(2)
    q, kc2, vc2 = reference.attention_prologue(qkv, qn, kn, cos, sin, slots, kc, vc,
                                               num_heads=H, num_kv_heads=K, eps=1e-6,
                                               zero_centred=True, gated=True)
    q_all = qkv[:, :2 * H * D].reshape(3, H, 2 * D)[..., :D]
    rest = qkv[:, 2 * H * D:].reshape(3, 2 * K, D)
    norm = functools.partial(layers.zero_centred_rms_norm, eps=1e-6)
    want_q = layers.apply_partial_rope(norm(q_all, qn), cos, sin)
    want_k = layers.apply_partial_rope(norm(rest[:, :K], kn), cos, sin)
    want_kc, want_vc = paged_attention.reference.write_kv(kc, vc, want_k, rest[:, K:], slots)
    np.testing.assert_allclose(np.asarray(q), np.asarray(want_q), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(kc2), np.asarray(want_kc), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(vc2), np.asarray(want_vc))


def test_kernel_leaves_other_shapes_to_the_model():
    rng = np.random.default_rng(2)
    qkv, qn, kn, cos, sin, slots, kc, vc = inputs(rng, tokens=2, heads=2, kv_heads=1, dim=16,
                                                  pages=2, page_size=4, dtype=jnp.float32,
                                                  normed=True)
    call = functools.partial(kernel.attention_prologue, num_heads=2, num_kv_heads=1, eps=1e-6)
    assert call(qkv, qn, None, cos, sin, slots, kc, vc) is None  # one norm only
    assert call(qkv, qn, kn, cos[:, :3], sin[:, :3], slots, kc, vc) is None  # 3 of 8: no tile
    wide = jnp.concatenate([cos, cos], -1)
    assert call(qkv, qn, kn, wide, wide, slots, kc, vc) is None  # wider than the head
    assert call(qkv, qn, kn, cos, sin, slots, kc, vc.astype(jnp.float16)) is None
    scaled = paged_attention.cache_specs(2, 4, 1, 16, "int8")
    assert isinstance(scaled[0], tuple)
    assert call(qkv, qn, kn, cos, sin, slots, scaled[0], scaled[1]) is None
    odd = inputs(rng, tokens=2, heads=2, kv_heads=1, dim=24, pages=2, page_size=4,
                 dtype=jnp.float32, normed=False)
    assert call(*odd) is None  # half of 24 is not a power of two


@pytest.mark.parametrize("heads,kv_heads,D,normed,hybrid",
                         [(32, 8, 128, False, False), (32, 8, 128, True, False),
                          (16, 2, 256, True, True)])
def test_kernel_lowers_for_cuda(heads, kv_heads, D, normed, hybrid):
    """The 8B shapes (Llama-3, Qwen3) and the Qwen3.6-35B-A3B's gated attention."""
    spec = jax.ShapeDtypeStruct
    N, half = 2, D // 8 if hybrid else D // 2
    norm = spec((D,), jnp.bfloat16) if normed else None
    cache = spec((64, kv_heads, 16, D), jnp.bfloat16)
    q_width = 2 if hybrid else 1
    args = (spec((N, (q_width * heads + 2 * kv_heads) * D), jnp.bfloat16), norm, norm,
            spec((N, half), jnp.float32), spec((N, half), jnp.float32),
            spec((N,), jnp.int32), cache, cache)
    fn = functools.partial(kernel.attention_prologue, num_heads=heads, num_kv_heads=kv_heads,
                           eps=1e-6, zero_centred=hybrid, gated=hybrid)
    assert "ninfer_attention_prologue" in lowers_for_cuda(fn, *args)


@needs_gpu
@pytest.mark.parametrize("tokens,heads,kv_heads,dim,normed,hybrid",
                         [(2, 32, 8, 128, True, False), (300, 32, 8, 128, False, False),
                          (5, 40, 8, 128, True, False), (2, 16, 2, 256, True, True),
                          (257, 16, 2, 256, True, True)])
def test_kernel_on_the_gpu_matches_the_reference(tokens, heads, kv_heads, dim, normed, hybrid):
    rng = np.random.default_rng(tokens + heads)
    args = inputs(rng, tokens=tokens, heads=heads, kv_heads=kv_heads, dim=dim, pages=40,
                  page_size=16, dtype=jnp.bfloat16, normed=normed, gated=hybrid,
                  rotary=dim // 4 if hybrid else None)
    options = dict(num_heads=heads, num_kv_heads=kv_heads, eps=1e-6, zero_centred=hybrid,
                   gated=hybrid)
    want = jax.jit(functools.partial(reference.attention_prologue, **options))(*args)
    # the caches donated as the step donates them: updated in place, not copied
    step = jax.jit(functools.partial(kernel.attention_prologue, **options),
                   donate_argnums=(6, 7))
    hlo = step.lower(*args).compile().as_text()
    assert "ninfer_attention_prologue" in hlo
    cache_shape = "bf16[40,%d,16,%d]" % (kv_heads, dim)
    assert not [line for line in hlo.splitlines() if " copy(" in line and cache_shape in line]
    got = step(*args)
    np.testing.assert_allclose(np.asarray(got[0], np.float32), np.asarray(want[0], np.float32),
                               rtol=1e-2, atol=2e-2)
    for a, b in zip(got[1:], want[1:]):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=1e-2, atol=2e-2)


def test_switch_and_override(monkeypatch):
    assert_gpu_switch(monkeypatch, attention_prologue.prologue_kernel_on,
                      attention_prologue.PROLOGUE_ENV, attention_prologue.GPU_PROLOGUE)


@cpu_only
@pytest.mark.parametrize("preset", ["qwen3-tiny", "llama3-8b", "qwen3.6-tiny-moe"])
def test_models_with_the_kernel_forced_on_give_the_same_logits_and_caches(monkeypatch, preset):
    """The tiny Qwen3 (QK-norm), Llama-3 at tiny size (none) and Qwen3.6-MoE (gated,
    zero-centred, partial RoPE), bfloat16 pages: a prefill, then for the dense two a two-row
    decode (one padding row, written to the dummy page), with every attention layer's prologue
    through the kernel (interpret mode; the attention stays on its reference) against the
    switch off."""
    import types

    from ninfer_jax.artifact.presets import PRESETS, tiny_config
    from ninfer_jax.artifact.random_init import random_params
    from ninfer_jax.engine.runner import JaxRunner
    from ninfer_jax.model import hybrid, llama

    config = tiny_config(PRESETS[preset].config)
    artifact = types.SimpleNamespace(config=config,
                                     params=random_params(config, seed=4, dtype="f32"))
    runner = JaxRunner(artifact, num_pages=16, page_size=8, max_batch=2, max_context=64,
                       prefill_chunk=32, background_compile=False)
    attention_layers = [i for i, layer in enumerate(runner.params["layers"]) if "wqkv" in layer]
    assert attention_layers
    kv = [jax.tree.map(lambda a: a.astype(jnp.bfloat16), c) if "wqkv" in layer else c
          for c, layer in zip(runner.kv, runner.params["layers"])]
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, config.vocab_size, 32), jnp.int32)
    table = jnp.arange(1, 5, dtype=jnp.int32)

    def run():
        if config.is_hybrid:
            logits, caches = hybrid.prefill(runner.params, kv, tokens, jnp.int32(0),
                                            jnp.int32(29), table, jnp.int32(1),
                                            config=runner.config, page_size=8)
            return np.asarray(logits), None, caches
        logits, caches = llama.prefill(runner.params, kv, tokens, jnp.int32(0), jnp.int32(29),
                                       table, config=runner.config, page_size=8)
        tables = jnp.stack([jnp.pad(table, (0, 4)), jnp.zeros(8, jnp.int32)])
        step, caches = llama.decode(runner.params, caches, jnp.asarray([7, 0], jnp.int32),
                                    jnp.asarray([29, 0], jnp.int32), tables,
                                    config=runner.config, page_size=8)
        return np.asarray(logits), np.asarray(step), caches

    want = run()
    monkeypatch.setattr(attention_prologue, "prologue_kernel_on", lambda: True)
    calls = interpret_calls(monkeypatch, kernel, "attention_prologue")
    got = run()
    assert len(calls) == len(attention_layers) * (1 if config.is_hybrid else 2)
    np.testing.assert_allclose(got[0], want[0], rtol=2e-4, atol=2e-4)
    if got[1] is not None:
        np.testing.assert_allclose(got[1], want[1], rtol=2e-4, atol=2e-4)
    for a, b in zip(jax.tree.leaves(got[2]), jax.tree.leaves(want[2])):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
