"""The DFlash and DFlash2 block-diffusion drafters (z-lab/dflash), as pure functions.

DFlash: a few Qwen3-style decoder layers (plain RMSNorm w * x, q/k norms, full RoPE, SwiGLU)
that share the target's embedding and lm_head. Context: the target's residual stream after
each layer in `target_layer_ids` (the reference's hidden_states[id + 1]), concatenated,
projected and normed, c_p = hidden_norm(fc(concat_i h_i,p)) [H]; every draft layer keys it
with its own wk / k_norm / wv at its position p. One pass drafts K = B - 1 tokens: the block
[anchor, MASK x K] at positions a..a+K (a: the anchor's position, the token just sampled,
whose target pass has not run), embedded by the target's table (times
input_embedding_scale); in each layer the block's queries attend, non-causally, to the
context keys 0..a-1 and to the block's own keys; the final norm, then the shared lm_head
(times output_multiplier, soft-capped when final_logit_softcapping > 0) at block positions
1..K give the drafts.

DFlash2 (the public DFlash2DraftModel): the same layers with a sliding window over the
context (the block always visible), a grouped dynamic causal convolution over block
positions before and after attention and before and after the MLP (`_dynamic_conv`), and a
candidate selector that re-ranks the head's top `selector_top_k` tokens at each position with
a low-rank bilinear score between the previous token (the anchor first) and each candidate,
chosen left to right (`_select`). It is a distinct artifact component with its own checkpoint.

Cache: one paged (k, v) entry per draft layer, shaped by the drafter's own kv heads and head
dim, appended to the step's cache list (then the draft store, as for MTP: model/mtp.py) and
addressed through the sequence's page tables. A position's entry depends only on the target's
hidden states there, i.e. on the tokens up to it, so every step writes it for all its rows
(`write_context`) and shared prefix pages, host copies and pause replays carry exact entries
with no bookkeeping of their own. Rows a verify round rejects wrote entries past the
accepted context, which no draft reads (a draft reads keys < its anchor's position) and the
next step overwrites. The block's own K/V never reach the pages.

Shape letters: N step rows, R = 1 + B sampled rows, K drafts, T = K + 1 block positions,
L draft layers, n target layers tapped.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import paged_attention
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE
from ninfer_jax.model import ragged_batch, sampling, spec_verify
from ninfer_jax.model.layers import (apply_rope, embed, linear, rms_norm,
                                     rope_inverse_frequencies, rope_tables, swiglu_mlp,
                                     tied_head)

from ninfer_jax.model.dflash_config import VARIANTS, DFlashConfig  # noqa: F401


def cache_shapes(config: DFlashConfig, *, num_pages: int, page_size: int, kv_dtype):
    """One paged (k, v) spec per draft layer."""
    specs = paged_attention.cache_specs(num_pages, page_size, config.num_kv_heads,
                                        config.head_dim, kv_dtype)
    return [specs for _ in range(config.num_layers)]


# ----------------------------------------------------------------------------- the context


def context(tree, taps, config: DFlashConfig):
    """hidden_norm(fc(taps)): taps [N, n * H], the target's tapped states -> [N, H]."""
    return rms_norm(linear(taps, tree["fc"]), tree["hidden_norm"], config.rms_norm_eps)


def _inv_freq(config: DFlashConfig):
    return rope_inverse_frequencies(config.head_dim, config.rope_theta, None)


def context_kv(layer, ctx, positions, config: DFlashConfig):
    """A draft layer's K/V of context rows ctx [N, H] at `positions` [N]."""
    N = ctx.shape[0]
    k = linear(ctx, layer["wk"]).reshape(N, config.num_kv_heads, config.head_dim)
    v = linear(ctx, layer["wv"]).reshape(N, config.num_kv_heads, config.head_dim)
    k = apply_rope(rms_norm(k, layer["k_norm"], config.rms_norm_eps),
                   *rope_tables(positions, _inv_freq(config)))
    return k, v


