"""--spec mtp on the real hybrid model (random tiny Qwen3.5 weights with their MTP head) through
the JaxRunner and the scheduler. transformers has no MTP module (it drops `mtp.*` on load), so
the head is checked against a numpy reference written from the formula (model/mtp.py): the
drafts a running sequence holds equal the reference's, computed from scratch over its
committed tokens, after a prompt of several chunks and after speculative rounds (so the
head's own KV, written chunk by chunk and round by round, is what a full recompute gives).
Greedy output equals plain decoding on a runner without speculation; seeded sampled output
(drafts drawn from the head's q, rejection sampling in the verify step) is reproducible,
and its tokens follow plain sampling's distribution (test_spec_verify.py checks the rule)."""
from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

import engine_drive
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import GenerationRequest, SamplingParams
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.speculation import SpeculativeConfig
from ninfer_jax.engine.state_slots import StateSlotPool

VOCAB, PAGE, CONTEXT, LANES, SLOTS, PAGES, CHUNK = 64, 4, 96, 8, 10, 160, 8
SPEC = SpeculativeConfig("mtp", 3)
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def artifact():
    config = dataclasses.replace(PRESETS["qwen3.5-tiny"].config, vocab_size=VOCAB,
                                 max_position_embeddings=CONTEXT)
    assert config.mtp_num_layers == 1
    params = random_params(config, seed=7, dtype="f32")
    for layer, kind in zip(params["layers"], config.layer_types):
        if kind == "linear_attention":  # the recurrent state decides tokens (as in
            layer["out"] = layer["out"] * 16.0  # test_hybrid_engine.py)
    return types.SimpleNamespace(config=config, params=params)


def make_runner(artifact, spec: SpeculativeConfig | None):
    runner = JaxRunner(artifact, num_pages=PAGES, page_size=PAGE,
                       max_batch=spec.row_capacity(LANES) if spec else LANES,
                       max_chunk_rows=LANES, max_context=CONTEXT, prefill_chunk=CHUNK,
                       state_slot_capacity=SLOTS, step_shapes="essential",
                       speculative=spec is not None,
                       mtp_drafts=spec.mtp_drafts if spec else 0)
    runner.warmup()
    return runner


@pytest.fixture(scope="module")
def mtp_runner(artifact):
    return make_runner(artifact, SPEC)


@pytest.fixture(scope="module")
def plain_runner(artifact):
    return make_runner(artifact, None)


def scheduler_for(runner, lanes=LANES, num_pages=PAGES, reuse=False):
    config = EngineConfig(max_concurrency=lanes, prefill_chunk=CHUNK, max_context=CONTEXT,
                          prefix_reuse=reuse, speculative=SPEC if runner.num_drafts else None)
    return Scheduler(config, PagePool(num_pages), page_size=PAGE, max_batch=runner.max_batch,
                     slots=StateSlotPool(SLOTS), max_chunk_rows=runner.max_chunk_rows)


def generate(runner, prompts, sampling=GREEDY, max_tokens=24, lanes=LANES, **pool):
    """Every prompt at once; `sampling` one SamplingParams for all, or one per prompt."""
    scheduler = scheduler_for(runner, lanes, **pool)
    each = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
    finals = engine_drive.run_requests(scheduler, runner, [
        GenerationRequest(f"r{i}", list(ids), params, max_tokens)
        for i, (ids, params) in enumerate(zip(prompts, each))])
    return [list(f.output_ids) for f in finals], scheduler.counters


def prompt(salt: int, length: int = 19) -> list[int]:
    return np.random.default_rng(salt).integers(1, VOCAB, length).tolist()


# ----------------------------------------------------------------------------- the reference


def _norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + weight)


def _rope(x, positions, rotary_dim, theta):
    half = rotary_dim // 2
    inv_freq = 1.0 / theta ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = positions[:, None, None] * inv_freq  # [T, 1, half]
    a, b = x[..., :half], x[..., half:rotary_dim]
    rotated = np.concatenate([a * np.cos(angles) - b * np.sin(angles),
                              b * np.cos(angles) + a * np.sin(angles)], axis=-1)
    return np.concatenate([rotated, x[..., rotary_dim:]], axis=-1)


