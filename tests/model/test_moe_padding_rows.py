"""Padding rows of a MoE step select no experts of their own (model/moe_mlp.py).

On the tiny Qwen3.6-MoE and GLM-4.5 shapes (8 experts, top 2; random f32 weights, fused as
the runner fuses them on one device, Qwen3.6's gated shared expert folded in as expert E and
taken by every row, the padding rows with a zero gate), one live
decode row among three padding rows, as the runner pads a lone row on the GPU. Recorded at
every MoE layer of the jitted step: the routers would have sent the padding rows to experts
the live row did not pick, yet the distinct experts handed to the routed-experts product are
exactly the live row's, with zero weights for the padding rows. The live row's logits are
bit-for-bit those of the same step with the padding rows' own experts computed (the
unmasked routing), and match the row stepped alone.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params
from ninfer_jax.kernels import moe
from ninfer_jax.kernels.moe import routing
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE
from ninfer_jax.model import glm, hybrid, moe_mlp, ragged_batch
from ninfer_jax.model.fused_projections import fuse_projections

PAGE_SIZE, WIDTH, NUM_PAGES, NUM_SLOTS, VOCAB = 4, 4, 9, 3, 96
POSITION, ROWS, LIVE = 0, 4, 1  # the live row is row 1 of 4, its sequence's first token


class Model:
    def __init__(self, preset: str):
        self.config = dataclasses.replace(PRESETS[preset].config, vocab_size=VOCAB)
        self.family = glm if self.config.is_glm else hybrid
        params = random_params(self.config, seed=4, dtype="f32")
        self.params = jax.tree_util.tree_map(  # as the runner holds them on one device
            jnp.asarray, fuse_projections(params, self.config))
        self.table = np.arange(1, 1 + WIDTH, dtype=np.int32)
        self.token = 17

    def caches(self):
        return self.family.init_caches(self.config, num_pages=NUM_PAGES, page_size=PAGE_SIZE,
                                       num_state_slots=NUM_SLOTS, dtype=jnp.float32,
                                       kv_dtype=jnp.float32)

    def decode(self, kv, num_rows: int, live_row: int):
        """Logits of one decode step of `num_rows` rows, row `live_row` a sequence's token at
        POSITION, the others padding (dummy pages, dummy state slot)."""
        tokens = np.zeros(num_rows, np.int32)
        tokens[live_row] = self.token
        positions = np.zeros(num_rows, np.int32)
        positions[live_row] = POSITION
        tables = np.full((num_rows, WIDTH), DUMMY_PAGE, np.int32)
        tables[live_row] = self.table
        args = [self.params, kv, tokens, positions, tables]
        if self.family is hybrid:
            slots = np.full(num_rows, ragged_batch.DUMMY_STATE_SLOT, np.int32)
            slots[live_row] = 1
            args.append(slots)
        step = functools.partial(self.family.decode, config=self.config, page_size=PAGE_SIZE)
        return np.asarray(jax.jit(step)(*args)[0])


@pytest.fixture(scope="module", params=["qwen3.6-tiny-moe", "glm4.5-tiny"])
def model(request):
    return Model(request.param)


def recording(monkeypatch):
    """Record, per MoE layer call of the next traced step, the router's own choice and the
    (ids, weights) that reach moe.routed_experts."""
    routed, chosen = [], []
    real_routed, real_route = moe.routed_experts, moe_mlp.top_experts
    real_glm_route = moe_mlp.route_grouped_sigmoid

    def record(into, *arrays):
        jax.debug.callback(lambda *a: into.append([np.asarray(v) for v in a]), *arrays)

    def routed_experts(x, expert_ids, expert_weights, gate_up, down):
        record(routed, expert_ids, expert_weights)
        return real_routed(x, expert_ids, expert_weights, gate_up, down)

    def route(*args):
        ids, weights = real_route(*args)
        record(chosen, ids)
        return ids, weights

    def glm_route(*args):
        ids, weights = real_glm_route(*args)
        record(chosen, ids)
        return ids, weights

    monkeypatch.setattr(moe, "routed_experts", routed_experts)
    # the router kernel (GPU) does the routing in one call: record the unfused steps
    monkeypatch.setenv(routing.ROUTER_ENV, "0")
    monkeypatch.setattr(moe_mlp, "top_experts", route)
    monkeypatch.setattr(moe_mlp, "route_grouped_sigmoid", glm_route)
    return routed, chosen


def test_padding_rows_load_only_the_live_rows_experts_and_change_no_live_logit(
        model, monkeypatch):
    kv = model.caches()
    routed, chosen = recording(monkeypatch)
    masked = model.decode(kv, ROWS, LIVE)
    num_moe_layers = sum(model.config.is_moe_layer(i) for i in range(model.config.num_layers))
    assert len(routed) == len(chosen) == num_moe_layers
    padding = [i for i in range(ROWS) if i != LIVE]
    top_k = model.config.num_experts_per_tok
    # the routers alone would have loaded more experts for the padding rows somewhere
    assert any(len(set(ids.ravel())) > top_k for (ids,) in chosen)
    for (router_ids,), (ids, weights) in zip(chosen, routed):
        if ids.shape[1] == top_k + 1:  # a gated shared expert folded in as expert E
            assert np.all(ids[:, -1] == model.config.num_experts)
            assert np.all(weights[padding, -1] == 0) and weights[LIVE, -1] > 0
            ids, weights = ids[:, :-1], weights[:, :-1]
        assert set(ids.ravel()) == set(router_ids[LIVE]) and len(set(ids[LIVE])) == top_k
        np.testing.assert_array_equal(ids[LIVE], router_ids[LIVE])
        assert np.all(weights[padding] == 0) and np.all(weights[LIVE] > 0)
    # the live row's logits: those of the row stepped alone, and bit for bit those of the
    # same step with the padding rows' own experts computed
    alone = model.decode(kv, 1, 0)
    # f32 rounding only: XLA:CPU picks other dot kernels for 4 rows and 1 (an AVX2-only host:
    # 1.9e-5 on a logit of 40.9), where a wrong expert moves logits by whole units
    np.testing.assert_allclose(masked[LIVE], alone[0], atol=1e-5, rtol=1e-6)
    monkeypatch.setattr(moe_mlp, "without_padding_experts", lambda ids, weights, live:
                        (ids, weights))
    unmasked = model.decode(kv, ROWS, LIVE)
    np.testing.assert_array_equal(masked[LIVE], unmasked[LIVE])