def write_context(tree, caches, batch: ragged_batch.RaggedBatch, taps, *,
                  config: DFlashConfig, page_size: int):
    """Write every step row's context K/V into the draft layers' pages; returns the caches."""
    ctx = context(tree, taps, config)
    positions = ragged_batch.step_positions(batch)
    slots = ragged_batch.step_slots(batch, page_size)
    written = []
    for layer, (k_cache, v_cache) in zip(tree["layers"], caches):
        k, v = context_kv(layer, ctx, positions, config)
        written.append(paged_attention.write_kv(k_cache, v_cache, k, v, slots))
    return written


# ----------------------------------------------------------------------------- the block pass


def _dynamic_conv(x, dynamic, base, group_size: int):
    """out[t] = sum_o (base[o] + dynamic[t, o]) * x[t - o] per channel group, zero before the
    block: x [R, T, H], dynamic [R, T, taps, G] (one weight per group), base [taps, H]."""
    R, T, H = x.shape
    G = H // group_size
    out = jnp.zeros((R, T, G, group_size), jnp.float32)
    for offset in range(base.shape[0]):
        shifted = jnp.pad(x, ((0, 0), (offset, 0), (0, 0)))[:, :T].astype(jnp.float32)
        shifted = shifted.reshape(R, T, G, group_size)
        weight = (base[offset].astype(jnp.float32).reshape(G, group_size)
                  + dynamic[:, :, offset, :, None].astype(jnp.float32))
        out = out + weight * shifted
    return out.reshape(R, T, H).astype(x.dtype)


def _conv_weights(layer, name: str, h, config: DFlashConfig):
    """The two dynamic kernels [R, T, taps, G] a conv pair derives from h [R, T, H]."""
    R, T, H = h.shape
    G = H // config.conv_group_size
    dynamic = linear(h, layer[f"{name}_proj"]).reshape(R, T, 2, config.conv_kernel_size, G)
    return dynamic[:, :, 0], dynamic[:, :, 1]


def _layer(layer, x, cache, anchor_positions, tables, rope, config: DFlashConfig):
    """One draft layer over the block x [R, T, H]."""
    R, T, H = x.shape
    NH, NK, D, eps = config.num_heads, config.num_kv_heads, config.head_dim, config.rms_norm_eps
    is_v2 = config.variant == "dflash2"
    residual = x
    h = rms_norm(x, layer["attn_norm"], eps)
    if is_v2:
        before, after = _conv_weights(layer, "attn_conv", h, config)
        h = _dynamic_conv(h, before, layer["attn_conv_base"][0], config.conv_group_size)
    flat = h.reshape(R * T, H)
    cos, sin = rope
    q = rms_norm(linear(flat, layer["wq"]).reshape(R * T, NH, D), layer["q_norm"], eps)
    k = rms_norm(linear(flat, layer["wk"]).reshape(R * T, NK, D), layer["k_norm"], eps)
    v = linear(flat, layer["wv"]).reshape(R, T, NK, D)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out = paged_attention.paged_block_attention(
        q.reshape(R, T, NH, D), k.reshape(R, T, NK, D), v, *cache, tables, anchor_positions,
        scale=D ** -0.5, window=config.sliding_window or None, causal=config.causal)
    out = linear(out.reshape(R * T, NH * D), layer["wo"]).reshape(R, T, H)
    if is_v2:
        out = _dynamic_conv(out, after, layer["attn_conv_base"][1], config.conv_group_size)
    x = residual + out
    h = rms_norm(x, layer["mlp_norm"], eps)
    if is_v2:
        before, after = _conv_weights(layer, "mlp_conv", h, config)
        h = _dynamic_conv(h, before, layer["mlp_conv_base"][0], config.conv_group_size)
    out = swiglu_mlp(h, layer)
    if is_v2:
        out = _dynamic_conv(out, after, layer["mlp_conv_base"][1], config.conv_group_size)
    return x + out


