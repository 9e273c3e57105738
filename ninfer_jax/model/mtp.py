"""The multi-token-prediction (MTP) draft head of the hybrid families, as pure functions.

Qwen3.5 / 3.6 / Qwen3-Next MTP at position p, with x_{p+1} the token after p and h_p the target's
final-normed hidden state at p:
    u = fc(concat[norm_e(embed(x_{p+1})), norm_h(h_p)])        fc [2H, H]
    u = decoder layer(u) at position p: gated attention over the head's own KV, then the MLP
    h'_p = mtp.norm(u);  logits = lm_head(h'_p), a draft of x_{p+2}
Every norm is zero-centred (1 + w); the embedding and lm_head are the target's. k drafts apply
it k times: the next application is at p + 1 with the draft just made and h'_p. Only the first
of the artifact's mtp_num_layers layers is used (Qwen ships one).

Cache: one (k, v) pair shaped like a full-attention layer's, appended to the step's cache list
(then the draft store: {"draft_q": [S, K, V] f32}, per state slot the q its sequence's drafts
were drawn from, which the next verify step tests them against) and addressed through the
same page tables, so a sequence's MTP KV lives in its own pages:
the page pool, prefix cache, host tier and pauses carry it with no bookkeeping of their own,
at the price of one more attention layer per page (Qwen3.5-27B: 17 instead of 16). The head's
KV at position p needs x_{p+1}, known one step after p's target KV: a step writes it for every
position whose next token it knows (chunk tokens, the next prompt token `chunk_next`, each
row's sample) and the draft passes write speculative entries that the next step overwrites.
A stale entry (a prefix page shared after a different next token) only lowers acceptance:
drafts never change greedy output, nor the distribution of sampled output
(engine/speculation.py).
Shape letters: N rows of a step (C chunk + B row tokens), R = 1 + B sampled rows, K drafts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.kernels.paged_attention import DUMMY_PAGE
from ninfer_jax.model import ragged_batch, sampling, spec_verify, tensor_parallel
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.dflash import subset_logits
from ninfer_jax.model.hybrid import gated_attention
from ninfer_jax.model.layers import (embed, linear, rope_inverse_frequencies, rope_tables,
                                     swiglu_mlp, zero_centred_rms_norm)
from ninfer_jax.model.moe_mlp import moe_mlp


def head(params, cache, batch: ragged_batch.RaggedBatch, next_tokens, hidden, *,
         config: ModelConfig, page_size: int):
    """One application over the step rows of `batch`: next_tokens [N] (x_{p+1} per row),
    hidden [N, H] (h_p). Returns (h' [N, H], already normed for `logits`; the cache with each
    row's K/V written)."""
    mtp = params["mtp"]
    eps = config.rms_norm_eps
    e = zero_centred_rms_norm(embed(params["embed"], next_tokens), mtp["pre_fc_norm_embedding"],
                              eps)
    g = zero_centred_rms_norm(hidden.astype(e.dtype), mtp["pre_fc_norm_hidden"], eps)
    x = linear(jnp.concatenate([e, g], axis=-1), mtp["fc"])
    layer = mtp["layers"][0]
    rotary_dim = int(config.head_dim * config.partial_rotary_factor)
    inv_freq = rope_inverse_frequencies(rotary_dim, config.rope_theta, config.rope_scaling)
    rope = rope_tables(ragged_batch.step_positions(batch), inv_freq)
    attend = tensor_parallel.attention_op(batch, scale=config.head_dim ** -0.5, mesh=None)
    h = zero_centred_rms_norm(x, layer["attn_norm"], eps)
    slots = ragged_batch.step_slots(batch, page_size)
    mixed, cache = gated_attention(h, layer, cache, rope, slots, attend, config)
    x = x + mixed
    h = zero_centred_rms_norm(x, layer["mlp_norm"], eps)
    x = x + (moe_mlp(h, layer, config, live=ragged_batch.live_rows(slots, page_size))
             if config.num_experts else swiglu_mlp(h, layer))
    return zero_centred_rms_norm(x, mtp["norm"], eps), cache


def logits(params, h, config: ModelConfig):
    """The shared lm_head over h' (already normed by mtp.norm), in f32; the reduced proposal
    head when the runner placed one (--lm-head-draft, dflash.subset_logits)."""
    if "draft_head" in params:
        return subset_logits(params["draft_head"], h, config.vocab_size)
    table = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
    return linear(h, table, out_dtype=jnp.float32).astype(jnp.float32)


def draft(params, cache, store, batch: ragged_batch.RaggedBatch, hidden, sampled, is_live,
          sampling_batch, *, config: ModelConfig, page_size: int, num_drafts: int,
          draws: bool = True):
    """K drafts after each of the step's R sampled rows (the chunk's, then the rows').

    hidden [N, H]: the target's final-normed states; sampled int32 [R]: the step's samples;
    is_live bool [R]: rows whose drafts can be used (a chain's last accepted row, the chunk);
    others draft on the dummy page so that their speculative K/V lands nowhere. Greedy rows
    draft the argmax; sampled rows draw from the head's distribution q under the row's own
    sampling parameters (spec_verify.draft_key), and q is kept in `store["draft_q"]` at the
    row's state slot for the verify step that will test these drafts. `draws=False` (an all
    greedy step) skips q. Returns (drafts int32 [R, K], cache, store)."""
    C = ragged_batch.num_chunk_tokens(batch)
    chunk_next = sampled[:1] if batch.chunk_next is None else jnp.where(
        batch.chunk_next >= 0, batch.chunk_next, sampled[0])[None]
    # x_{p+1} of every step row: the chunk's own next tokens, then each row's sample.
    chunk_tokens = jnp.asarray(batch.chunk_tokens, jnp.int32)
    next_in_chunk = jnp.concatenate([chunk_tokens[1:], jnp.zeros(1, jnp.int32)])[:C]
    next_in_chunk = jnp.where(jnp.arange(C) == batch.chunk_len - 1, chunk_next, next_in_chunk)
    next_tokens = jnp.concatenate([next_in_chunk, sampled[1:]])
    h, cache = head(params, cache, batch, next_tokens, hidden, config=config,
                    page_size=page_size)
    h = ragged_batch.sampled_rows(h, batch)  # [R, H]

    def pick(h, j):
        logits_j = logits(params, h, config)
        greedy = sampling.argmax(logits_j)
        if not draws:
            return greedy, None

        def with_draws():
            q = sampling.distributions(logits_j, sampling_batch)
            keys = jax.vmap(spec_verify.draft_key)(sampling_batch.seed_words,
                                                   sampling_batch.sample_index + 1 + j)
            return spec_verify.draft_tokens(keys, q), q

        # an all-greedy step keeps no q (greedy rows never read theirs)
        return sampling.unless_all_greedy(sampling_batch.is_greedy, with_draws,
                                          lambda: (greedy, jnp.zeros_like(logits_j)))

    token, q = pick(h, 0)
    drafts, qs = [token], [q]
    # The sampled rows as rows of their own: the chunk's last position, then each row's.
    start = jnp.concatenate([(batch.chunk_start + batch.chunk_len - 1)[None],
                             jnp.asarray(batch.row_positions, jnp.int32)])
    tables = jnp.concatenate([batch.chunk_table[None], batch.row_tables])
    if not C:
        is_live = is_live.at[0].set(False)
    limit = tables.shape[1] * page_size
    for step in range(1, num_drafts):
        positions = start + step
        valid = is_live & (positions < limit)
        rows = ragged_batch.rows_only(token, jnp.where(valid, positions, 0),
                                      jnp.where(valid[:, None], tables, DUMMY_PAGE))
        h, cache = head(params, cache, rows, token, h, config=config, page_size=page_size)
        token, q = pick(h, step)
        drafts.append(token)
        qs.append(q)
    if draws:
        slots = jnp.concatenate([jnp.asarray(batch.chunk_state_slot, jnp.int32)[None],
                                 batch.row_state_slots])
        target = jnp.where(is_live, slots, ragged_batch.DUMMY_STATE_SLOT)
        store = {"draft_q": store["draft_q"].at[target].set(jnp.stack(qs, axis=1))}
    return jnp.stack(drafts, axis=1), cache, store
