"""Per-row token selection on device, inside the same compiled step as the forward pass.

Order of operations for one row, on the f32 logits [V]:
  1. add `logit_bias`, the presence/frequency penalties: bias[t] = -(presence * [count_t > 0]
     + frequency * count_t), computed in the step (`penalty_bias`) from the row's lane of the
     device-resident output counts (`count_sampled` keeps them, engine/penalty_lanes.py);
  2. greedy rows: exact argmax over the full vocabulary;
  3. other rows: keep the TOP_K_CAP largest logits as candidates, divide by temperature, keep
     the first top_k of them, then the smallest prefix whose probability mass reaches top_p,
     then those with probability >= min_p * the largest probability, and draw one.
The draw uses key = fold_in(key(seed), sample_index): it depends on the row's own seed and
output position only, so a seeded request samples the same tokens alone or in any batch.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.model.limits import TOP_K_CAP


@dataclasses.dataclass(frozen=True)
class SamplingBatch:
    """Sampling inputs of a padded batch of B rows (a pytree of arrays)."""

    temperature: jax.Array  # f32 [B]; ignored on greedy rows
    top_k: jax.Array  # int32 [B], 1..TOP_K_CAP
    top_p: jax.Array  # f32 [B], (0, 1]
    min_p: jax.Array  # f32 [B], [0, 1]
    seed_words: jax.Array  # uint32 [B, 2]: the 64-bit seed as (high word, low word)
    sample_index: jax.Array  # int32 [B]: output tokens committed before this one
    is_greedy: jax.Array  # bool [B]
    logit_bias: jax.Array  # f32 [B, V]: penalties as an additive bias (zeros when none)


jax.tree_util.register_dataclass(
    SamplingBatch, data_fields=[f.name for f in dataclasses.fields(SamplingBatch)],
    meta_fields=[])


def sample(logits, batch: SamplingBatch, *, draws: bool = True):
    """Pick one token per row: logits f32 [B, V] -> int32 [B]; greedy rows get the argmax.

    `draws=False` (static) compiles the argmax alone, for steps the host knows to be all
    greedy: on the H200 the top-k of the draws is a segmented sort of the whole vocabulary,
    1.2 ms of an 8.7 ms step at 64 rows and 2.5 of 16 at 256 (runner_bench run 11).
    On the CPU a step whose rows are all greedy also skips them at run time (lax.cond: XLA
    CPU runs it inline). On the GPU that cond is not used: XLA:GPU evaluates a
    conditional's predicate on the host, which blocks the launching thread until the step's
    logits exist, so step n+1 could not be queued behind step n (runner_bench run 10: at 64
    rows the pipelined step fell to the synchronous one, 11.5 ms, the device idle 47%)."""
    logits = logits.astype(jnp.float32) + batch.logit_bias
    greedy = argmax(logits)
    if not draws:
        return greedy

    def with_draws():
        candidates, candidate_ids = jax.lax.top_k(logits, TOP_K_CAP)  # [B, TOP_K_CAP]
        keys = jax.vmap(row_key)(batch.seed_words, batch.sample_index)
        temperature = jnp.where(batch.is_greedy, 1.0, batch.temperature)
        picks = jax.vmap(_draw_candidate)(keys, candidates, temperature, batch.top_k,
                                          batch.top_p, batch.min_p)
        drawn = jnp.take_along_axis(candidate_ids, picks[:, None], axis=1)[:, 0]
        return jnp.where(batch.is_greedy, greedy, drawn.astype(jnp.int32))

    return unless_all_greedy(batch.is_greedy, with_draws, lambda: greedy)


def argmax(logits):
    """jnp.argmax over the last axis (the first maximum, or the first NaN), int32, as two
    plain reductions: XLA CPU runs argmax's (value, index) reduce as a scalar loop, 0.23 ms
    for one row of a 49k vocabulary and 1.8 ms for 8 (0.08 and 0.24 ms this way)."""
    top = jnp.max(logits, axis=-1, keepdims=True)
    hit = (logits == top) | jnp.isnan(logits)
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.min(jnp.where(hit, index, logits.shape[-1] - 1), axis=-1)


def unless_all_greedy(is_greedy, with_draws, greedy_only):
    """with_draws(), or on the CPU greedy_only() when every row is greedy (a run-time skip:
    see `sample` for why the GPU evaluates with_draws, or compiles a variant without it)."""
    def skip_when_greedy():
        return jax.lax.cond(jnp.all(is_greedy), greedy_only, with_draws)

    return jax.lax.platform_dependent(cpu=skip_when_greedy, default=with_draws)


def distributions(logits, batch: SamplingBatch):
    """The distribution each row's draw follows, f32 [B, V]: the filtered, tempered
    candidates of `sample` scattered over the vocabulary (one-hot at the argmax on greedy
    rows). Speculative rejection sampling needs it whole (model/spec_verify.py)."""
    logits = logits.astype(jnp.float32) + batch.logit_bias
    candidates, candidate_ids = jax.lax.top_k(logits, TOP_K_CAP)
    temperature = jnp.where(batch.is_greedy, 1.0, batch.temperature)
    filtered = jax.vmap(filtered_candidates)(candidates, temperature, batch.top_k,
                                             batch.top_p, batch.min_p)
    rows = jnp.arange(logits.shape[0])[:, None]
    probs = jnp.zeros_like(logits).at[rows, candidate_ids].set(jax.nn.softmax(filtered, -1))
    one_hot = jax.nn.one_hot(argmax(logits), logits.shape[-1], dtype=jnp.float32)
    return jnp.where(batch.is_greedy[:, None], one_hot, probs)


def row_key(seed_words, sample_index):
    """The random key of one row's draw: the seed's key folded with the output position."""
    return jax.random.fold_in(jax.random.wrap_key_data(seed_words), sample_index)


def filtered_candidates(candidates, temperature, top_k, top_p, min_p):
    """Tempered candidate logits [TOP_K_CAP] (sorted descending) with the filtered-out ones at
    -inf. The first candidate always survives."""
    scaled = candidates / temperature
    rank = jnp.arange(candidates.shape[-1])
    keep = rank < top_k
    probs = jax.nn.softmax(jnp.where(keep, scaled, -jnp.inf))
    mass_before = jnp.cumsum(probs) - probs
    keep &= (mass_before < top_p) | (top_p >= 1.0)
    # p_i >= min_p * p_max  <=>  scaled_i - scaled_0 >= log(min_p); log(0) = -inf keeps all.
    keep &= scaled - scaled[0] >= jnp.log(min_p)
    return jnp.where(keep | (rank == 0), scaled, -jnp.inf)


def _draw_candidate(key, candidates, temperature, top_k, top_p, min_p):
    """Index (into the candidates) of one draw for one row."""
    logits = filtered_candidates(candidates, temperature, top_k, top_p, min_p)
    return jax.random.categorical(key, logits).astype(jnp.int32)


# Lane 0 of the output counts belongs to no request: rows without penalties (and padding)
# read its zeros and never add to it. Must equal engine.penalty_lanes.DUMMY_PENALTY_LANE.
DUMMY_PENALTY_LANE = 0


def penalty_bias(counts, presence, frequency):
    """The additive bias f32 [B, V] of presence/frequency penalties (f32 [B] each) over each
    row's output counts int32 [B, V]; zero where both penalties are 0. Works on numpy inputs
    too (tests compare it with the counts of a committed output)."""
    counts = counts.astype(jnp.float32)
    seen = (counts > 0).astype(jnp.float32)
    return -(presence[:, None] * seen + frequency[:, None] * counts)


def count_sampled(counts, lanes, tokens):
    """The output counts int32 [L + 1, V] after one step: each row's sampled token (int32
    [B]) counted in its lane (int32 [B]); rows on DUMMY_PENALTY_LANE add nothing, so it
    stays zero. A lane appears at most once per step (penalty rows never verify drafts)."""
    return counts.at[lanes, tokens].add((lanes != DUMMY_PENALTY_LANE).astype(jnp.int32))


# ----------------------------------------------------------------------------- host side


def seed_words(seed: int) -> tuple[int, int]:
    """A signed or unsigned integer seed as its 64-bit two's complement (high, low) words."""
    value = seed & 0xFFFF_FFFF_FFFF_FFFF
    return value >> 32, value & 0xFFFF_FFFF


