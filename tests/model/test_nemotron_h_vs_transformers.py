"""The Nemotron-H family (nemotron_h) against transformers' NemotronHForCausalLM in f32.

A tiny random model "M*-M-M" (Mamba-2, attention, MLP layers; two B/C groups, head dim and
state size distinct, the gated norm in two groups, an untied head) with every norm weight
randomised and A_log, dt_bias, D and the conv drawn so the SSM state spans chunks; and its
MoE twin "M*E-ME" (Nemotron 3's MoE layers: 8 squared-ReLU experts of 16, top 2 within the
best 1 of 2 groups, a random correction bias, routed scale 2.5, a shared expert of 24).
Every check below runs on both. The weights
go through our converter (save_pretrained, then hf_convert / hf_nemotron), so the tensor names
are checked too. Each logit row must match the HF full-sequence forward within 1e-4:
  - one prefill chunk of a 70-token prompt (two 64-token SSD blocks inside it);
  - a prompt in chunks at odd offsets (13, 17, a padded 7) through a shuffled page table on a
    state slot other than DUMMY_STATE_SLOT, then 16 decode steps beside padding rows;
  - three sequences on their own pages and slots: a mixed ragged step (one sequence's chunk
    plus the others' decode rows), then decode batches at different positions.
"""
from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import NemotronHConfig, NemotronHForCausalLM

from hf_reference import randomize
from ninfer_jax.artifact import hf_convert, hf_nemotron
from ninfer_jax.artifact.hf_convert import _sources
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE
from ninfer_jax.model import nemotron_h, steps
from ninfer_jax.model.ragged_batch import DUMMY_STATE_SLOT, FROM_HOST, RaggedBatch

PAGE_SIZE = 4
WIDTH = 20  # pages per table: 80 positions
NUM_PAGES = 1 + 3 * WIDTH
NUM_STATE_SLOTS = 5
CHUNK = 17
PROMPT_LEN = 37  # chunks of 13, 17 and a padded 7
NUM_DECODE = 16
LONG_PROMPT = 70
NUM_ROWS = 4
TOLERANCE = 1e-4


@pytest.fixture(autouse=True)
def exact_f32_matmuls():
    with jax.default_matmul_precision("highest"):
        yield


PATTERNS = {"dense": "M*-M-M", "moe": "M*E-ME"}
MOE = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
           moe_shared_expert_intermediate_size=24, n_group=2, topk_group=1,
           routed_scaling_factor=2.5)


def tiny_nemotron_model(seed: int = 0, kind: str = "dense"):
    torch.manual_seed(seed)
    hf_config = NemotronHConfig(
        vocab_size=96, hidden_size=32, hybrid_override_pattern=PATTERNS[kind],
        **(MOE if kind == "moe" else {}),
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=40,
        mamba_num_heads=4, mamba_head_dim=6, ssm_state_size=10, n_groups=2, conv_kernel=4,
        chunk_size=16, layer_norm_epsilon=1e-6, max_position_embeddings=256,
        tie_word_embeddings=False, attn_implementation="eager")
    model = NemotronHForCausalLM(hf_config)
    randomize(model)  # every *norm.weight around 1, the rest 0.15 * noise
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.block_type == "linear_attention":
                mixer = layer.mixer
                mixer.A_log.copy_(-1.0 + 0.5 * torch.randn_like(mixer.A_log))
                mixer.dt_bias.copy_(-1.0 + 0.5 * torch.randn_like(mixer.dt_bias))
                mixer.D.copy_(torch.randn_like(mixer.D))
                mixer.conv1d.weight.copy_(0.5 * torch.randn_like(mixer.conv1d.weight))
            if layer.block_type == "moe":
                bias = layer.mixer.gate.e_score_correction_bias
                bias.copy_(0.1 * torch.randn_like(bias))
                layer.mixer.gate.weight.copy_(torch.randn_like(layer.mixer.gate.weight))
    return model.float().eval()


class World:
    """The model through our converter, three sequences with their pages and HF's logits,
    and the jitted steps (compiled once per shape for the module)."""

    def __init__(self, checkpoint: pathlib.Path, kind: str):
        self.kind = kind
        self.model = tiny_nemotron_model(kind=kind)
        self.model.save_pretrained(checkpoint)
        self.config = hf_convert.model_config(
            self.model.config.to_dict() | {"architectures": ["NemotronHForCausalLM"]},
            checkpoint / "config.json")
        params = hf_nemotron.nemotron_params(_sources(checkpoint), self.config, "f32", None)
        self.params = jax.tree_util.tree_map(jnp.asarray, params)
        rng = np.random.default_rng(1)
        self.tokens = rng.integers(0, self.config.vocab_size, (3, LONG_PROMPT))
        with torch.no_grad():
            self.expected = [self.model(torch.tensor([list(seq)])).logits[0].float().numpy()
                             for seq in self.tokens]
        self.tables = rng.permutation(np.arange(1, NUM_PAGES)).astype(np.int32).reshape(3, WIDTH)
        static = dict(config=self.config, page_size=PAGE_SIZE)
        self.ragged = jax.jit(functools.partial(nemotron_h.ragged, **static))
        self.prefill = jax.jit(functools.partial(nemotron_h.prefill, **static))
        self.decode = jax.jit(functools.partial(nemotron_h.decode, **static))

    def empty_caches(self):
        return nemotron_h.init_caches(self.config, num_pages=NUM_PAGES, page_size=PAGE_SIZE,
                                      num_state_slots=NUM_STATE_SLOTS, dtype=jnp.float32,
                                      kv_dtype=jnp.float32)

    def batch(self, chunk=None, rows=()):
        """chunk = (sequence, start, length, slot) padded to CHUNK tokens, or None; rows =
        (sequence, position, slot) padded to NUM_ROWS rows (one compiled shape per kind)."""
        C = CHUNK if chunk else 0
        chunk_tokens = np.zeros(C, np.int32)
        chunk_start, chunk_len, chunk_table, chunk_slot = 0, 0, np.zeros(WIDTH), 0
        if chunk:
            seq, chunk_start, chunk_len, chunk_slot = chunk
            chunk_tokens[:chunk_len] = self.tokens[seq, chunk_start:chunk_start + chunk_len]
            chunk_table = self.tables[seq]
        rows = list(rows) + [None] * (NUM_ROWS - len(rows))
        ints = functools.partial(jnp.asarray, dtype=jnp.int32)
        return RaggedBatch(
            ints(chunk_tokens), ints(chunk_start), ints(chunk_len), ints(chunk_table),
            ints([self.tokens[r[0], r[1]] if r else 0 for r in rows]),
            ints([FROM_HOST] * NUM_ROWS), ints([r[1] if r else 0 for r in rows]),
            ints([self.tables[r[0]] if r else np.full(WIDTH, DUMMY_PAGE) for r in rows]),
            chunk_state_slot=ints(chunk_slot),
            row_state_slots=ints([r[2] if r else DUMMY_STATE_SLOT for r in rows]))

    def check(self, logits, seq, position):
        np.testing.assert_allclose(np.asarray(logits), self.expected[seq][position],
                                   atol=TOLERANCE, rtol=0)


