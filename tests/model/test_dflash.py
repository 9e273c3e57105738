"""--spec dflash / dflash2 on the real hybrid model (random tiny Qwen3.5 weights with random
DFlash and DFlash2 drafters) through the JaxRunner and the scheduler. The drafters are
checked against a numpy reference written from the public model's formula (model/dflash.py
docstring): the drafts a running sequence holds equal the reference's, computed from scratch
over its committed tokens, after a prompt of several chunks and after speculative rounds (so
the context K/V, written chunk by chunk and round by round into the pages, is what a full
recompute gives). DFlash2's window (8 here) is crossed, its convolutions and selector run.
Greedy output equals plain decoding, alone and 8 concurrent, through pauses and prefix reuse;
seeded sampled output is reproducible. The DFlash2 runner proposes through a reduced
proposal head (--lm-head-draft): its drafts stay in the head's vocabulary. On the CPU no
compiled step sorts the vocabulary."""
from __future__ import annotations

import dataclasses
import re
import types

import jax
import numpy as np
import pytest

import engine_drive
from ninfer_jax.artifact.components import vocabulary_subset_head
from ninfer_jax.artifact.drafters import preset_dflash_config, random_dflash
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import GenerationRequest, SamplingParams
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.speculation import SpeculativeConfig
from ninfer_jax.engine.state_slots import StateSlotPool

VOCAB, PAGE, CONTEXT, LANES, SLOTS, PAGES, CHUNK, K = 64, 4, 96, 8, 10, 160, 8, 3
SUBSET = 40  # the reduced proposal head's token ids: 0..SUBSET-1
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def artifact():
    config = dataclasses.replace(PRESETS["qwen3.5-tiny"].config, vocab_size=VOCAB,
                                 max_position_embeddings=CONTEXT)
    params = random_params(config, seed=7, dtype="f32")
    for layer, kind in zip(params["layers"], config.layer_types):
        if kind == "linear_attention":  # the recurrent state decides tokens
            layer["out"] = layer["out"] * 16.0
    # the mask token's row at zero (a trained one is learnt): the random drafters then draft
    # from their context instead of echoing the mask, and sometimes agree with the target
    params["embed"][VOCAB - 1] = 0.0
    drafters = {}
    for variant in ("dflash", "dflash2"):
        drafters[variant] = preset_dflash_config(config, variant, tiny=True)
        params[variant] = random_dflash(drafters[variant], seed=3, dtype="f32")
    head = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
    params["draft_head"] = vocabulary_subset_head(head, range(SUBSET))
    return types.SimpleNamespace(config=config, params=params, drafters=drafters)


def make_runner(artifact, variant: str | None, head: bool = False,
                one_row_step: bool = True):
    """A runner with the essential step shapes compiled (each compile of a drafting step
    takes several seconds on the CPU). Without `one_row_step` a step of fewer rows runs
    padded in the largest decode step, which leaves its tokens and drafts as they are, and
    the one-row step is not compiled; plain decoding, the reference, has a single row bucket
    (LANES) for the same reason."""
    params = {k: v for k, v in artifact.params.items()
              if k not in ("dflash", "dflash2", "draft_head") or k == variant
              or (k == "draft_head" and head)}
    spec = SpeculativeConfig(variant, K) if variant else None
    runner = JaxRunner(types.SimpleNamespace(config=artifact.config, params=params),
                       num_pages=PAGES, page_size=PAGE,
                       max_batch=spec.row_capacity(LANES) if spec else LANES,
                       min_rows=None if spec else LANES,
                       max_chunk_rows=LANES, max_context=CONTEXT, prefill_chunk=CHUNK,
                       state_slot_capacity=SLOTS, step_shapes="essential",
                       speculative=spec is not None, dflash_drafts=K if spec else 0,
                       dflash_config=artifact.drafters.get(variant))
    if one_row_step:
        runner.warmup()
    else:
        runner.compile_shapes([shape for shape in runner.essential_shapes() if shape[1] > 1])
    return runner


@pytest.fixture(scope="module")
def dflash_runner(artifact):
    return make_runner(artifact, "dflash")


@pytest.fixture(scope="module")
def dflash2_runner(artifact):
    return make_runner(artifact, "dflash2", head=True)


@pytest.fixture(scope="module")
def plain_runner(artifact):
    return make_runner(artifact, None)


