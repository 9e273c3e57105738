"""The gated delta rule: the chunked prefill against the per-token scan (any start state, odd
and padded lengths, several chunks, grouped key heads), padding tokens leave the state alone,
the decode step equals one scan step per row, and the scan equals a literal numpy loop."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.kernels import gated_delta
from ninfer_jax.kernels.gated_delta import reference

HK, HV, DK, DV = 2, 4, 8, 6


def l2_normalised(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def inputs(rng, num_tokens, *, decay_scale=1.0):
    """q, k [T, Hk, dk] normalised (q scaled), v [T, Hv, dv], g <= 0, beta in (0, 1)."""
    q = l2_normalised(rng.standard_normal((num_tokens, HK, DK))) * DK ** -0.5
    k = l2_normalised(rng.standard_normal((num_tokens, HK, DK)))
    v = rng.standard_normal((num_tokens, HV, DV))
    g = -decay_scale * np.exp(rng.standard_normal((num_tokens, HV)))
    beta = 1 / (1 + np.exp(-rng.standard_normal((num_tokens, HV))))
    return [jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta)]


def start_state(rng, kind):
    return jnp.zeros((HV, DK, DV)) if kind == "zero" else jnp.asarray(
        rng.standard_normal((HV, DK, DV)), jnp.float32)


@pytest.mark.parametrize("padded,real", [(7, 7), (16, 11), (64, 64), (150, 150), (150, 97),
                                         (130, 1)])
@pytest.mark.parametrize("state_kind", ["zero", "random"])
def test_chunked_prefill_equals_the_recurrent_scan(padded, real, state_kind):
    rng = np.random.default_rng(padded * 7 + real)
    args = inputs(rng, padded)
    state = start_state(rng, state_kind)
    out, final = jax.jit(gated_delta.chunk_gated_delta)(*args, state, jnp.int32(real))
    want_out, want_final = reference.recurrent_gated_delta(*args, state, jnp.int32(real))
    np.testing.assert_allclose(np.asarray(out[:real]), np.asarray(want_out[:real]), atol=2e-5)
    np.testing.assert_allclose(np.asarray(final), np.asarray(want_final), atol=2e-5)


def test_small_chunks_and_strong_decay_agree():
    """chunk_size 8 over 45 tokens (6 chunks, a ragged tail); strong decays underflow e^G."""
    rng = np.random.default_rng(3)
    args = inputs(rng, 45, decay_scale=20.0)
    state = start_state(rng, "random")
    out, final = reference.chunk_gated_delta(*args, state, jnp.int32(45), chunk_size=8)
    want_out, want_final = reference.recurrent_gated_delta(*args, state, jnp.int32(45))
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), atol=2e-5)
    np.testing.assert_allclose(np.asarray(final), np.asarray(want_final), atol=2e-5)


def test_padding_tokens_do_not_advance_the_state():
    rng = np.random.default_rng(4)
    args = inputs(rng, 20)
    state = start_state(rng, "random")
    _, padded_final = reference.chunk_gated_delta(*args, state, jnp.int32(13))
    _, exact_final = reference.chunk_gated_delta(*(a[:13] for a in args), state, jnp.int32(13))
    np.testing.assert_allclose(np.asarray(padded_final), np.asarray(exact_final), atol=1e-6)


def test_decode_step_is_one_scan_step_per_row():
    rng = np.random.default_rng(5)
    rows = 3
    args = inputs(rng, rows)
    states = jnp.asarray(rng.standard_normal((rows, HV, DK, DV)), jnp.float32)
    out, new_states = jax.jit(gated_delta.gated_delta_step)(*args, states)
    for i in range(rows):
        want_out, want_state = reference.recurrent_gated_delta(
            *(a[i:i + 1] for a in args), states[i], jnp.int32(1))
        np.testing.assert_allclose(np.asarray(out[i]), np.asarray(want_out[0]), atol=1e-6)
        np.testing.assert_allclose(np.asarray(new_states[i]), np.asarray(want_state), atol=1e-6)


def test_scan_matches_the_rule_written_out_in_numpy():
    rng = np.random.default_rng(6)
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in inputs(rng, 9))
    state = np.asarray(start_state(rng, "random"), np.float64)
    out, final = reference.recurrent_gated_delta(
        *(jnp.asarray(a, jnp.float32) for a in (q, k, v, g, beta)),
        jnp.asarray(state, jnp.float32), jnp.int32(9))
    for t in range(9):
        for h in range(HV):
            kh, qh = k[t, h // (HV // HK)], q[t, h // (HV // HK)]
            state[h] *= np.exp(g[t, h])
            state[h] += np.outer(kh, beta[t, h] * (v[t, h] - state[h].T @ kh))
            np.testing.assert_allclose(np.asarray(out[t, h]), state[h].T @ qh, atol=1e-5)
    np.testing.assert_allclose(np.asarray(final), state, atol=1e-5)


def test_unrolled_chunk_scan_gives_the_same_result():
    rng = np.random.default_rng(5)
    args = inputs(rng, 150)
    state = start_state(rng, "random")
    with jax.default_matmul_precision("highest"):
        rolled = reference.chunk_gated_delta(*args, state, jnp.int32(150))
        unrolled = reference.chunk_gated_delta(*args, state, jnp.int32(150), unroll=True)
    for a, b in zip(rolled, unrolled):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-6)


# The decode rows on their state slots (gated_delta_rows): the reference against one scan step
# per row, the Pallas kernel (kernel.py) against the reference in interpret mode, its CUDA
# lowering at the 35B-A3B shape, and natively on the GPU.
ROW_SHAPE = dict(hk=2, hv=4, dk=16, dv=64)  # two dv blocks of 32, two value heads per key head


def rows_inputs(rng, slots, *, hk, hv, dk, dv, num_slots=6, dtype=jnp.float32):
    B = len(slots)
    q = l2_normalised(rng.standard_normal((B, hk, dk))) * dk ** -0.5
    k = l2_normalised(rng.standard_normal((B, hk, dk)))
    v = rng.standard_normal((B, hv, dv))
    g = -np.exp(rng.standard_normal((B, hv)))
    beta = 1 / (1 + np.exp(-rng.standard_normal((B, hv))))
    recurrent = jnp.asarray(rng.standard_normal((num_slots, hv, dk, dv)), jnp.float32)
    return ([jnp.asarray(x, dtype) for x in (q, k, v)]
            + [jnp.asarray(x, jnp.float32) for x in (g, beta)]
            + [recurrent, jnp.asarray(slots, jnp.int32)])


def test_rows_update_their_slots_and_padding_rows_write_nothing():
    rng = np.random.default_rng(8)
    slots = [3, 0, 1, 0]  # two padding rows on the dummy slot 0
    *args, recurrent, slots_array = rows_inputs(rng, slots, **ROW_SHAPE)
    out, updated = jax.jit(reference.gated_delta_rows)(*args, recurrent, slots_array)
    want_out, want_states = reference.gated_delta_step(*args, recurrent[slots_array])
    for i, slot in enumerate(slots):
        if slot:
            np.testing.assert_allclose(np.asarray(out[i]), np.asarray(want_out[i]), atol=1e-6)
            np.testing.assert_allclose(np.asarray(updated[slot]), np.asarray(want_states[i]),
                                       atol=1e-6)
        else:
            assert np.all(np.asarray(out[i]) == 0)
    untouched = [s for s in range(recurrent.shape[0]) if s not in slots[::2]]
    np.testing.assert_array_equal(np.asarray(updated)[untouched],
                                  np.asarray(recurrent)[untouched])


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the GPU runs it natively")
def test_rows_kernel_in_interpret_mode_matches_the_reference():
    from ninfer_jax.kernels.gated_delta import rows_kernel as kernel
    rng = np.random.default_rng(9)
    args = rows_inputs(rng, [3, 0, 1, 5], dtype=jnp.bfloat16, **ROW_SHAPE)
    with jax.default_matmul_precision("highest"):
        out, updated = jax.jit(functools.partial(kernel.gated_delta_rows, interpret=True))(
            *args)
        want_out, want_updated = reference.gated_delta_rows(*args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(updated), np.asarray(want_updated), atol=1e-5,
                               rtol=1e-5)


def test_rows_kernel_lowers_for_cuda_at_the_35b_a3b_shape():
    from kernel_testkit import lowers_for_cuda
    from ninfer_jax.kernels.gated_delta import rows_kernel as kernel
    spec = jax.ShapeDtypeStruct
    B, S = 2, 9
    args = (spec((B, 16, 128), jnp.bfloat16), spec((B, 16, 128), jnp.bfloat16),
            spec((B, 32, 128), jnp.bfloat16), spec((B, 32), jnp.float32),
            spec((B, 32), jnp.float32), spec((S, 32, 128, 128), jnp.float32),
            spec((B,), jnp.int32))
    assert "ninfer_gated_delta_rows" in lowers_for_cuda(kernel.gated_delta_rows, *args)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
def test_rows_kernel_on_the_gpu_matches_the_reference():
    rng = np.random.default_rng(10)
    args = rows_inputs(rng, [3, 0, 1, 5, 0, 2, 4, 6], num_slots=8, dtype=jnp.bfloat16,
                       hk=16, hv=32, dk=128, dv=128)
    from ninfer_jax.kernels.gated_delta import rows_kernel

    out, updated = jax.jit(rows_kernel.gated_delta_rows)(*args)
    with jax.default_matmul_precision("highest"):
        want_out, want_updated = jax.jit(reference.gated_delta_rows)(*args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(updated), np.asarray(want_updated), atol=1e-4,
                               rtol=1e-4)


# The decode rows from the conv's inputs (conv_gated_delta_rows): the reference against a
# numpy conv + SiLU + L2 norms + one scan step per row, the fused kernel against the reference
# in interpret mode, its CUDA lowering at the 35B-A3B shape, and natively on the GPU.
TAPS = 4


def conv_rows_inputs(rng, slots, *, hk, hv, dk, dv, num_slots=6, dtype=jnp.float32,
                     extra=0):
    """`extra` columns past the conv's channels in mixed, as the fused projection has."""
    B, channels = len(slots), 2 * hk * dk + hv * dv
    mixed = rng.standard_normal((B, channels + extra))
    conv_weight = rng.standard_normal((TAPS, channels)) * 0.5
    conv = rng.standard_normal((num_slots, TAPS - 1, channels))
    g = -np.exp(rng.standard_normal((B, hv)))
    beta = 1 / (1 + np.exp(-rng.standard_normal((B, hv))))
    recurrent = rng.standard_normal((num_slots, hv, dk, dv))
    return ([jnp.asarray(x, dtype) for x in (mixed, conv_weight, conv)]
            + [jnp.asarray(x, jnp.float32) for x in (np.stack([g, beta], -1), recurrent)]
            + [jnp.asarray(slots, jnp.int32)])