@pytest.fixture(scope="module", params=list(PATTERNS))
def world(request, tmp_path_factory):
    return World(tmp_path_factory.mktemp("nemotron_h"), request.param)


def test_params_follow_the_config_contract(world):
    config, params = world.config, world.params
    letters = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
    assert "".join(letters[t] for t in config.layer_types) == PATTERNS[world.kind]
    if world.kind == "moe":
        assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                config.shared_expert_intermediate_size) == (8, 2, 16, 24)
        assert (config.num_expert_groups, config.num_topk_groups,
                config.routed_scaling_factor) == (2, 1, 2.5)
        assert params["layers"][2]["experts_up"].shape == (8, 32, 16)
    assert (config.mamba_num_groups, config.mamba_state_size, config.mamba_dt_max) == (2, 10, 0)
    shapes = {"embed": params["embed"].shape, "final_norm": params["final_norm"].shape,
              "lm_head": params["lm_head"].shape}
    for i, layer in enumerate(params["layers"]):
        shapes.update({f"layers.{i}.{name}": leaf.shape for name, leaf in layer.items()})
    assert shapes == config.expected_shapes()
    assert steps.FAMILIES["nemotron_h"] is nemotron_h and config.has_state


def test_one_chunk_prefill_matches_transformers(world):
    if world.kind == "moe":
        pytest.skip("the chunked and mixed steps below cover the MoE twin's prefill")
    tokens = np.zeros(72, np.int32)
    tokens[:LONG_PROMPT] = world.tokens[0]
    logits, _ = world.prefill(world.params, world.empty_caches(), tokens, np.int32(0),
                              np.int32(LONG_PROMPT), world.tables[0], np.int32(3))
    world.check(logits, 0, LONG_PROMPT - 1)


def test_chunks_at_odd_offsets_then_decode_match_transformers(world):
    kv, slot = world.empty_caches(), 2
    for start, end in ((0, 13), (13, 30), (30, PROMPT_LEN)):
        logits, kv = world.ragged(world.params, kv,
                                  world.batch(chunk=(1, start, end - start, slot)), None)
        world.check(logits[0], 1, end - 1)
    for position in range(PROMPT_LEN, PROMPT_LEN + NUM_DECODE):
        batch = world.batch(rows=[None, (1, position, slot)])
        logits, kv = world.decode(world.params, kv, batch.row_tokens, batch.row_positions,
                                  batch.row_tables, batch.row_state_slots)
        world.check(logits[1], 1, position)


def test_mixed_step_and_decode_rows_of_different_lengths_match_transformers(world):
    """Sequences 0 (prompt 9, slot 1) and 1 (prompt 22, slot 4) decode while sequence 2
    (slot 3, which held another sequence's state) prefills; then all three decode at
    different positions with a padding row between them."""
    kv = world.empty_caches()
    for chunk in ((1, 0, 17, 3), (0, 0, 7, 1), (0, 7, 2, 1), (1, 0, 17, 4), (1, 17, 5, 4)):
        _, kv = world.ragged(world.params, kv, world.batch(chunk=chunk), None)
    logits, kv = world.ragged(world.params, kv, world.batch(
        chunk=(2, 0, 17, 3), rows=[(0, 9, 1), (1, 22, 4)]), None)
    world.check(logits[0], 2, 16)
    world.check(logits[1], 0, 9)
    world.check(logits[2], 1, 22)
    _, kv = world.ragged(world.params, kv, world.batch(chunk=(2, 17, 3, 3)), None)
    for step in range(4):
        rows = [(0, 10 + step, 1), None, (2, 20 + step, 3), (1, 23 + step, 4)]
        batch = world.batch(rows=rows)
        logits, kv = world.decode(world.params, kv, batch.row_tokens, batch.row_positions,
                                  batch.row_tables, batch.row_state_slots)
        world.check(logits[0], 0, 10 + step)
        world.check(logits[2], 2, 20 + step)
        world.check(logits[3], 1, 23 + step)