def scheduler_for(runner, lanes=LANES, num_pages=PAGES, reuse=False):
    spec = SpeculativeConfig(runner.dflash.variant, K) if runner.num_drafts else None
    config = EngineConfig(max_concurrency=lanes, prefill_chunk=CHUNK, max_context=CONTEXT,
                          prefix_reuse=reuse, speculative=spec)
    slots = StateSlotPool(runner.state_slot_capacity, holds_state=runner.slots_hold_state)
    return Scheduler(config, PagePool(num_pages), page_size=PAGE, max_batch=runner.max_batch,
                     slots=slots, max_chunk_rows=runner.max_chunk_rows)


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
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rope(x, positions, theta):
    D = x.shape[-1]
    half = D // 2
    inv_freq = 1.0 / theta ** (np.arange(0, D, 2) / D)
    angles = positions[:, None, None] * inv_freq
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * np.cos(angles) - b * np.sin(angles),
                           b * np.cos(angles) + a * np.sin(angles)], axis=-1)


def _conv(x, dynamic, base, group):
    T, H = x.shape
    out = np.zeros((T, H // group, group))
    for o in range(base.shape[0]):
        shifted = np.concatenate([np.zeros((o, H)), x[:T - o]]).reshape(T, H // group, group)
        out += (base[o].reshape(H // group, group) + dynamic[:, o, :, None]) * shifted
    return out.reshape(T, H)


def reference_drafts(artifact, variant, tokens, k, taps, head=None):
    """The drafter's k greedy drafts after tokens x_0..x_{n-1}: context = the target's taps
    at positions 0..n-2, block [x_{n-1}, MASK x k] at n-1..n-1+k, dense and non-causal."""
    cfg, tree = artifact.drafters[variant], artifact.params[variant]
    p, eps, D = artifact.params, cfg.rms_norm_eps, cfg.head_dim
    NH, NK, T, n = cfg.num_heads, cfg.num_kv_heads, k + 1, len(tokens)
    ctx = _norm(taps[:n - 1] @ tree["fc"], tree["hidden_norm"], eps)
    x = p["embed"][[tokens[-1]] + [cfg.mask_token_id] * k].astype(np.float64)
    block_pos = np.arange(n - 1, n - 1 + T, dtype=np.float64)
    ctx_pos = np.arange(n - 1, dtype=np.float64)
    window = cfg.sliding_window or 10 ** 9
    visible = np.concatenate([(block_pos[:, None] - ctx_pos[None]) < window,
                              np.ones((T, T), bool)], axis=1)  # [T, n - 1 + T]
    v2 = variant == "dflash2"
    for layer in tree["layers"]:
        h = _norm(x, layer["attn_norm"], eps)
        if v2:
            dyn = (h @ layer["attn_conv_proj"]).reshape(T, 2, cfg.conv_kernel_size, -1)
            h = _conv(h, dyn[:, 0], layer["attn_conv_base"][0], cfg.conv_group_size)
        q = _rope(_norm((h @ layer["wq"]).reshape(T, NH, D), layer["q_norm"], eps), block_pos,
                  cfg.rope_theta)
        keys = np.concatenate([
            _rope(_norm((ctx @ layer["wk"]).reshape(-1, NK, D), layer["k_norm"], eps), ctx_pos,
                  cfg.rope_theta),
            _rope(_norm((h @ layer["wk"]).reshape(T, NK, D), layer["k_norm"], eps), block_pos,
                  cfg.rope_theta)])
        values = np.concatenate([(ctx @ layer["wv"]).reshape(-1, NK, D),
                                 (h @ layer["wv"]).reshape(T, NK, D)])
        keys, values = np.repeat(keys, NH // NK, axis=1), np.repeat(values, NH // NK, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, keys) * D ** -0.5
        scores = np.where(visible[None], scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out = np.einsum("hqk,khd->qhd", weights, values).reshape(T, NH * D) @ layer["wo"]
        if v2:
            out = _conv(out, dyn[:, 1], layer["attn_conv_base"][1], cfg.conv_group_size)
        x = x + out
        h = _norm(x, layer["mlp_norm"], eps)
        if v2:
            dyn = (h @ layer["mlp_conv_proj"]).reshape(T, 2, cfg.conv_kernel_size, -1)
            h = _conv(h, dyn[:, 0], layer["mlp_conv_base"][0], cfg.conv_group_size)
        gate = h @ layer["w_gate"]
        out = (gate / (1.0 + np.exp(-gate)) * (h @ layer["w_up"])) @ layer["w_down"]
        if v2:
            out = _conv(out, dyn[:, 1], layer["mlp_conv_base"][1], cfg.conv_group_size)
        x = x + out
    hidden = _norm(x[1:], tree["norm"], eps)
    if head is not None:
        logits = np.full((k, cfg.vocab_size), -np.inf)
        logits[:, head["token_ids"]] = hidden @ head["weight"]
    else:
        table = p["embed"].T if artifact.config.tie_word_embeddings else p["lm_head"]
        logits = hidden @ table
    logits = logits * cfg.output_multiplier
    if cfg.final_logit_softcapping:
        logits = np.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
    if not v2:
        return np.argmax(logits, axis=-1).tolist()
    selector, previous, drafts = tree["selector"], tokens[-1], []
    projected = hidden @ selector["hidden_projection"]
    for j in range(k):
        candidates = np.argsort(-logits[j], kind="stable")[:cfg.selector_top_k]
        scores = logits[j, candidates] + (
            selector["successor"][candidates]
            @ (selector["predecessor"][previous] * projected[j]))
        previous = int(candidates[np.argmax(scores)])
        drafts.append(previous)
    return drafts


def target_taps(artifact, variant, tokens):
    """The target's residual after each tapped layer at every position, in one chunk."""
    taps = engine_drive.one_chunk(artifact, tokens, PAGE,
                                         taps=artifact.drafters[variant].target_layer_ids)
    return np.asarray(taps, np.float64)


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_drafts_equal_the_reference_after_chunks_and_rounds(artifact, variant, request):
    check_drafts(artifact, request.getfixturevalue(f"{variant}_runner"), variant)


def check_drafts(artifact, runner, variant):
    """The drafts a sequence holds after every step equal the reference's over its tokens."""
    scheduler = scheduler_for(runner, lanes=1)
    held = engine_drive.drafts_held(scheduler, runner,  # tokens so far -> drafts after them
                                    GenerationRequest("r", prompt(3), GREEDY, 40))
    final = max(held, key=len)
    taps = target_taps(artifact, variant, list(final))
    head = artifact.params["draft_head"] if "draft_head" in runner.params else None
    assert min(map(len, held)) == 20 and len(held) >= 10  # the prompt took three chunks
    assert scheduler.counters.spec_rounds > 0
    for tokens, drafts in held.items():
        assert drafts == reference_drafts(artifact, variant, tokens, K, taps, head), len(tokens)
        if head is not None:
            assert max(drafts) < SUBSET


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's lowering of top_k")
@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_steps_sort_no_vocabulary_on_cpu(variant, request):
    """Every top_k over the vocabulary in a drafting step runs as XLA:CPU's TopK kernel: a
    DFlash2 selector's top_k over [R, K, V] became a stable sort of the whole vocabulary
    for each row and position (a one-row step of qwen3.5-tiny's 248k vocabulary: 158 ms with
    it, 8 ms without)."""
    runner = request.getfixturevalue(f"{variant}_runner")
    for shape, executable in runner._executables.items():
        sorts = [line.split(" sort(")[0] for line in executable.as_text().splitlines()
                 if " sort(" in line]  # the instruction's result shapes, before " sort("
        assert not [s for s in sorts if re.search(rf"[\[,]{VOCAB}\]", s)], shape


def test_greedy_equals_plain_decoding_alone_and_eight_concurrent(dflash_runner,
                                                                  dflash2_runner,
                                                                  plain_runner):
    prompts = [prompt(salt) for salt in range(LANES)]
    plain = [generate(plain_runner, [p], lanes=1)[0][0] for p in prompts]
    alone, counters = generate(dflash_runner, prompts[:1], lanes=1)
    assert alone == plain[:1] and counters.spec_rounds > 0
    for runner in (dflash_runner, dflash2_runner):
        together, counters = generate(runner, prompts)
        assert together == plain and counters.spec_rounds > 0


def test_pauses_and_prefix_reuse_keep_greedy_output(dflash_runner, plain_runner):
    check_pauses_and_prefix_reuse(dflash_runner, plain_runner)


def check_pauses_and_prefix_reuse(dflash_runner, plain_runner):
    prompts = [prompt(salt) for salt in range(LANES)]
    reference = generate(plain_runner, prompts)[0]
    for reuse in (False, True):
        paused, counters = generate(dflash_runner, prompts, num_pages=50, reuse=reuse)
        assert counters.preemptions > 0 and counters.spec_rounds > 0
        assert paused == reference


def test_seeded_sampling_is_reproducible(dflash_runner, dflash2_runner):
    """Sampled drafts come from the drafter's q and commit by rejection sampling, so the
    tokens depend on which steps drafted (a round's token is not the plain draw of a
    fallback step): the same requests in the same batch, or alone, give the same tokens
    again, whatever ran on the runner before (the draft store and pages are reused)."""
    prompts = [prompt(salt) for salt in range(4)]
    sampled = SamplingParams(temperature=2.0, top_p=0.95, seed=11)
    for runner in (dflash_runner, dflash2_runner):
        together, counters = generate(runner, prompts, sampling=sampled)
        assert counters.spec_rounds > 0 and counters.spec_accepted_tokens > 0
        alone = generate(runner, prompts[2:3], sampling=sampled, lanes=1)[0]
        assert generate(runner, prompts, sampling=sampled)[0] == together
        assert generate(runner, prompts[2:3], sampling=sampled, lanes=1)[0] == alone


SEEDED_TEMPERATURE = 3.0  # flat enough that the random drafters' draws are often accepted


@pytest.fixture(scope="module")
def plain_seeded(plain_runner):
    return engine_drive.seeded_outputs(generate, plain_runner, prompt(1), lanes=LANES,
                                       temperature=SEEDED_TEMPERATURE)[0]


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_sampled_tokens_follow_plain_sampling_over_many_seeds(variant, plain_seeded, request):
    """1,000 seeds of one prompt, 4 tokens each, plain and with the drafter: per output
    position the token counts agree (chi-square contingency, as for MTP in test_mtp.py).
    Positions 1..3 come from rounds whose drafts are drawn from the drafter's q (DFlash2:
    the selector's q over its candidates, through the reduced proposal head) and commit by
    rejection sampling; some are accepted, most rejected, so both the accepted drafts and
    the residual draws count. A uniform q in the draft store instead of the drafter's fails
    it (tried), and so does DFlash2's q read one draft position off; subtler errors (q
    squared) pass here, the random drafters' q being nearly flat where p has its mass."""
    runner = request.getfixturevalue(f"{variant}_runner")
    drafted, accepted = engine_drive.seeded_outputs(generate, runner, prompt(1), lanes=LANES,
                                                    temperature=SEEDED_TEMPERATURE)
    assert accepted > 100
    engine_drive.assert_same_distribution(plain_seeded, drafted, range(1, 4))


# ----------------------------------------------------------------------------- dense targets


@pytest.fixture(scope="module")
def dense_artifact():
    """The qwen3-tiny preset (dense, QK-norm) with random DFlash and DFlash2 drafters: its
    sequences hold a slot for the drafters' draft store only (engine/state_slots.py)."""
    config = dataclasses.replace(PRESETS["qwen3-tiny"].config, vocab_size=VOCAB,
                                 max_position_embeddings=CONTEXT)
    assert config.architecture == "qwen3" and not config.has_state
    params = random_params(config, seed=7, dtype="f32")
    for layer in params["layers"]:  # the context decides tokens (else each repeats the last)
        layer["wo"], layer["w_down"] = layer["wo"] * 8.0, layer["w_down"] * 8.0
    params["embed"][VOCAB - 1] = 0.0  # the mask token's row (as above)
    drafters = {}
    for variant in ("dflash", "dflash2"):  # (a seed whose drafts are sometimes accepted)
        drafters[variant] = preset_dflash_config(config, variant, tiny=True)
        params[variant] = random_dflash(drafters[variant], seed=5, dtype="f32")
    return types.SimpleNamespace(config=config, params=params, drafters=drafters)


@pytest.fixture(scope="module")
def dense_runners(dense_artifact):
    """Two step shapes each: the drafting runners here compile no one-row decode step (the
    hybrid ones above run it, and test_steps_sort_no_vocabulary_on_cpu reads it)."""
    return {variant: make_runner(dense_artifact, variant, one_row_step=False)
            for variant in (None, "dflash", "dflash2")}


def test_dense_target_greedy_equals_plain_decoding_alone_and_eight_concurrent(dense_runners):
    plain_runner = dense_runners[None]
    assert plain_runner.state_slot_capacity == 0
    prompts = [prompt(salt) for salt in range(LANES)]
    plain = [generate(plain_runner, [p], lanes=1)[0][0] for p in prompts]
    for variant in ("dflash", "dflash2"):
        runner = dense_runners[variant]
        assert runner.state_slot_capacity == SLOTS and not runner.slots_hold_state
        alone, counters = generate(runner, prompts[:1], lanes=1)
        assert alone == plain[:1] and counters.spec_rounds > 0
        together, counters = generate(runner, prompts)
        assert together == plain and counters.spec_rounds > 0
        assert counters.spec_accepted_tokens > 0


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_dense_target_drafts_equal_the_reference(dense_artifact, dense_runners, variant):
    """The target's taps come from llama.ragged here (the drafter code is shared)."""
    check_drafts(dense_artifact, dense_runners[variant], variant)


def test_dense_target_pauses_and_prefix_reuse_keep_greedy_output(dense_runners):
    """A dense sequence takes a fresh draft-store slot at any position (a prefix hit needs
    no checkpoint) and gives it back at a pause."""
    check_pauses_and_prefix_reuse(dense_runners["dflash"], dense_runners[None])
    # a prompt that extends a finished one's starts from its cached pages
    first, longer = prompt(1), prompt(1) + prompt(2, length=5)
    scheduler = scheduler_for(dense_runners["dflash"], reuse=True)
    for ids in (first, longer):
        final, = engine_drive.run_requests(scheduler, dense_runners["dflash"],
                                           [GenerationRequest("r", ids, GREEDY, 24)])
    assert scheduler.counters.cached_tokens > 0
    assert list(final.output_ids) == generate(dense_runners[None], [longer], lanes=1)[0][0]