def _attention_layer(layer, x, config):
    """A gated full-attention decoder layer over positions 0..T-1, causal, dense."""
    T, D, NH, NK, eps = (x.shape[0], config.head_dim, config.num_heads, config.num_kv_heads,
                         config.rms_norm_eps)
    h = _norm(x, layer["attn_norm"], eps)
    q = (h @ layer["wq"]).reshape(T, NH, 2 * D)
    q, gate = q[..., :D], q[..., D:]
    k = (h @ layer["wk"]).reshape(T, NK, D)
    v = (h @ layer["wv"]).reshape(T, NK, D)
    positions = np.arange(T, dtype=np.float64)
    rotary = int(D * config.partial_rotary_factor)
    q = _rope(_norm(q, layer["q_norm"], eps), positions, rotary, config.rope_theta)
    k = _rope(_norm(k, layer["k_norm"], eps), positions, rotary, config.rope_theta)
    k, v = np.repeat(k, NH // NK, axis=1), np.repeat(v, NH // NK, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) * D ** -0.5
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", weights, v) / (1.0 + np.exp(-gate))
    x = x + out.reshape(T, NH * D) @ layer["wo"]
    h = _norm(x, layer["mlp_norm"], eps)
    gate_proj = h @ layer["w_gate"]
    return x + (gate_proj / (1.0 + np.exp(-gate_proj)) * (h @ layer["w_up"])) @ layer["w_down"]


def reference_drafts(artifact, tokens, k, hidden):
    """The MTP head's k greedy drafts after tokens x_0..x_{n-1}: positions 0..n-2 pair
    embed(x_{p+1}) with the target's final-normed h_p (`hidden`, at least n - 1 rows), then
    each draft extends the sequence."""
    config, params = artifact.config, artifact.params
    mtp, eps = params["mtp"], config.rms_norm_eps
    hidden = hidden[:len(tokens) - 1]
    head = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
    inputs, drafts = list(tokens[1:]), []
    for _ in range(k):
        e = _norm(params["embed"][inputs], mtp["pre_fc_norm_embedding"], eps)
        g = _norm(hidden, mtp["pre_fc_norm_hidden"], eps)
        u = _attention_layer(mtp["layers"][0], np.concatenate([e, g], -1) @ mtp["fc"], config)
        out = _norm(u, mtp["norm"], eps)
        drafts.append(int(np.argmax(out[-1] @ head)))
        inputs.append(drafts[-1])
        hidden = np.concatenate([hidden, out[-1:]])
    return drafts


def target_hidden(artifact, tokens):
    """The target's final-normed states at every position (our hybrid forward, which
    test_hybrid_vs_transformers.py checks against transformers), in one chunk."""
    hidden = engine_drive.one_chunk(artifact, tokens, PAGE, hidden=True)
    return np.asarray(hidden, np.float64)


# ----------------------------------------------------------------------------- tests


def test_drafts_equal_the_reference_after_chunks_and_rounds(artifact, mtp_runner):
    scheduler = scheduler_for(mtp_runner, lanes=1)
    held = engine_drive.drafts_held(scheduler, mtp_runner,  # tokens so far -> drafts after them
                                    GenerationRequest("r", prompt(3), GREEDY, 40))
    final = max(held, key=len)
    hidden = target_hidden(artifact, list(final))
    # after the prompt's three chunks (chunk_next twice), then after rounds of all kinds
    assert min(map(len, held)) == 20 and len(held) >= 10
    assert scheduler.counters.spec_rounds > 0
    for tokens, drafts in held.items():
        assert drafts == reference_drafts(artifact, tokens, 3, hidden), len(tokens)


def test_greedy_equals_plain_decoding_alone_and_eight_concurrent(mtp_runner, plain_runner):
    prompts = [prompt(salt) for salt in range(LANES)]
    plain = [generate(plain_runner, [p], lanes=1)[0][0] for p in prompts]
    alone, counters = generate(mtp_runner, prompts[:1], lanes=1)
    assert alone == plain[:1] and counters.spec_rounds > 0
    together, counters = generate(mtp_runner, prompts)
    assert together == plain


def test_pauses_and_prefix_reuse_keep_greedy_output(mtp_runner, plain_runner):
    prompts = [prompt(salt) for salt in range(LANES)]
    reference = generate(plain_runner, prompts)[0]
    for reuse in (False, True):
        paused, counters = generate(mtp_runner, prompts, num_pages=50, reuse=reuse)
        assert counters.preemptions > 0 and counters.spec_rounds > 0
        assert paused == reference


def test_seeded_sampling_is_reproducible_alone_or_batched(mtp_runner):
    """Sampled drafts come from q and commit by rejection sampling: the same seed gives the
    same tokens again, alone or among other requests (every key is the row's own)."""
    prompts = [prompt(salt) for salt in range(4)]
    sampled = SamplingParams(temperature=1.0, top_p=0.95, seed=11)
    together, counters = generate(mtp_runner, prompts, sampling=sampled)
    assert counters.spec_rounds > 0 and counters.spec_accepted_tokens > 0
    assert generate(mtp_runner, prompts, sampling=sampled)[0] == together
    assert generate(mtp_runner, prompts[2:3], sampling=sampled, lanes=1)[0] == together[2:3]


def test_sampled_tokens_follow_plain_sampling_over_many_seeds(mtp_runner, plain_runner):
    """1,000 seeds of one prompt, 4 tokens each, plain and with MTP drafts: per output
    position the token counts agree (chi-square contingency). Position 0 is the prefill's
    sample; 1..3 come from rounds, most drafts rejected by the random head, so the residual
    draws matter. Reading the verify's q one draft later fails it (tried)."""
    (plain, _), (drafted, _) = (engine_drive.seeded_outputs(generate, runner, prompt(1),
                                                            lanes=LANES)
                                for runner in (plain_runner, mtp_runner))
    engine_drive.assert_same_distribution(plain, drafted, range(1, 4))