def fused_gate_inputs(rng, args, *, hv, dv):
    """conv_rows_inputs' args as the model passes them for a fused in_qkvzba output: mixed
    widened by z, b and a columns, gates None, and the decay (A_log, dt_bias); also the
    gates reference.decay_gates makes of those b and a columns."""
    mixed, conv_weight, conv, _, recurrent, slots = args
    B = mixed.shape[0]
    z, b, a = (rng.standard_normal((B, width)) for width in (hv * dv, hv, hv))
    wide = jnp.concatenate([mixed, jnp.asarray(np.concatenate([z, b, a], 1), mixed.dtype)], 1)
    decay = (jnp.asarray(rng.uniform(0, np.log(16), hv), jnp.float32),
             jnp.asarray(rng.standard_normal(hv), jnp.float32))
    gates = reference.decay_gates(wide[:, -2 * hv:-hv], wide[:, -hv:], *decay)
    return (wide, conv_weight, conv, None, recurrent, slots), decay, gates


def test_decay_gates_are_the_log_decay_and_beta():
    rng = np.random.default_rng(16)
    b, a = rng.standard_normal((3, 4)), rng.standard_normal((3, 4)) * 4
    A_log, dt_bias = rng.uniform(0, 2, 4), rng.standard_normal(4)
    gates = np.asarray(reference.decay_gates(*(jnp.asarray(x, jnp.float32)
                                               for x in (b, a, A_log, dt_bias))))
    np.testing.assert_allclose(gates[..., 0], -np.exp(A_log) * np.log1p(np.exp(a + dt_bias)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gates[..., 1], 1 / (1 + np.exp(-b)), rtol=1e-6)


def test_conv_rows_reference_takes_the_gates_from_the_fused_columns():
    """gates None: the reference reads b and a past q | k | v and z, as the model's fused
    in_qkvzba output holds them, and agrees with the same rows given those gates."""
    rng = np.random.default_rng(17)
    args = conv_rows_inputs(rng, [3, 0, 1, 5], **ROW_SHAPE)
    fused, decay, gates = fused_gate_inputs(rng, args, hv=4, dv=64)
    got = reference.conv_gated_delta_rows(*fused, key_heads=2, decay=decay)
    want = reference.conv_gated_delta_rows(fused[0], *fused[1:3], gates, *fused[4:],
                                           key_heads=2)
    assert_conv_rows_match(got, want, atol=0)


def test_conv_rows_reference_is_the_conv_the_norms_and_one_scan_step_per_row():
    rng = np.random.default_rng(11)
    hk, hv, dk, dv = 2, 4, 8, 6
    slots = [3, 0, 1, 5]
    args = conv_rows_inputs(rng, slots, hk=hk, hv=hv, dk=dk, dv=dv, extra=3)
    mixed, conv_weight, conv, gates, recurrent, _ = (np.asarray(a, np.float64) for a in args)
    g, beta = gates[..., 0], gates[..., 1]
    with jax.default_matmul_precision("highest"):
        out, window, updated = jax.jit(functools.partial(
            reference.conv_gated_delta_rows, key_heads=hk))(*args)
    for i, slot in enumerate(slots):
        inputs_ = np.concatenate([conv[slot], mixed[i, :-3][None]])  # [K, D_c], oldest first
        np.testing.assert_allclose(np.asarray(window[i]), inputs_[1:], atol=1e-6)
        act = (inputs_ * conv_weight).sum(0)
        act = act / (1 + np.exp(-act))
        q = l2_normalised(act[:hk * dk].reshape(hk, dk)) * dk ** -0.5
        k = l2_normalised(act[hk * dk:2 * hk * dk].reshape(hk, dk))
        v = act[2 * hk * dk:].reshape(hv, dv)
        if not slot:
            assert np.all(np.asarray(out[i]) == 0)
            continue
        for h in range(hv):
            kh = h // (hv // hk)
            state = recurrent[slot, h] * np.exp(g[i, h])
            state = state + np.outer(k[kh], beta[i, h] * (v[h] - state.T @ k[kh]))
            np.testing.assert_allclose(np.asarray(out[i, h]), state.T @ q[kh], atol=1e-4,
                                       rtol=1e-4)
            np.testing.assert_allclose(np.asarray(updated[slot, h]), state, atol=1e-4,
                                       rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(updated)[[0, 2, 4]], recurrent[[0, 2, 4]])


def assert_conv_rows_match(got, want, atol):
    for name, a, b in zip(("out", "window", "recurrent"), got, want):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   atol=atol, rtol=atol, err_msg=name)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the GPU runs it natively")
