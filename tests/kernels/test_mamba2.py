"""Mamba-2's SSD scan: the chunked prefill against the per-token scan (zero and mid-sequence
start states, odd and padded lengths, several chunks, grouped B/C), padding tokens leave the
state alone, a prompt split at an odd offset equals it whole, the decode step equals one scan
step per row, and the scan equals a literal numpy loop."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.kernels import mamba2
from ninfer_jax.kernels.mamba2 import reference

HM, P, G, N = 4, 6, 2, 5  # heads, head dim, groups, state size


def inputs(rng, num_tokens, *, dt_scale=1.0):
    """x [T, Hm, P], dt > 0, A < 0, B, C [T, G, N], D."""
    x = rng.standard_normal((num_tokens, HM, P))
    dt = dt_scale * np.log1p(np.exp(rng.standard_normal((num_tokens, HM))))
    A = -np.exp(rng.standard_normal(HM))
    B, C = (rng.standard_normal((num_tokens, G, N)) for _ in range(2))
    D = rng.standard_normal(HM)
    return [jnp.asarray(v, jnp.float32) for v in (x, dt, A, B, C, D)]


def start_state(rng, kind):
    return jnp.zeros((HM, P, N)) if kind == "zero" else jnp.asarray(
        rng.standard_normal((HM, P, N)), jnp.float32)


@pytest.mark.parametrize("padded,real,state_kind", [(7, 7, "zero"), (16, 11, "random"),
                                                    (150, 97, "random"), (130, 1, "zero")])
def test_chunked_prefill_equals_the_recurrent_scan(padded, real, state_kind):
    rng = np.random.default_rng(padded * 7 + real)
    args = inputs(rng, padded)
    state = start_state(rng, state_kind)
    out, final = mamba2.chunk_ssd(*args, state, jnp.int32(real))
    want_out, want_final = reference.recurrent_ssd(*args, state, jnp.int32(real))
    np.testing.assert_allclose(np.asarray(out[:real]), np.asarray(want_out[:real]), atol=2e-5)
    np.testing.assert_allclose(np.asarray(final), np.asarray(want_final), atol=2e-5)


def test_a_prompt_split_at_an_odd_offset_equals_it_whole():
    """45 tokens in chunks of 8 whole, or 13 then 32 (padded from 29) from the carried state;
    strong steps make e^G underflow inside a chunk."""
    rng = np.random.default_rng(3)
    x, dt, A, B, C, D = inputs(rng, 45, dt_scale=20.0)
    state = start_state(rng, "random")
    whole, whole_final = reference.chunk_ssd(x, dt, A, B, C, D, state, jnp.int32(45),
                                             chunk_size=8)
    first, mid = reference.chunk_ssd(x[:13], dt[:13], A, B[:13], C[:13], D, state,
                                     jnp.int32(13), chunk_size=8)
    pad = [(0, 3)] + [(0, 0)] * 2
    rest = [jnp.pad(v[13:], pad[:v.ndim]) for v in (x, dt, B, C)]
    second, final = reference.chunk_ssd(rest[0], rest[1], A, rest[2], rest[3], D, mid,
                                        jnp.int32(32), chunk_size=8)
    np.testing.assert_allclose(np.concatenate([first, second[:32]]), whole, atol=2e-5,
                               rtol=1e-5)
    np.testing.assert_allclose(np.asarray(final), np.asarray(whole_final), atol=2e-5)


def test_padding_tokens_do_not_advance_the_state():
    rng = np.random.default_rng(4)
    args = inputs(rng, 20)
    state = start_state(rng, "random")
    _, padded_final = mamba2.chunk_ssd(*args, state, jnp.int32(9))
    cut = [v[:9] if v.ndim > 1 else v for v in args]
    _, final = reference.recurrent_ssd(*cut, state, jnp.int32(9))
    np.testing.assert_allclose(np.asarray(padded_final), np.asarray(final), atol=2e-5)


def test_decode_step_equals_one_scan_step_per_row():
    rng = np.random.default_rng(5)
    x, dt, A, B, C, D = inputs(rng, 3)
    states = jnp.asarray(rng.standard_normal((3, HM, P, N)), jnp.float32)
    out, new_states = mamba2.ssd_step(x, dt, A, B, C, D, states)
    for row in range(3):
        want, want_state = reference.recurrent_ssd(x[row:row + 1], dt[row:row + 1], A,
                                                   B[row:row + 1], C[row:row + 1], D,
                                                   states[row], jnp.int32(1))
        np.testing.assert_allclose(np.asarray(out[row]), np.asarray(want[0]), atol=1e-5)
        np.testing.assert_allclose(np.asarray(new_states[row]), np.asarray(want_state),
                                   atol=1e-5)


def test_scan_equals_a_numpy_loop():
    rng = np.random.default_rng(6)
    args, start = inputs(rng, 6), start_state(rng, "random")
    x, dt, A, B, C, D = (np.asarray(v, np.float64) for v in args)
    state = np.array(start, np.float64)
    want = []
    for t in range(6):
        group = np.arange(HM) // (HM // G)
        for h in range(HM):
            state[h] = (np.exp(dt[t, h] * A[h]) * state[h]
                        + dt[t, h] * np.outer(x[t, h], B[t, group[h]]))
        want.append([state[h] @ C[t, group[h]] + D[h] * x[t, h] for h in range(HM)])
    out, final = reference.recurrent_ssd(*args, start, jnp.int32(6))
    np.testing.assert_allclose(np.asarray(out), np.array(want), atol=1e-5)
    np.testing.assert_allclose(np.asarray(final), state, atol=1e-5)


@pytest.mark.parametrize("padded,real,state_kind", [(45, 40, "random")])
def test_the_pallas_kernel_equals_the_scan_in_interpret_mode(padded, real, state_kind):
    """Chunks of 16 (ragged tail, padding tokens) with P = N = 16 so the kernel tiles; the
    grouped B/C are read per head's group inside the kernel."""
    from ninfer_jax.kernels.mamba2 import kernel

    rng = np.random.default_rng(padded + real)
    x, dt, A, B, C, D = inputs(rng, padded)
    x = jnp.asarray(rng.standard_normal((padded, HM, 16)), jnp.float32)
    B, C = (jnp.asarray(rng.standard_normal((padded, G, 16)), jnp.float32) for _ in range(2))
    state = jnp.zeros((HM, 16, 16)) if state_kind == "zero" else jnp.asarray(
        rng.standard_normal((HM, 16, 16)), jnp.float32)
    out, final = kernel.chunk_ssd(x, dt, A, B, C, D, state, jnp.int32(real), chunk_size=16,
                                  interpret=True)
    want_out, want_final = reference.recurrent_ssd(x, dt, A, B, C, D, state, jnp.int32(real))
    np.testing.assert_allclose(np.asarray(out[:real]), np.asarray(want_out[:real]), atol=5e-5)
    np.testing.assert_allclose(np.asarray(final), np.asarray(want_final), atol=5e-5)
    assert kernel.chunk_ssd(*inputs(rng, 8), state, jnp.int32(8)) is None  # P = 6: no tiling


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the compiled kernel needs a GPU")
@pytest.mark.parametrize("padded,real", [(256, 256), (200, 131)])
def test_the_compiled_kernel_equals_the_scan_on_the_gpu(padded, real):
    """Nemotron-H-8B's Mamba tile (head dim 64, state 128, 64-token blocks), 8 heads in 2
    groups, a ragged tail and a start state: the lowered kernel against the reference scan."""
    from ninfer_jax.kernels.mamba2 import kernel

    rng = np.random.default_rng(real)
    heads, groups, head_dim, state_dim = 8, 2, 64, 128
    x = jnp.asarray(rng.standard_normal((padded, heads, head_dim)), jnp.float32)
    dt = jnp.asarray(np.log1p(np.exp(rng.standard_normal((padded, heads)) - 2.0)), jnp.float32)
    A = jnp.asarray(-np.exp(rng.uniform(0.0, np.log(16.0), heads)), jnp.float32)
    B, C = (jnp.asarray(rng.standard_normal((padded, groups, state_dim)) / np.sqrt(state_dim),
                        jnp.float32) for _ in range(2))
    D = jnp.ones((heads,), jnp.float32)
    state = jnp.asarray(rng.standard_normal((heads, head_dim, state_dim)) * 0.1, jnp.float32)
    with jax.default_matmul_precision("highest"):
        out, final = jax.jit(kernel.chunk_ssd)(x, dt, A, B, C, D, state, jnp.int32(real))
        want_out, want_final = reference.recurrent_ssd(x, dt, A, B, C, D, state,
                                                       jnp.int32(real))
    np.testing.assert_allclose(np.asarray(out[:real]), np.asarray(want_out[:real]),
                               atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(np.asarray(final), np.asarray(want_final), atol=2e-3, rtol=2e-3)
