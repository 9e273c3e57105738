"""The compiled step bodies: a family's forward pass followed by sampling, as pure functions.

engine/runner.py jits these (config and page_size static, the KV caches donated) and is the
only caller. Each step returns the sampled token(s) plus the updated caches, so one small int32
array is all that crosses back to the host per step.

`ragged_step` is the engine-core step: one prefill chunk and B row tokens (RaggedBatch,
model/ragged_batch.py) in one call. Its output has a fixed size [1 + max_rows] and is fed to
the next step as `prev_out`, so a row may name a token that is still on the device: the host
can launch step n+1 before step n's samples arrive. `prefill_step` and `decode_step` are the
two single-region steps the current runner compiles.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.kernels.quant_matmul.formats import (BLOCK_FORMATS, QUANTIZED_FORMATS,
                                                      TRANSPOSED_FORMATS)
from ninfer_jax.model import (dflash, gemma, glm, hybrid, llama, mtp, nemotron_h,
                              ragged_batch, sampling, spec_verify, tensor_parallel,
                              token_automaton)
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.multimodal import MediaRows
from ninfer_jax.model.packed_inputs import PackedLayout, unpack
from ninfer_jax.model.ragged_batch import FROM_HOST, RaggedBatch  # noqa: F401 (the step's API)

# architecture -> module providing ragged/prefill/decode and init_caches/cache_shapes with the
# llama.py signatures (hybrid and nemotron_h prefill/decode also take the state slot(s))
FAMILIES = {"llama": llama, "qwen3": llama,
            "qwen3_5": hybrid, "qwen3_5_moe": hybrid, "qwen3_next": hybrid, "glm4_moe": glm,
            "gemma4": gemma, "nemotron_h": nemotron_h}


def ragged_step(params, kv, prev_out, batch: RaggedBatch, sampling_batch, *,
                config: ModelConfig, page_size: int, draws: bool = True, mesh=None,
                num_drafts: int = 0, media: MediaRows | None = None,
                drafter: dflash.DFlashConfig | None = None, chunk_slots: int = 1):
    """One ragged step (see llama.ragged); returns (out int32, kv).

    prev_out: the previous step's `out` (int32 [(1 + max_rows) x (1 + num_drafts)], any values
    before the first step); max_rows follows from its length, so it is fixed per compiled
    shape. `sampling_batch` has 1 + B rows: the chunk, then the row tokens. out[0] is the token
    after the chunk's last real token (meaningless when C == 0), out[1 + i] the token after row
    token i, and entries past 1 + B are zero. With `chunk_slots` S > 1 (static, the runner's
    most chunks per step, the same for all its shapes) out opens with S chunk slots: a batch of
    K <= S segments (ragged_batch) samples K + B rows, segment k's token lands in out[k] and
    row i's in out[S + i] (ragged_batch.out_slots); max_rows is then out's length - S.
    `draws=False` compiles greedy sampling only (sampling.sample). `mesh`: the tensor-parallel mesh (model/tensor_parallel.py); sampling
    reads the gathered logits. `num_drafts` K > 0 (hybrid families with the MTP head, whose
    cache and draft store are kv's last two entries): out[1 + max_rows:] holds
    [1 + max_rows, K] drafts, K after each sampled row (model/mtp.py), and rows that feed a
    sampled draft commit by rejection sampling against its q (model/spec_verify.py).
    `drafter` (a DFlash or DFlash2 config, static): the K drafts come from that drafter
    instead (model/dflash.py), whose draft layers' caches precede the draft store in kv.
    `media` (model/multimodal.py): vision rows and MRoPE positions of a step with media.
    params["draft_head"], when the runner placed it (--lm-head-draft), is the drafters'
    proposal head."""
    num_rows = batch.row_tokens.shape[0]
    max_rows = prev_out.shape[0] // (1 + num_drafts) - chunk_slots
    if num_rows > max_rows:
        raise ValueError(f"{num_rows} row tokens exceed max_rows={max_rows}")
    num_chunks = ragged_batch.num_sampled(batch)
    if num_chunks > chunk_slots or (chunk_slots > 1 and (num_drafts or media is not None)):
        raise ValueError(f"{num_chunks} chunks in a step with {chunk_slots} chunk slots "
                         "(several chunks are built for text steps without drafts)")
    family = FAMILIES[config.architecture]
    if ragged_batch.segmented(batch) and not getattr(family, "CHUNK_SEGMENTS", False):
        raise ValueError(f"{config.architecture} steps take one chunk, not segments")
    # the mesh only when there is one: a family (or a test's stub) without tensor
    # parallelism keeps the plain signature
    extra = {} if mesh is None else {"mesh": mesh}
    if media is not None:
        extra["media"] = media
    # the drafter's caches (the MTP head's one, DFlash's one per draft layer) and the draft
    # store follow the model's layers
    num_extra = 0 if not num_drafts else 2 if drafter is None else drafter.num_layers + 1
    if num_drafts:
        taps = {"hidden": True} if drafter is None else {"taps": drafter.target_layer_ids}
        logits, kv_text, hidden = family.ragged(params, kv[:-num_extra], batch, prev_out,
                                                config=config, page_size=page_size,
                                                **taps, **extra)
        kv = [*kv_text, *kv[-num_extra:]]
    else:
        logits, kv = family.ragged(params, kv, batch, prev_out, config=config,
                                   page_size=page_size, **extra)
    logits = tensor_parallel.gathered_logits(logits, mesh)
    sampled = sampling.sample(logits, sampling_batch, draws=draws)  # [1 + B]
    rows = ragged_batch.step_tokens(batch, prev_out)[ragged_batch.num_chunk_tokens(batch):]
    if num_drafts and draws:  # sampled MTP drafts: rejection sampling against their q
        def verified():
            depth = ragged_batch.chain_depths(batch.row_state_slots)
            feeds_draft = jnp.concatenate([depth[1:] > 0, jnp.zeros(1, bool)])
            p = sampling.distributions(logits, sampling_batch)[1:]
            draft_q = kv[-1]["draft_q"][batch.row_state_slots]
            return sampled.at[1:].set(spec_verify.verify_rows(
                rows, sampled[1:], sampling_batch, p, draft_q, depth, feeds_draft))

        sampled = sampling.unless_all_greedy(sampling_batch.is_greedy, verified,
                                             lambda: sampled)
    if batch.chained_rows:  # hybrid verify rows: their accepted states, now known
        kv = family.settle_rows(kv, batch, rows, sampled[1:])
    out = jnp.zeros(prev_out.shape, jnp.int32)
    out = out.at[ragged_batch.out_slots(num_chunks, num_rows, chunk_slots)].set(sampled)
    if num_drafts:
        is_live = jnp.concatenate([jnp.ones(1, bool), ragged_batch.last_accepted_rows(
            batch.row_state_slots, rows, sampled[1:])])
        if drafter is None:
            drafts, mtp_cache, store = mtp.draft(params, kv[-2], kv[-1], batch, hidden,
                                                 sampled, is_live, sampling_batch,
                                                 config=config, page_size=page_size,
                                                 num_drafts=num_drafts, draws=draws)
            kv = [*kv[:-2], mtp_cache, store]
        else:
            drafts, caches, store = dflash.draft(
                params, kv[-num_extra:-1], kv[-1], batch, hidden, sampled, is_live,
                sampling_batch, config=drafter, model_config=config, page_size=page_size,
                num_drafts=num_drafts, draws=draws, draft_head=params.get("draft_head"))
            kv = [*kv[:-num_extra], *caches, store]
        out = out.at[1 + max_rows:1 + max_rows + drafts.size].set(drafts.reshape(-1))
    return out, kv


def packed_step(params, kv, prev_out, ints, floats, counts, policy, *, config: ModelConfig,
                page_size: int, layout: PackedLayout, draws: bool = True, mesh=None):
    """`ragged_step` over inputs packed into one int32 and one float32 buffer
    (model/packed_inputs.py): two host-to-device transfers per launch instead of fifteen.
    Each sampled row's lane (engine/penalty_lanes.py) holds device state that the runner
    donates: `counts` (int32 [lanes + 1, V]), the output counts its penalty bias is read
    from, and `policy` (int32 [lanes + 1, token_automaton.ROW_WIDTH]), its token-policy
    automaton, which turns the sample into the token committed (forced or kept). The step
    counts that token in `counts` and advances `policy`. Returns (out, kv, counts, policy)."""
    batch, sampling_batch, lanes = unpack(layout, ints, floats, counts)
    out, kv = ragged_step(params, kv, prev_out, batch, sampling_batch, config=config,
                          page_size=page_size, draws=draws, mesh=mesh,
                          num_drafts=layout.num_drafts, drafter=layout.dflash,
                          chunk_slots=layout.chunk_slots)
    out, counts, policy = _apply_lanes(out, counts, policy, lanes, sampling_batch,
                                       layout.out_slots())
    return out, kv, counts, policy


def packed_media_step(params, kv, prev_out, ints, floats, counts, policy, media: MediaRows, *,
                      config: ModelConfig, page_size: int, layout: PackedLayout,
                      draws: bool = True, mesh=None):
    """`packed_step` of a step that holds media rows or rows after a prompt with media: the
    same inputs plus the step's MediaRows (compiled only when serving with --vision)."""
    batch, sampling_batch, lanes = unpack(layout, ints, floats, counts)
    out, kv = ragged_step(params, kv, prev_out, batch, sampling_batch, config=config,
                          page_size=page_size, draws=draws, mesh=mesh,
                          num_drafts=layout.num_drafts, drafter=layout.dflash, media=media,
                          chunk_slots=layout.chunk_slots)
    out, counts, policy = _apply_lanes(out, counts, policy, lanes, sampling_batch,
                                       layout.out_slots())
    return out, kv, counts, policy


def _apply_lanes(out, counts, policy, lanes, sampling_batch, slots):
    """The lanes' token policies on the samples (at `out[slots]`, in sampling order), then
    their counts: (out, counts, policy). A forced token's `out` slot carries
    token_automaton.FORCED_BIT. Rows on the dummy lane (all zeros: the identity automaton)
    keep their sample."""
    emitted, node, counter, forced = token_automaton.advance(
        jnp, policy, lanes, out[slots], sampling_batch.sample_index)
    out = out.at[slots].set(token_automaton.mark(jnp, emitted, forced))
    policy = policy.at[lanes, 0].set(node).at[lanes, 1].set(counter)
    return out, sampling.count_sampled(counts, lanes, emitted), policy


def prefill_step(params, kv, tokens, start, num_tokens, page_table, sampling_batch, *,
                 config: ModelConfig, page_size: int):
    """One prefill chunk (see llama.prefill); returns (token int32 [1], kv): the token drawn
    after the chunk's last real token with the one-row `sampling_batch`."""
    family = FAMILIES[config.architecture]
    logits, kv = family.prefill(params, kv, tokens, start, num_tokens, page_table,
                                config=config, page_size=page_size)
    return sampling.sample(logits[None, :], sampling_batch), kv


def decode_step(params, kv, tokens, positions, page_tables, sampling_batch, *,
                config: ModelConfig, page_size: int):
    """One decode step over B rows (see llama.decode); returns (tokens int32 [B], kv)."""
    family = FAMILIES[config.architecture]
    logits, kv = family.decode(params, kv, tokens, positions, page_tables,
                               config=config, page_size=page_size)
    return sampling.sample(logits, sampling_batch), kv


def cast_params(params, dtype):
    """Floating-point leaves in `dtype` (the compute dtype) on the default device; other
    leaves (quantized codes, their scales' integer parts) are left as stored. Host arrays are
    cast on the host and the whole tree is placed by one `device_put`, which overlaps the
    transfers (one `jnp.asarray` per leaf waits for each of an 8B model's ~400 in turn)."""
    return jax.device_put(cast_leaves(params, dtype))


def cast_leaves(params, dtype):
    """cast_params' cast alone: host arrays cast on the host, device ones on their device."""
    def cast(leaf):
        leaf = leaf if isinstance(leaf, jax.Array) else np.asarray(leaf)
        if not jnp.issubdtype(leaf.dtype, jnp.floating) or leaf.dtype == dtype:
            return leaf
        return leaf.astype(dtype)
    return _map_plain_weights(cast, params)


def expand_quantized(params, dtype):
    """Quantized leaves replaced by the dense `dtype` weights they stand for (the reference's
    own dequantization, so every product is unchanged). For backends without the quantized
    kernels: XLA CPU dequantizing inside each step costs ~10x an f32 product
    (benchmarks/cpu_matmul_bench.py), so the weights are expanded once at load instead."""
    from ninfer_jax.kernels import quant_matmul
    from ninfer_jax.kernels.quant_matmul import reference

    if isinstance(params, dict):
        if _is_quantized(params) and quant_matmul.format_of(params) in BLOCK_FORMATS and \
                quant_matmul.cpu_kernel_available():
            # GGUF blocks: the CPU block kernel reads them, regrouped 16 columns at a time
            # where this CPU has that layout's SIMD path (the same bytes)
            from ninfer_jax.kernels.quant_matmul import cpu
            return cpu.interleave(params)
        if _is_quantized(params):
            return reference.dequantize({k: jnp.asarray(v) for k, v in params.items()}, dtype)
        return {k: _expand_table(v, dtype) if k == "embed" else expand_quantized(v, dtype)
                for k, v in params.items()}
    if isinstance(params, (list, tuple)):
        return type(params)(expand_quantized(v, dtype) for v in params)
    return params


def _expand_table(table, dtype):
    """An embedding table in a GGUF block format -> dense [V, H] (its rows are the blocks' rows,
    not a [K, N] projection's columns); tables kept for the CPU kernel and plain ones as given."""
    from ninfer_jax.kernels import quant_matmul
    from ninfer_jax.kernels.quant_matmul import reference

    if not isinstance(table, dict):
        return table
    if quant_matmul.cpu_kernel_available():  # a tied table is also the output projection
        from ninfer_jax.kernels.quant_matmul import cpu
        return cpu.interleave(table)
    fmt = quant_matmul.format_of(table)
    return reference.dequantize_blocks(jnp.asarray(table[fmt]), fmt, dtype)


def _map_plain_weights(fn, tree):
    """Apply fn to plain array leaves; a quantized leaf (a dict with a format key, see
    kernels/quant_matmul/formats.py) is kept whole, its arrays as stored."""
    if isinstance(tree, dict):
        if _is_quantized(tree):
            return dict(tree)
        return {k: _map_plain_weights(fn, v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map_plain_weights(fn, v) for v in tree)
    return fn(tree)


def _is_quantized(node: dict) -> bool:
    return any(name in node for name in (*QUANTIZED_FORMATS, *TRANSPOSED_FORMATS))