@pytest.mark.parametrize("slots,extra", [([3, 0, 1, 5], 0), ([2], 40)])
def test_fused_conv_rows_kernel_in_interpret_mode_matches_the_reference(slots, extra):
    from ninfer_jax.kernels.gated_delta import rows_kernel as kernel
    rng = np.random.default_rng(12)
    args = conv_rows_inputs(rng, slots, dtype=jnp.bfloat16, extra=extra, **ROW_SHAPE)
    with jax.default_matmul_precision("highest"):
        got = jax.jit(functools.partial(kernel.conv_gated_delta_rows, key_heads=2,
                                        interpret=True))(*args)
        want = jax.jit(functools.partial(reference.conv_gated_delta_rows, key_heads=2))(*args)
    assert got[1].dtype == jnp.bfloat16
    assert_conv_rows_match(got, want, atol=2e-5)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the GPU runs it natively")
def test_fused_conv_rows_kernel_computes_the_gates_from_the_fused_columns():
    from ninfer_jax.kernels.gated_delta import rows_kernel as kernel
    rng = np.random.default_rng(18)
    args = conv_rows_inputs(rng, [3, 0, 1, 5], dtype=jnp.bfloat16, **ROW_SHAPE)
    fused, decay, _ = fused_gate_inputs(rng, args, hv=4, dv=64)
    with jax.default_matmul_precision("highest"):
        got = jax.jit(functools.partial(kernel.conv_gated_delta_rows, key_heads=2, decay=decay,
                                        interpret=True))(*fused)
        want = jax.jit(functools.partial(reference.conv_gated_delta_rows, key_heads=2,
                                         decay=decay))(*fused)
    assert_conv_rows_match(got, want, atol=2e-5)
    # mixed without the b | a columns where they should be: not this kernel's to guess
    short = (fused[0][:, :-1],) + fused[1:]
    assert kernel.conv_gated_delta_rows(*short, key_heads=2, decay=decay) is None