def block_hidden(tree, embed_table, caches, anchors, anchor_positions, tables, *,
                 config: DFlashConfig, num_drafts: int):
    """The drafter's final-normed states at block positions 1..K: anchors int32 [R] at
    anchor_positions [R] (each row's context is keys 0..anchor_position-1 of its table
    [R, W]) -> [R, K, H]."""
    R, T = anchors.shape[0], num_drafts + 1
    tokens = jnp.concatenate([anchors[:, None],
                              jnp.full((R, num_drafts), config.mask_token_id, jnp.int32)], 1)
    x = embed(embed_table, tokens.reshape(-1)).reshape(R, T, -1)
    if config.input_embedding_scale != 1.0:
        x = x * jnp.asarray(config.input_embedding_scale, x.dtype)
    positions = (anchor_positions[:, None] + jnp.arange(T)[None]).reshape(-1)
    rope = rope_tables(positions, _inv_freq(config))
    for layer, cache in zip(tree["layers"], caches):
        x = _layer(layer, x, cache, anchor_positions, tables, rope, config)
    return rms_norm(x[:, 1:], tree["norm"], config.rms_norm_eps)


def head_logits(params, hidden, config: DFlashConfig, *, model_config, draft_head=None):
    """Proposal logits f32 [..., V] of drafter states: the target's lm_head (or, with
    `draft_head`, its vocabulary subset scattered over V, -inf elsewhere), times
    output_multiplier, soft-capped."""
    if draft_head is not None:
        return subset_logits(draft_head, hidden, config.vocab_size,
                             lambda logits: _scaled(logits, config))
    table = tied_head(params["embed"]) if model_config.tie_word_embeddings else params["lm_head"]
    return _scaled(linear(hidden, table, out_dtype=jnp.float32).astype(jnp.float32), config)


def subset_logits(draft_head, hidden, vocab_size: int, scale=lambda logits: logits):
    """--lm-head-draft: logits of the artifact's reduced proposal head (the draft_head
    component: weight [H, Vd] over the vocabulary subset token_ids int32 [Vd]), `scale`d,
    placed over the full vocabulary with -inf outside the subset (a draft is never outside
    it; rejection sampling stays exact for any proposal q)."""
    subset = scale(linear(hidden, draft_head["weight"], out_dtype=jnp.float32)
                   .astype(jnp.float32))
    logits = jnp.full((*hidden.shape[:-1], vocab_size), -jnp.inf, jnp.float32)
    return logits.at[..., draft_head["token_ids"]].set(subset)


def _scaled(logits, config: DFlashConfig):
    if config.output_multiplier != 1.0:
        logits = logits * config.output_multiplier
    cap = config.final_logit_softcapping
    return jnp.tanh(logits / cap) * cap if cap > 0 else logits


# ----------------------------------------------------------------------------- drafting


def _select(tree, hidden, logits, anchors, keys, sampling_batch, config: DFlashConfig,
            draws: bool):
    """DFlash2's candidate selector: at block position j the top `selector_top_k` tokens c
    of the head score unary(c) + <pred[prev] * P h_j, succ[c]> (prev: the anchor, then the
    token chosen at j - 1); greedy rows take the best, sampled rows draw from softmax(score /
    temperature) over the candidates (keys [R, K]). Returns (tokens int32 [R, K], q f32
    [R, K, V] or None: the candidates' probabilities scattered over the vocabulary)."""
    selector = tree["selector"]
    # top_k over 2-D [R * K, V]: XLA:CPU turns a 3-D top_k whose outputs are sliced per
    # position into a stable sort of the whole vocabulary (qwen3.5-tiny's 248k: 1.29 s of
    # a 16-row step's 1.36 s; tests/model/test_dflash.py checks no step sorts it)
    R, K, V = logits.shape
    unary, candidates = jax.lax.top_k(logits.reshape(R * K, V), config.selector_top_k)
    unary = unary.reshape(R, K, -1)  # [R, K, k]
    candidates = candidates.reshape(R, K, -1)
    projected = linear(hidden, selector["hidden_projection"]).astype(jnp.float32)
    temperature = jnp.where(sampling_batch.is_greedy, 1.0, sampling_batch.temperature)
    previous, tokens, qs = anchors, [], []
    rows = jnp.arange(anchors.shape[0])[:, None]
    for j in range(candidates.shape[1]):
        pred = embed(selector["predecessor"], previous).astype(jnp.float32) * projected[:, j]
        succ = embed(selector["successor"], candidates[:, j].reshape(-1)).astype(jnp.float32)
        succ = succ.reshape(*candidates.shape[::2], -1)
        scores = unary[:, j] + jnp.einsum("rd,rkd->rk", pred, succ)
        index = jnp.argmax(scores, axis=-1)
        if draws:
            probs = jax.nn.softmax(scores / temperature[:, None], axis=-1)
            drawn = jax.vmap(jax.random.categorical)(keys[:, j], jnp.log(probs))
            index = jnp.where(sampling_batch.is_greedy, index, drawn)
            qs.append(jnp.zeros((anchors.shape[0], config.vocab_size), jnp.float32)
                      .at[rows, candidates[:, j]].set(probs))
        previous = jnp.take_along_axis(candidates[:, j], index[:, None], axis=1)[:, 0]
        tokens.append(previous.astype(jnp.int32))
    tokens = jnp.stack(tokens, axis=1)
    if not draws:
        return tokens, None
    greedy = sampling_batch.is_greedy[:, None, None]
    one_hot = jax.nn.one_hot(tokens, config.vocab_size, dtype=jnp.float32)
    return tokens, jnp.where(greedy, one_hot, jnp.stack(qs, axis=1))


