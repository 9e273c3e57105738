"""The CPU decode attention (kernels/paged_attention/cpu, C++) against the jnp reference and a
dense float64 softmax: the ragged dispatcher on the CPU (chunk through the reference, rows
through the handler) over the ragged grid (verify rows, padding rows, odd chunk lengths,
shuffled pages), the handler's paths (on an AVX-512 host: AVX-512 for head dims in 16s, AVX2
for other multiples of 8, the plain loop otherwise), bf16 and f16 pages, and which caches it
takes. Without the built extension these tests skip, or fail
when CI is set (CI must build it)."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_testkit import paged_setup
from ninfer_jax.kernels import paged_attention, ragged_attention
from ninfer_jax.kernels.paged_attention import ScaledPages, cpu
from ninfer_jax.kernels.paged_attention import reference as paged_reference
from test_ragged_attention import GRID, dense_attention, ragged_case

pytestmark = [
    pytest.mark.skipif(not cpu.available() and not os.environ.get("CI"),
                       reason="CPU decode attention not built (pip install -e . builds it)"),
    pytest.mark.skipif(jax.default_backend() != "cpu",
                       reason="a CPU handler; the GPU runs the Pallas decode kernel"),
]

STATIC = ("scale", "num_chunk_tokens")


def test_the_extension_is_built():
    assert cpu.available(), "the CPU decode attention must be built (setup.py) where CI is set"


@pytest.mark.parametrize("page_size,chunk_start,chunk_len,chunk_bucket,rows", GRID)
@pytest.mark.parametrize("head_dim", [16, 24, 12])  # AVX-512, AVX2, the plain loop
def test_cpu_dispatch_matches_the_reference_and_dense(page_size, chunk_start, chunk_len,
                                                      chunk_bucket, rows, head_dim):
    rng = np.random.default_rng(page_size + chunk_start + chunk_len)
    q, k, v, args, real = ragged_case(rng, page_size=page_size, chunk_start=chunk_start,
                                      chunk_len=chunk_len, chunk_bucket=chunk_bucket,
                                      row_specs=rows, heads=6, kv_heads=2, head_dim=head_dim)
    dispatched = jax.jit(ragged_attention.ragged_paged_attention, static_argnames=STATIC)
    if rows:
        assert cpu.TARGET in dispatched.lower(q, k, v, **args).as_text()
    out = np.asarray(dispatched(q, k, v, **args))
    want = np.asarray(jax.jit(ragged_attention.reference.ragged_paged_attention,
                              static_argnames=STATIC)(q, k, v, **args))
    np.testing.assert_allclose(out[real], want[real], rtol=2e-6, atol=2e-6)
    qn, kn, vn = (np.asarray(a, np.float64) for a in (q, k, v))
    for i, (sequence, position) in enumerate(rows):
        row = chunk_bucket + i
        if sequence is None:  # a padding row reads only the dummy page: finite, unused
            assert np.all(np.isfinite(out[row]))
            continue
        expected = dense_attention(qn[row], kn, vn, args["row_tables"][i], position + 1,
                                   args["scale"])
        np.testing.assert_allclose(out[row], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("page_dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("head_dim", [64, 24, 12])
def test_half_pages_match_the_reference_and_dense(page_dtype, head_dim):
    # The reference widens 16-bit pages to f32 before its dots, as the handler does in
    # registers, so the f32 tolerance holds. The last row's large q spreads its scores over
    # about +-60, so the softmax's exp sees arguments from 0 down past its underflow (-87);
    # f32 rounding of scores that large moves its output by ~1e-5 whatever the exp.
    rng = np.random.default_rng(head_dim)
    lengths = [300, 1, 37, 16]
    k, v, tables, lens = paged_setup(rng, batch=4, lengths=lengths, num_kv_heads=3,
                                     head_dim=head_dim, page_size=16, dtype=page_dtype)
    spread = np.asarray([1, 1, 1, 30])[:, None, None]
    q = jnp.asarray(rng.standard_normal((4, 9, head_dim)) * spread, jnp.float32)
    scale = head_dim ** -0.5
    out = np.asarray(jax.jit(lambda q: cpu.paged_decode_attention(
        q, k, v, tables, lens, scale=scale))(q))
    want = np.asarray(paged_reference.paged_decode_attention(q, k, v, tables, lens,
                                                             scale=scale))
    np.testing.assert_allclose(out[:3], want[:3], rtol=2e-6, atol=2e-6)
    qn, kn, vn = (np.asarray(a.astype(jnp.float32), np.float64) for a in (q, k, v))
    for row, length in enumerate(lengths):
        expected = dense_attention(qn[row], kn, vn, tables[row], length, scale)
        tolerance = 1e-5 if row < 3 else 1e-4
        np.testing.assert_allclose(out[row], expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("lengths", [[300, 17, 64], [1500, 17, 900, 1]])
def test_long_rows_and_a_row_alone_get_the_bits_they_get_in_a_batch(lengths):
    # Rows are independent: a decode row alone and the same row among verify and padding rows
    # get the same bits (speculation's exactness on CPU relies on it).
    rng = np.random.default_rng(3)
    batch = len(lengths)
    k, v, tables, _ = paged_setup(rng, batch=batch, lengths=lengths, num_kv_heads=3,
                                  head_dim=64, page_size=16)
    q = jnp.asarray(rng.standard_normal((batch, 9, 64)), jnp.float32)
    lens = jnp.asarray(lengths, jnp.int32)
    call = jax.jit(lambda q, t, n: cpu.paged_decode_attention(q, k, v, t, n, scale=0.125))
    together = np.asarray(call(q, tables, lens))
    want = np.asarray(paged_reference.paged_decode_attention(q, k, v, tables, lens, scale=0.125))
    np.testing.assert_allclose(together, want, rtol=2e-6, atol=2e-6)
    for row in range(batch):
        alone = np.asarray(call(q[row:row + 1], tables[row:row + 1], lens[row:row + 1]))
        np.testing.assert_array_equal(alone[0], together[row])


def test_plain_pages_take_the_handler_and_8bit_codes_do_not(monkeypatch):
    rng = np.random.default_rng(4)
    k, v, tables, _ = paged_setup(rng, batch=1, lengths=[20], num_kv_heads=2, head_dim=16,
                                  page_size=8)
    q = jnp.ones((1, 4, 16), jnp.float32)
    lens = jnp.asarray([20], jnp.int32)

    def lowered(k, v):
        return jax.jit(lambda q: paged_attention.paged_decode_attention(
            q, k, v, tables, lens, scale=0.25)).lower(q).as_text()

    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        assert cpu.TARGET in lowered(k.astype(dtype), v.astype(dtype))
    assert cpu.TARGET not in lowered(k.astype(jnp.bfloat16), v)  # mixed dtypes
    codes = ScaledPages(k.astype(jnp.int8), jnp.ones(k.shape[:3], jnp.float32))
    assert cpu.TARGET not in lowered(codes, codes)
    monkeypatch.setenv("NINFER_FORCE_REFERENCE", "1")
    assert cpu.TARGET not in lowered(k, v)


@pytest.mark.parametrize("page_dtype", [jnp.bfloat16, jnp.float16])
def test_16bit_pages_are_written_in_place_with_the_reference_bits(page_dtype):
    # XLA's CPU scatter into bf16 rewrites the whole cache; the handler copies the slots.
    rng = np.random.default_rng(5)
    k = jnp.asarray(rng.standard_normal((6, 3, 4, 16)), page_dtype)
    v = k * 2
    k_new, v_new = (jnp.asarray(rng.standard_normal((3, 3, 16)), jnp.float32) for _ in "kv")
    slots = jnp.asarray([5, 0, 23], jnp.int32)  # page 1, the dummy page, the last slot
    write = jax.jit(paged_attention.write_kv)
    assert cpu.WRITE_TARGET in write.lower(k, v, k_new, v_new, slots).as_text()
    want = paged_reference.write_kv(k, v, k_new, v_new, slots)
    for got, expected in zip(write(k, v, k_new, v_new, slots), want):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    assert cpu.WRITE_TARGET not in write.lower(k.astype(jnp.float32), v.astype(jnp.float32),
                                               k_new, v_new, slots).as_text()