def test_fused_conv_rows_kernel_refuses_shapes_it_does_not_tile():
    from ninfer_jax.kernels.gated_delta import rows_kernel as kernel
    args = conv_rows_inputs(np.random.default_rng(13), [1], hk=2, hv=4, dk=12, dv=64)
    assert kernel.conv_gated_delta_rows(*args, key_heads=2) is None


def test_fused_conv_rows_kernel_lowers_for_cuda_at_the_35b_a3b_shape():
    from kernel_testkit import lowers_for_cuda
    from ninfer_jax.kernels.gated_delta import rows_kernel as kernel
    spec = jax.ShapeDtypeStruct
    B, S, D_c = 2, 9, 2 * 16 * 128 + 32 * 128
    args = (spec((B, D_c), jnp.bfloat16), spec((TAPS, D_c), jnp.bfloat16),
            spec((S, TAPS - 1, D_c), jnp.bfloat16), spec((B, 32, 2), jnp.float32),
            spec((S, 32, 128, 128), jnp.float32),
            spec((B,), jnp.int32))
    fn = functools.partial(kernel.conv_gated_delta_rows, key_heads=16)
    assert "ninfer_conv_gated_delta_rows" in lowers_for_cuda(fn, *args)
    # the gates from the fused projection's b | a columns (gates None)
    wide = spec((B, D_c + 32 * 128 + 2 * 32), jnp.bfloat16)
    decay = (spec((32,), jnp.float32), spec((32,), jnp.float32))
    fn = functools.partial(kernel.conv_gated_delta_rows, key_heads=16)
    lowered = lowers_for_cuda(lambda m, w, c, r, s, a, d: fn(m, w, c, None, r, s, decay=(a, d)),
                              wide, *args[1:3], *args[4:], *decay)
    assert "ninfer_conv_gated_delta_rows" in lowered


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("dtype,fused_gates", [(jnp.float32, False), (jnp.bfloat16, False),
                                               (jnp.float32, True), (jnp.bfloat16, True)])
