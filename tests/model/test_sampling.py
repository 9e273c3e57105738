"""The on-device sampler: greedy, filters, seeded reproducibility across batch shapes, penalties."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.engine.request import TOP_K_CAP, SamplingParams
from ninfer_jax.engine.runner_api import SampleSpec
from ninfer_jax.model import sampling

VOCAB = 300
sample = jax.jit(sampling.sample)


def draw(logits, specs, outputs=None):
    """Tokens for logits [B, V] and one SampleSpec (or None = greedy padding) per row;
    `outputs`: each row's committed output (its penalties' counts)."""
    batch = sampling.host_batch(specs, len(specs), logits.shape[1], outputs)
    return np.asarray(sample(np.asarray(logits, np.float32), batch))


def spec(index=0, **params):
    return SampleSpec(SamplingParams(**params), sample_index=index)


def random_logits(rows, seed=0):
    return np.random.default_rng(seed).normal(0, 3, (rows, VOCAB)).astype(np.float32)


def test_greedy_rows_take_the_exact_argmax_over_the_whole_vocabulary():
    logits = random_logits(8)
    logits[3, 250] = logits[3].max() + 1e-3  # a winner far outside any top-k candidate order
    tokens = draw(logits, [spec(temperature=0.0)] * 8)
    np.testing.assert_array_equal(tokens, logits.argmax(axis=1))


def test_top_k_one_equals_greedy_whatever_the_seed():
    logits = random_logits(8, seed=1)
    specs = [spec(index=i, temperature=1.5, top_k=1, seed=100 + i) for i in range(8)]
    np.testing.assert_array_equal(draw(logits, specs), logits.argmax(axis=1))


def test_a_seeded_row_samples_the_same_tokens_alone_and_in_a_batch_of_eight():
    logits = random_logits(8, seed=2)
    flat = np.tile(np.linspace(1.0, 0.0, VOCAB, dtype=np.float32), (8, 1))  # many plausible picks
    for index in range(20):
        mine = spec(index=index, temperature=1.0, top_p=0.95, seed=-12345)
        alone = draw(flat[:1], [mine])[0]
        others = [spec(index=index + r, temperature=0.7, seed=r) for r in range(7)]
        batch_logits = logits.copy()
        batch_logits[5] = flat[0]
        batched = draw(batch_logits, others[:5] + [mine] + others[5:])[5]
        assert alone == batched


def test_different_seeds_and_positions_give_different_draws():
    flat = np.zeros((64, VOCAB), np.float32)
    by_position = draw(flat, [spec(index=i, seed=7) for i in range(64)])
    by_seed = draw(flat, [spec(index=0, seed=s) for s in range(64)])
    assert len(set(by_position)) > 10 and len(set(by_seed)) > 10
    assert set(by_position) <= set(range(VOCAB))


def empirical(logits_row, num_draws, output_ids=(), **params):
    """Frequencies of each vocabulary id over num_draws independent draws of one row."""
    logits = np.tile(logits_row, (num_draws, 1))
    tokens = draw(logits, [spec(index=i, seed=3, **params) for i in range(num_draws)],
                  [output_ids] * num_draws)
    return np.bincount(tokens, minlength=VOCAB) / num_draws


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.fixture(scope="module")
def ladder():
    """Logits whose 6 best tokens are 5..0 (others far below), on scrambled ids."""
    row = np.full(VOCAB, -30.0, np.float32)
    ids = np.random.default_rng(4).permutation(VOCAB)[:6]
    row[ids] = np.arange(5, -1, -1, dtype=np.float32) * 0.5
    return row, ids


def test_temperature_and_top_k_follow_the_renormalized_distribution(ladder):
    row, ids = ladder
    freq = empirical(row, 4000, temperature=0.5, top_k=3)
    expected = softmax(row[ids[:3]] / 0.5)
    np.testing.assert_allclose(freq[ids[:3]], expected, atol=0.03)
    assert freq[ids[:3]].sum() == 1.0


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass(ladder):
    row, ids = ladder
    probs = softmax(row[ids])  # the tail at -30 is negligible
    top_p = float(probs[:2].sum()) + 0.01  # needs exactly three tokens
    freq = empirical(row, 4000, temperature=1.0, top_p=top_p)
    np.testing.assert_allclose(freq[ids[:3]], probs[:3] / probs[:3].sum(), atol=0.03)
    assert freq[ids[:3]].sum() == 1.0


def test_min_p_drops_tokens_below_the_fraction_of_the_best(ladder):
    row, ids = ladder
    probs = softmax(row[ids])
    min_p = float(probs[3] / probs[0]) + 1e-3  # the 4th token falls just below the bar
    freq = empirical(row, 4000, temperature=1.0, min_p=min_p)
    assert freq[ids[:3]].sum() == 1.0 and freq[ids[2]] > 0


def test_candidates_are_capped_at_twenty():
    row = np.zeros(VOCAB, np.float32)
    row[:40] = 1.0 - np.arange(40) * 1e-4  # 40 near-equal leaders: only the first 20 may win
    freq = empirical(row, 3000, temperature=1.0, top_k=0)
    assert freq[:TOP_K_CAP].sum() == 1.0
    assert (freq[:TOP_K_CAP] > 0).sum() > 15


def test_penalty_bias_counts_committed_output():
    counts = sampling.output_counts([5, 7, 5, 5], 10)
    assert counts.dtype == np.int32 and counts.tolist() == [0] * 5 + [3, 0, 1, 0, 0]
    bias = sampling.penalty_bias(counts[None], np.float32([0.5]), np.float32([0.25]))[0]
    expected = np.zeros(10, np.float32)
    expected[5] = -(0.5 + 3 * 0.25)
    expected[7] = -(0.5 + 0.25)
    np.testing.assert_allclose(bias, expected)


def test_the_device_bias_is_the_host_formula():
    """Bit for bit for penalties with few significant bits (0.5, -1.25: every product is
    exact); otherwise within an ulp, XLA being free to fuse the multiply-add."""
    rng = np.random.default_rng(4)
    counts = rng.integers(0, 40, (6, VOCAB)).astype(np.int32) * (rng.random((6, VOCAB)) < 0.1)
    device_bias = jax.jit(sampling.penalty_bias)
    dyadic = [rng.integers(-128, 128, 6).astype(np.float32) / 64 for _ in range(2)]
    np.testing.assert_array_equal(np.asarray(device_bias(counts, *dyadic)),
                                  sampling.penalty_bias(counts, *dyadic))
    arbitrary = [rng.uniform(-2, 2, 6).astype(np.float32) for _ in range(2)]
    np.testing.assert_allclose(np.asarray(device_bias(counts, *arbitrary)),
                               sampling.penalty_bias(counts, *arbitrary), rtol=2e-7)


def test_count_sampled_counts_each_lane_and_leaves_the_dummy_lane_at_zero():
    counts = np.zeros((4, 10), np.int32)
    counts[2, 3] = 5  # a lane's earlier output
    lanes = np.int32([0, 2, 0, 3, 1])
    tokens = np.int32([9, 3, 4, 3, 0])
    got = np.asarray(jax.jit(sampling.count_sampled)(counts, lanes, tokens))
    expected = counts.copy()
    expected[2, 3], expected[3, 3], expected[1, 0] = 6, 1, 1
    np.testing.assert_array_equal(got, expected)


def test_the_dummy_penalty_lane_is_the_engines():
    from ninfer_jax.engine.penalty_lanes import DUMMY_PENALTY_LANE
    assert sampling.DUMMY_PENALTY_LANE == DUMMY_PENALTY_LANE


def test_penalties_steer_greedy_and_sampled_rows_away_from_repeats():
    logits = np.zeros((2, VOCAB), np.float32)
    logits[:, 10], logits[:, 11] = 2.0, 1.5
    history = [10, 10, 3]
    plain = draw(logits, [spec(temperature=0.0)] * 2, [history] * 2)
    assert list(plain) == [10, 10]
    penalized = draw(logits, [spec(temperature=0.0, frequency_penalty=0.3),
                              spec(temperature=0.0, presence_penalty=0.6)], [history] * 2)
    assert list(penalized) == [11, 11]
    freq = empirical(logits[0], 2000, temperature=1.0, top_k=2, presence_penalty=0.5,
                     output_ids=(10,))
    np.testing.assert_allclose(freq[[10, 11]], [0.5, 0.5], atol=0.04)


def test_argmax_is_jnp_argmax_with_ties_and_nans():
    from ninfer_jax.model.sampling import argmax
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((6, 1000)).astype(np.float32)
    logits[1, [7, 500]] = 9.0  # a tie: the first wins
    logits[2, 999] = 9.0  # the last index
    logits[3, [40, 900]] = np.nan  # the first NaN wins, as jnp.argmax
    logits[4] = -np.inf
    got = np.asarray(jax.jit(argmax)(jnp.asarray(logits)))
    np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(logits), axis=-1)))
    assert got[1:4].tolist() == [7, 999, 40] and got.dtype == np.int32

