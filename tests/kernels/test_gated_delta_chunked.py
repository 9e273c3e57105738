"""The chunked Gated DeltaNet prefill off the reference: the WY form (wy.py) and the Pallas
kernel (kernel.py) against the per-token scan of reference.py.

WY form: float32 within 2e-5 of the scan (any start state, padded and odd lengths, many small
chunks, decays near 0 and near 1); bf16 operands within 2% (relative); its blockwise
triangular inverse is the inverse. Kernel, in interpret mode on CPU: the same grid at head
dims 128 (and 64 / 32, three value heads per key head), a prompt split at odd offsets with the
state carried through three calls, bf16 operands; lowered for CUDA at the 27B and 35B-A3B
shapes. Chained verify rows in WY form equal the rows one by one. Dispatch: CPU runs the reference;
on a GPU the one switch picks the chunked path.
Natively on the GPU (`-m gpu`): the kernel and the WY form against the reference.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_testkit import cpu_only, lowers_for_cuda, needs_gpu, relative_error
from ninfer_jax.kernels import dispatch, gated_delta
from ninfer_jax.kernels.gated_delta import kernel, reference, wy
from ninfer_jax.model import ragged_batch


def l2_normalised(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def inputs(rng, num_tokens, *, heads=(2, 4), dims=(8, 6), gates="mixed"):
    """q, k [T, Hk, dk] normalised (q scaled), v [T, Hv, dv], g <= 0, beta in (0, 1).
    gates: "mixed" (e^g spread around e^-1), "near_one" (e^g > 0.999, beta near 1: long
    memory, full overwrites), "near_zero" (e^g < 1e-6: the state is forgotten each token)."""
    (Hk, Hv), (dk, dv) = heads, dims
    q = l2_normalised(rng.standard_normal((num_tokens, Hk, dk))) * dk ** -0.5
    k = l2_normalised(rng.standard_normal((num_tokens, Hk, dk)))
    v = rng.standard_normal((num_tokens, Hv, dv))
    beta = 1 / (1 + np.exp(-rng.standard_normal((num_tokens, Hv))))
    if gates == "near_one":
        g = -rng.uniform(0.0, 1e-3, (num_tokens, Hv))
        beta = rng.uniform(0.95, 1.0, (num_tokens, Hv))
    elif gates == "near_zero":
        g = -rng.uniform(15.0, 30.0, (num_tokens, Hv))
    else:
        g = -np.exp(rng.standard_normal((num_tokens, Hv)))
    return [jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta)]


def start_state(rng, kind, heads=4, dims=(8, 6)):
    shape = (heads, *dims)
    return jnp.zeros(shape) if kind == "zero" else jnp.asarray(rng.standard_normal(shape),
                                                              jnp.float32)


def assert_matches_scan(fn, args, state, real, atol=2e-5):
    out, final = fn(*args, state, jnp.int32(real))
    want_out, want_final = reference.recurrent_gated_delta(*args, state, jnp.int32(real))
    np.testing.assert_allclose(np.asarray(out[:real]), np.asarray(want_out[:real]), atol=atol)
    np.testing.assert_allclose(np.asarray(final), np.asarray(want_final), atol=atol)


def bf16_values(args):
    q, k, v, g, beta = args
    return [q, k, v.astype(jnp.bfloat16), g, beta]


# ------------------------------------------------------------------------------- WY form

def test_blockwise_inverse_inverts_the_unit_lower_triangular_system():
    rng = np.random.default_rng(0)
    a = np.tril(rng.standard_normal((3, 64, 64)), -1) * 0.3
    got = jax.jit(wy.wy_inverse)(jnp.asarray(a, jnp.float32))
    want = np.linalg.inv(np.eye(64) + a)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


@pytest.mark.parametrize("padded,real,chunk_size,state_kind", [
    (7, 7, 64, "zero"), (150, 97, 64, "random"), (130, 1, 64, "zero"), (45, 45, 8, "random")])
def test_wy_form_equals_the_recurrent_scan(padded, real, chunk_size, state_kind):
    rng = np.random.default_rng(padded * 7 + real)
    fn = jax.jit(functools.partial(wy.chunk_gated_delta, chunk_size=chunk_size))
    assert_matches_scan(fn, inputs(rng, padded), start_state(rng, state_kind), real)


@pytest.mark.parametrize("gates", ["near_one", "near_zero"])
def test_wy_form_with_gates_near_one_and_near_zero(gates):
    rng = np.random.default_rng(11)
    fn = jax.jit(functools.partial(wy.chunk_gated_delta, chunk_size=16))
    assert_matches_scan(fn, inputs(rng, 100, gates=gates), start_state(rng, "random"), 100)


def test_wy_form_with_bf16_operands_stays_close_to_the_scan():
    rng = np.random.default_rng(12)
    args = bf16_values(inputs(rng, 150))
    state = start_state(rng, "random")
    out, final = jax.jit(wy.chunk_gated_delta)(*args, state, jnp.int32(150))
    want_out, want_final = reference.recurrent_gated_delta(*args, state, jnp.int32(150))
    assert relative_error(out, want_out) < 2e-2
    assert relative_error(final, want_final) < 2e-2


# Slots of 14 verify rows: chains of 3, 5 and 1 rows, padding rows (slot 0) between them
CHAIN_SLOTS = [3, 3, 3, 0, 5, 2, 2, 2, 2, 2, 0, 4, 0, 0]


def rows_one_by_one(q, k, v, g, beta, slot_states, slots):
    """The reference: gated_delta_step row after row, a chained row from its predecessor."""
    outs, afters = [], []
    for i, slot in enumerate(slots):
        chained = i > 0 and slot != 0 and slots[i - 1] == slot
        state = afters[-1] if chained else slot_states[slot]
        out, after = reference.gated_delta_step(*(a[i:i + 1] for a in (q, k, v, g, beta)),
                                                state[None])
        outs.append(out[0])
        afters.append(after[0])
    return jnp.stack(outs), jnp.stack(afters)


@pytest.mark.parametrize("gates", ["mixed", "near_one"])
def test_chained_rows_in_wy_form_equal_the_rows_one_by_one(gates):
    rng = np.random.default_rng(16)
    args = inputs(rng, len(CHAIN_SLOTS), gates=gates)
    slot_states = jnp.asarray(rng.standard_normal((6, 4, 8, 6)), jnp.float32)
    slots = jnp.asarray(CHAIN_SLOTS, jnp.int32)
    out, after = jax.jit(wy.chained_gated_delta)(*args, slot_states[slots],
                                                 ragged_batch.chain_depths(slots))
    want_out, want_after = rows_one_by_one(*args, slot_states, CHAIN_SLOTS)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), atol=2e-5)
    np.testing.assert_allclose(np.asarray(after), np.asarray(want_after), atol=2e-5)


# ------------------------------------------------------------------- Pallas kernel (interpret)

KERNEL_CASES = [  # (Hk, Hv), (dk, dv), padded, real, gates, start state, block_v
    ((2, 4), (128, 128), 150, 97, "mixed", "random", None),
    ((1, 2), (128, 128), 64, 64, "near_zero", "random", 32),
    ((2, 2), (128, 128), 130, 130, "near_one", "zero", 64),
    ((1, 3), (64, 32), 77, 76, "mixed", "random", 16),
]


@cpu_only
@pytest.mark.parametrize("heads,dims,padded,real,gates,state_kind,block_v", KERNEL_CASES)
def test_kernel_in_interpret_mode_equals_the_recurrent_scan(heads, dims, padded, real, gates,
                                                            state_kind, block_v):
    rng = np.random.default_rng(padded + real)
    args = inputs(rng, padded, heads=heads, dims=dims, gates=gates)
    state = start_state(rng, state_kind, heads[1], dims)
    fn = jax.jit(functools.partial(kernel.chunk_gated_delta, block_v=block_v, interpret=True))
    assert_matches_scan(fn, args, state, real)


@cpu_only
def test_kernel_continues_a_prompt_split_at_odd_offsets():
    """Three calls (tokens 0-76, 77-137, 138-199, each padded to a bucket of 80) carrying
    the state equal the scan over the whole prompt."""
    rng = np.random.default_rng(13)
    heads, dims = (1, 2), (128, 128)
    args = inputs(rng, 200, heads=heads, dims=dims)
    state = start_state(rng, "random", heads[1], dims)
    want_out, want_final = reference.recurrent_gated_delta(*args, state, jnp.int32(200))
    fn = jax.jit(functools.partial(kernel.chunk_gated_delta, interpret=True))
    for start, end in ((0, 77), (77, 138), (138, 200)):
        piece = [jnp.pad(a[start:end], [(0, 80 - (end - start))] + [(0, 0)] * (a.ndim - 1))
                 for a in args]
        out, state = fn(*piece, state, jnp.int32(end - start))
        np.testing.assert_allclose(np.asarray(out[:end - start]),
                                   np.asarray(want_out[start:end]), atol=2e-5)
    np.testing.assert_allclose(np.asarray(state), np.asarray(want_final), atol=2e-5)


@cpu_only
def test_kernel_with_bf16_operands_stays_close_to_the_scan():
    rng = np.random.default_rng(14)
    heads, dims = (2, 4), (128, 128)
    args = bf16_values(inputs(rng, 150, heads=heads, dims=dims))
    state = start_state(rng, "random", heads[1], dims)
    out, final = jax.jit(functools.partial(kernel.chunk_gated_delta, interpret=True))(
        *args, state, jnp.int32(150))
    want_out, want_final = reference.recurrent_gated_delta(*args, state, jnp.int32(150))
    assert relative_error(out, want_out) < 2e-2
    assert relative_error(final, want_final) < 2e-2


def test_head_dims_without_a_tiling_fall_back():
    rng = np.random.default_rng(15)
    args = inputs(rng, 10)  # dk 8, dv 6
    assert kernel.chunk_gated_delta(*args, start_state(rng, "zero"), jnp.int32(10)) is None


@pytest.mark.parametrize("heads", [(16, 48), (16, 32)])  # Qwen3.5-27B, Qwen3.6-35B-A3B
def test_kernel_lowers_for_cuda_at_the_hybrid_shapes(heads):
    Hk, Hv = heads
    spec, T = jax.ShapeDtypeStruct, 1024
    args = (spec((T, Hk, 128), jnp.float32), spec((T, Hk, 128), jnp.float32),
            spec((T, Hv, 128), jnp.bfloat16), spec((T, Hv), jnp.float32),
            spec((T, Hv), jnp.float32), spec((Hv, 128, 128), jnp.float32),
            spec((), jnp.int32))
    text = lowers_for_cuda(kernel.chunk_gated_delta, *args)
    assert "ninfer_gated_delta_chunk_scan" in text
    assert "triangular_solve" not in text and "while" not in text  # no XLA loop left


# ----------------------------------------------------------------------------- dispatch

def test_cpu_runs_the_reference_whatever_the_override(monkeypatch):
    monkeypatch.setattr(dispatch, "use_kernels", lambda: False)
    monkeypatch.setenv(gated_delta.PREFILL_ENV, "kernel")
    assert gated_delta.prefill_path() == "reference"


def test_on_a_gpu_the_switch_picks_the_path_and_the_override_wins(monkeypatch):
    monkeypatch.setattr(dispatch, "use_kernels", lambda: True)
    monkeypatch.delenv(gated_delta.PREFILL_ENV, raising=False)
    assert gated_delta.prefill_path() == gated_delta.GPU_PREFILL
    monkeypatch.setattr(gated_delta, "GPU_PREFILL", "reference")
    assert gated_delta.prefill_path() == "reference"
    monkeypatch.setenv(gated_delta.PREFILL_ENV, "wy")
    assert gated_delta.prefill_path() == "wy"
    monkeypatch.setenv(gated_delta.PREFILL_ENV, "fast")
    with pytest.raises(ValueError, match="NINFER_GDN_PREFILL"):
        gated_delta.prefill_path()


# ------------------------------------------------------------------------ native, on the GPU

@needs_gpu
@pytest.mark.parametrize("path", ["kernel", "wy"])
@pytest.mark.parametrize("heads", [(4, 12), (4, 8)])  # 27B's and 35B-A3B's head ratios
def test_chunked_paths_on_the_gpu_match_the_reference(path, heads):
    rng = np.random.default_rng(heads[1])
    dims, T, real = (128, 128), 1000, 997
    args = inputs(rng, T, heads=heads, dims=dims)
    state = start_state(rng, "random", heads[1], dims)
    fn = jax.jit(kernel.chunk_gated_delta if path == "kernel" else wy.chunk_gated_delta)
    with jax.default_matmul_precision("highest"):
        want_out, want_final = reference.recurrent_gated_delta(*args, state, jnp.int32(real))
        out, final = fn(*args, state, jnp.int32(real))  # float32: tight
    np.testing.assert_allclose(np.asarray(out[:real]), np.asarray(want_out[:real]), atol=1e-4)
    np.testing.assert_allclose(np.asarray(final), np.asarray(want_final), atol=1e-4)
    out, final = fn(*bf16_values(args), state, jnp.int32(real))
    assert relative_error(out[:real], want_out[:real]) < 2e-2
    assert relative_error(final, want_final) < 2e-2


def test_the_rows_kernel_switch_and_its_override(monkeypatch):
    monkeypatch.delenv(gated_delta.ROWS_ENV, raising=False)
    assert gated_delta.rows_kernel_on() == gated_delta.GPU_ROWS_KERNEL
    monkeypatch.setenv(gated_delta.ROWS_ENV, "1")
    assert gated_delta.rows_kernel_on()
    monkeypatch.setenv(gated_delta.ROWS_ENV, "0")
    monkeypatch.setattr(gated_delta, "GPU_ROWS_KERNEL", True)
    assert not gated_delta.rows_kernel_on()
    monkeypatch.setenv(gated_delta.ROWS_ENV, "yes")
    with pytest.raises(ValueError, match="NINFER_GDN_ROWS_KERNEL"):
        gated_delta.rows_kernel_on()


def test_the_fused_rows_switch_needs_the_rows_kernel_and_its_override_wins(monkeypatch):
    monkeypatch.delenv(gated_delta.ROWS_ENV, raising=False)
    monkeypatch.delenv(gated_delta.FUSED_ROWS_ENV, raising=False)
    assert gated_delta.fused_rows_on() == (gated_delta.GPU_FUSED_ROWS
                                           and gated_delta.GPU_ROWS_KERNEL)
    monkeypatch.setenv(gated_delta.FUSED_ROWS_ENV, "1")
    assert gated_delta.fused_rows_on() == gated_delta.GPU_ROWS_KERNEL
    monkeypatch.setenv(gated_delta.ROWS_ENV, "0")
    assert not gated_delta.fused_rows_on()
    monkeypatch.setenv(gated_delta.ROWS_ENV, "1")
    monkeypatch.setenv(gated_delta.FUSED_ROWS_ENV, "0")
    monkeypatch.setattr(gated_delta, "GPU_FUSED_ROWS", True)
    assert not gated_delta.fused_rows_on()
    monkeypatch.setenv(gated_delta.FUSED_ROWS_ENV, "on")
    with pytest.raises(ValueError, match="NINFER_GDN_FUSED_ROWS"):
        gated_delta.fused_rows_on()


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="interpret mode is for the CPU")
@pytest.mark.parametrize("fused,fused_gates", [("1", None), ("0", None), ("1", "1"),
                                               ("1", "0"), ("0", "1")])
def test_decode_rows_dispatch_takes_the_switched_kernel_and_agrees(monkeypatch, fused,
                                                                   fused_gates):
    """With kernels on (interpret mode here), conv_gated_delta_rows runs the fused kernel or
    XLA's conv before the rows kernel, per the switch, with the gates given (fused_gates
    None) or taken from the fused projection's columns: by the fused kernel itself when its
    gates switch is on, else by XLA first; all equal the reference."""
    from ninfer_jax.kernels.gated_delta import rows_kernel
    from test_gated_delta import ROW_SHAPE, conv_rows_inputs, fused_gate_inputs
    calls, given_gates = [], []

    def spy(fn):
        def call(*args, **kwargs):
            calls.append(fn.__name__)
            given_gates.append(args[3])
            return fn(*args, **kwargs, interpret=True)
        return call

    monkeypatch.setattr(dispatch, "use_kernels", lambda: True)
    monkeypatch.setenv(gated_delta.ROWS_ENV, "1")
    monkeypatch.setenv(gated_delta.FUSED_ROWS_ENV, fused)
    for name in ("conv_gated_delta_rows", "gated_rows"):
        monkeypatch.setattr(rows_kernel, name, spy(getattr(rows_kernel, name)))
    rng = np.random.default_rng(15)
    args = conv_rows_inputs(rng, [3, 0, 1], dtype=jnp.bfloat16, **ROW_SHAPE)
    decay = None
    if fused_gates:
        monkeypatch.setenv(gated_delta.FUSED_GATES_ENV, fused_gates)
        args, decay, _ = fused_gate_inputs(rng, args, hv=4, dv=64)
    with jax.default_matmul_precision("highest"):
        got = gated_delta.conv_gated_delta_rows(*args, key_heads=2, decay=decay)
        want = reference.conv_gated_delta_rows(*args, key_heads=2, decay=decay)
    assert calls == (["conv_gated_delta_rows"] if fused == "1" else ["gated_rows"])
    # the fused kernel gets no gates only when it is to make them itself
    assert (given_gates[0] is None) == (fused == "1" and fused_gates == "1")
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   atol=2e-5, rtol=2e-5)