def test_fused_conv_rows_kernel_on_the_gpu_matches_the_reference(dtype, fused_gates):
    """float32 inputs: within 1e-4. bfloat16: the SiLU outputs are rounded to bfloat16
    before the rule (as the model does), and XLA's conv sums in another order than the
    kernel, so a rounding flips now and then: one bfloat16 step of a v value (~2^-7 at 2)
    moves that column's state by up to ~0.008 (run 57 on an H100: 53 of 4.2M state values
    past 2e-3, the largest 0.0076; run 56: out off by up to 5e-4)."""
    from ninfer_jax.kernels.gated_delta import rows_kernel
    rng = np.random.default_rng(14)
    args = conv_rows_inputs(rng, [3, 0, 1, 5, 0, 2, 4, 6], num_slots=8, dtype=dtype,
                            hk=16, hv=32, dk=128, dv=128, extra=0 if fused_gates else 32 * 130)
    decay = None
    if fused_gates:
        args, decay, _ = fused_gate_inputs(rng, args, hv=32, dv=128)
    got = jax.jit(functools.partial(rows_kernel.conv_gated_delta_rows, key_heads=16,
                                    decay=decay))(*args)
    with jax.default_matmul_precision("highest"):
        want = jax.jit(functools.partial(reference.conv_gated_delta_rows, key_heads=16,
                                         decay=decay))(*args)
    if dtype == jnp.float32:
        assert_conv_rows_match(got, want, atol=1e-4)
        return
    for name, a, b in zip(("out", "window", "recurrent"), got, want):
        error = np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))
        assert error.max() < 2e-2 and np.mean(error > 2e-3) < 1e-3, name
