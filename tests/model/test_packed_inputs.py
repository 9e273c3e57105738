"""Packed step inputs: what the host packs is exactly what the step unpacks."""
import numpy as np

from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.runner_api import SampleSpec
from ninfer_jax.model import sampling
from ninfer_jax.model.packed_inputs import HostPacker, PackedLayout, unpack


def test_pack_then_unpack_round_trips_every_field():
    layout = PackedLayout(chunk=4, rows=3, width=5)
    rng = np.random.default_rng(0)
    batch = dict(chunk_tokens=rng.integers(0, 100, 4), chunk_start=7, chunk_len=3,
                 chunk_table=rng.integers(0, 9, 5), row_tokens=rng.integers(0, 100, 3),
                 row_src=np.array([-1, 2, -1]), row_positions=np.array([5, 9, 0]),
                 row_tables=rng.integers(0, 9, (3, 5)))
    specs = [None,
             SampleSpec(SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1,
                                       seed=-3, presence_penalty=0.5), 11, 2),
             SampleSpec(SamplingParams(temperature=0.0, seed=2**63 + 5,
                                       frequency_penalty=-1.25), 2, 1),
             None]
    ints, floats = HostPacker().pack(layout, batch, specs)
    assert ints.shape == (layout.num_ints,) and floats.shape == (layout.num_floats,)
    outputs = [(), (4, 4, 9), (1, 4, 1, 1), ()]
    counts = np.zeros((3, 10), np.int32)  # lane 0 (the dummy), then lanes 1 and 2
    counts[2], counts[1] = sampling.output_counts(outputs[1], 10), \
        sampling.output_counts(outputs[2], 10)
    ragged, packed, lanes = unpack(layout, ints, floats, counts)
    for name, value in batch.items():
        np.testing.assert_array_equal(np.asarray(getattr(ragged, name)), value)
    np.testing.assert_array_equal(np.asarray(lanes), [0, 2, 1, 0])
    expected = sampling.host_batch(specs, 4, 10, outputs)
    for name in ("temperature", "top_k", "top_p", "min_p", "seed_words", "sample_index",
                 "is_greedy", "logit_bias"):
        np.testing.assert_array_equal(np.asarray(getattr(packed, name)),
                                      np.asarray(getattr(expected, name)), err_msg=name)
    assert np.asarray(packed.logit_bias)[1:3].min() < 0


def test_state_slots_are_packed_only_for_hybrid_layouts():
    dense = PackedLayout(chunk=4, rows=2, width=3)
    hybrid = PackedLayout(chunk=4, rows=2, width=3, state_slots=True)
    names = [name for name, _ in dense.int_fields()]
    assert "chunk_state_slot" not in names and hybrid.num_ints == dense.num_ints + 1 + 2
    batch = dict(chunk_tokens=np.arange(4), chunk_start=0, chunk_len=4,
                 chunk_table=np.array([1, 0, 0]), row_tokens=np.array([5, 6]),
                 row_src=np.array([-1, -1]), row_positions=np.array([3, 0]),
                 row_tables=np.array([[2, 0, 0], [0, 0, 0]]), chunk_state_slot=3,
                 row_state_slots=np.array([1, 0]))
    ints, floats = HostPacker().pack(hybrid, batch, [None] * 3)
    ragged, _, _ = unpack(hybrid, ints, floats, np.zeros((1, 10), np.int32))
    assert int(ragged.chunk_state_slot) == 3
    np.testing.assert_array_equal(np.asarray(ragged.row_state_slots), [1, 0])
    dense_batch = {k: v for k, v in batch.items() if "state" not in k}
    ints, floats = HostPacker().pack(dense, dense_batch, [None] * 3)
    ragged, _, _ = unpack(dense, ints, floats, np.zeros((1, 10), np.int32))
    assert ragged.chunk_state_slot is None and ragged.row_state_slots is None