def draft(params, caches, store, batch: ragged_batch.RaggedBatch, taps, sampled, is_live,
          sampling_batch, *, config: DFlashConfig, model_config, page_size: int,
          num_drafts: int, draws: bool = True, draft_head=None):
    """K drafts after each of the step's R sampled rows (the chunk's, then the rows'), the
    anchor being the row's sample. `params[config.variant]` is the drafter's tree; taps
    [N, n * H] the target's tapped states of every step row; is_live bool [R] as in
    mtp.draft (only live rows keep their q in `store`). Greedy rows draft the argmax;
    sampled rows draw from the drafter's q under their own sampling parameters (DFlash2:
    the selector's temperature-only q over its candidates). Returns (drafts int32 [R, K],
    caches, store)."""
    tree = params[config.variant]
    caches = write_context(tree, caches, batch, taps, config=config, page_size=page_size)
    C = ragged_batch.num_chunk_tokens(batch)
    anchor_positions = jnp.concatenate([(batch.chunk_start + batch.chunk_len)[None],
                                        jnp.asarray(batch.row_positions, jnp.int32) + 1])
    tables = jnp.concatenate([batch.chunk_table[None], batch.row_tables])
    if not C:
        is_live = is_live.at[0].set(False)
    tables = jnp.where(is_live[:, None], tables, DUMMY_PAGE)
    anchor_positions = jnp.where(is_live, anchor_positions, 0)
    hidden = block_hidden(tree, params["embed"], caches, sampled, anchor_positions, tables,
                          config=config, num_drafts=num_drafts)
    logits = head_logits(params, hidden, config, model_config=model_config,
                         draft_head=draft_head)  # [R, K, V]
    greedy = sampling.argmax(logits)
    keys = jax.vmap(lambda words, index: jax.vmap(
        lambda j: spec_verify.draft_key(words, index + 1 + j))(jnp.arange(num_drafts)))(
        sampling_batch.seed_words, sampling_batch.sample_index)  # [R, K] keys

    if config.variant == "dflash2":
        def drafted(with_q):
            return _select(tree, hidden, logits, sampled, keys, sampling_batch, config, with_q)
    else:
        def drafted(with_q):
            if not with_q:
                return greedy, None
            q = jax.vmap(lambda logits_j: sampling.distributions(logits_j, sampling_batch),
                         in_axes=1, out_axes=1)(logits)
            tokens = jax.vmap(spec_verify.draft_tokens, in_axes=1, out_axes=1)(keys, q)
            return tokens, q

    if not draws:
        return drafted(False)[0], caches, store
    drafts, q = sampling.unless_all_greedy(
        sampling_batch.is_greedy, lambda: drafted(True),
        lambda: (drafted(False)[0], jnp.zeros(logits.shape, jnp.float32)))
    slots = jnp.concatenate([jnp.asarray(batch.chunk_state_slot, jnp.int32)[None],
                             batch.row_state_slots])
    target = jnp.where(is_live, slots, ragged_batch.DUMMY_STATE_SLOT)
    store = {"draft_q": store["draft_q"].at[target].set(q)}
    return drafts, caches, store