def output_counts(output_ids, vocab_size: int) -> np.ndarray:
    """How often each token occurs in a committed output: int32 [V] (a lane's contents)."""
    counts = np.bincount(np.asarray(output_ids, np.int64), minlength=vocab_size)
    return counts[:vocab_size].astype(np.int32)


def host_batch(specs, num_rows: int, vocab_size: int, outputs=None) -> SamplingBatch:
    """Numpy inputs for `num_rows` rows from SampleSpecs (engine/runner_api.py); rows past
    len(specs) (and None specs) are greedy padding. `outputs`: each spec's committed output,
    whose counts make its penalty bias (tests; the engine keeps counts on the device)."""
    temperature = np.ones(num_rows, np.float32)
    top_k = np.full(num_rows, TOP_K_CAP, np.int32)
    top_p, min_p = np.ones(num_rows, np.float32), np.zeros(num_rows, np.float32)
    words, index = np.zeros((num_rows, 2), np.uint32), np.zeros(num_rows, np.int32)
    is_greedy = np.ones(num_rows, np.bool_)
    bias = np.zeros((num_rows, vocab_size), np.float32)
    for row, spec in enumerate(specs):
        if spec is None:
            continue
        params = spec.params
        is_greedy[row] = params.is_greedy
        temperature[row] = max(params.temperature, 0.0)
        top_k[row] = TOP_K_CAP if params.top_k <= 0 else min(params.top_k, TOP_K_CAP)
        top_p[row], min_p[row] = params.top_p, params.min_p
        words[row] = seed_words(params.seed)
        index[row] = spec.sample_index
        if outputs is not None:
            counts = output_counts(outputs[row], vocab_size)[None]
            bias[row] = np.asarray(penalty_bias(
                counts, np.float32([params.presence_penalty]),
                np.float32([params.frequency_penalty])))[0]
    return SamplingBatch(temperature, top_k, top_p, min_p, words, index, is_greedy, bias)
