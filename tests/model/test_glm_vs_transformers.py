"""The GLM MoE family (glm4_moe) against transformers' Glm4MoeForCausalLM in f32.

A tiny random model with every norm weight, bias and e_score_correction_bias randomised,
q/k norms and attention biases on, partial RoPE (half the head), one dense first layer then
MoE layers whose router picks 3 of 8 experts from the 2 best of 4 groups with a scaling
factor, and a shared expert. The weights go through our converter (save_pretrained, then
hf_convert / hf_hybrid), so the tensor names are checked too. Checks:
  - a prompt in chunks at odd offsets (13, 17, a padded 7) through a shuffled page table, then
    16 decode steps beside a padding row: every logit row within 1e-4 of HF's full forward;
  - a mixed ragged step (one sequence's chunk plus another's decode row);
  - greedy decoding of 16 tokens from our own samples equals HF's generate.
"""
from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

from ninfer_jax.artifact import hf_convert, hf_hybrid
from ninfer_jax.artifact.hf_convert import _sources
from ninfer_jax.kernels.paged_attention import DUMMY_PAGE
from ninfer_jax.model import glm, llama
from ninfer_jax.model.ragged_batch import FROM_HOST, RaggedBatch

PAGE_SIZE = 4
WIDTH = 16  # pages per table: 64 positions
NUM_PAGES = 1 + 2 * WIDTH
CHUNK = 17
PROMPT_LEN = 37  # chunks of 13, 17 and a padded 7
NUM_DECODE = 16
TOLERANCE = 1e-4


@pytest.fixture(autouse=True)
def exact_f32_matmuls():
    with jax.default_matmul_precision("highest"):
        yield


def tiny_glm_model(seed: int = 0):
    torch.manual_seed(seed)
    hf_config = Glm4MoeConfig(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, head_dim=16, moe_intermediate_size=24,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, first_k_dense_replace=1, use_qk_norm=True,
        attention_bias=True, rms_norm_eps=1e-6, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                         "partial_rotary_factor": 0.5},
        attn_implementation="eager")
    model = Glm4MoeForCausalLM(hf_config)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.copy_(1.0 + 0.3 * torch.randn_like(tensor))
            else:
                tensor.copy_(0.15 * torch.randn_like(tensor))
        for layer in model.model.layers[1:]:
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(0.2 * torch.randn_like(bias))
    return model.float().eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    model = tiny_glm_model()
    checkpoint = tmp_path_factory.mktemp("glm4_moe")
    model.save_pretrained(checkpoint)
    config = hf_convert.model_config(model.config.to_dict() | {
        "architectures": ["Glm4MoeForCausalLM"]}, pathlib.Path(checkpoint, "config.json"))
    params = hf_hybrid.hybrid_params(_sources(checkpoint), config, "f32", None)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, (2, PROMPT_LEN + NUM_DECODE))
    with torch.no_grad():
        expected = [model(torch.tensor([list(seq)])).logits[0].float().numpy() for seq in tokens]
    tables = np.random.default_rng(2).permutation(np.arange(1, NUM_PAGES)).astype(
        np.int32).reshape(2, WIDTH)
    steps = {name: jax.jit(functools.partial(getattr(glm, name), config=config,
                                             page_size=PAGE_SIZE))
             for name in ("prefill", "decode", "ragged")}  # compiled once for the module
    return model, config, params, tokens, expected, tables, steps


def empty_kv(config):
    return llama.init_caches(config, num_pages=NUM_PAGES, page_size=PAGE_SIZE,
                             num_state_slots=0, dtype=jnp.float32, kv_dtype=jnp.float32)


def decode_rows(decode, params, kv, token, position, table):
    """One decode step of one sequence beside a padding row (one compiled shape)."""
    padding_table = np.full(WIDTH, DUMMY_PAGE, np.int32)
    logits, kv = decode(params, kv, np.array([token, 0], np.int32),
                        np.array([position, 0], np.int32), np.stack([table, padding_table]))
    return logits[0], kv


def prefill_prompt(prefill, params, kv, tokens, table, *, length=PROMPT_LEN, expected=None):
    """Chunks of 13, 17, 7 (padded to CHUNK); each chunk's last logits checked if asked."""
    start = 0
    for num in (13, 17, length - 30):
        chunk = np.zeros(CHUNK, np.int32)
        chunk[:num] = tokens[start:start + num]
        logits, kv = prefill(params, kv, chunk, np.int32(start), np.int32(num), table)
        if expected is not None:
            np.testing.assert_allclose(np.asarray(logits), expected[start + num - 1],
                                       atol=TOLERANCE, rtol=0)
        start += num
    return logits, kv


def test_config_reads_the_glm_fields(world):
    _, config, params, *_ = world
    assert config.architecture == "glm4_moe" and config.mlp_only_layers == (0,)
    assert (config.num_expert_groups, config.num_topk_groups) == (4, 2)
    assert config.routed_scaling_factor == 2.5 and config.partial_rotary_factor == 0.5
    assert config.qk_norm and config.attention_bias
    assert "router_bias" in params["layers"][1] and "w_gate" in params["layers"][0]
    assert "shared_gate" not in params["layers"][1]


def test_chunked_prefill_then_decode_matches_transformers(world):
    _, config, params, tokens, expected, tables, steps = world
    _, kv = prefill_prompt(steps["prefill"], params, empty_kv(config), tokens[0], tables[0],
                           expected=expected[0])
    for position in range(PROMPT_LEN, PROMPT_LEN + NUM_DECODE):
        logits, kv = decode_rows(steps["decode"], params, kv, tokens[0, position], position,
                                 tables[0])
        np.testing.assert_allclose(np.asarray(logits), expected[0][position],
                                   atol=TOLERANCE, rtol=0)


def test_mixed_ragged_step_matches_transformers(world):
    _, config, params, tokens, expected, tables, steps = world
    _, kv = prefill_prompt(steps["prefill"], params, empty_kv(config), tokens[1], tables[1])
    # Sequence 0's first 13 tokens as the chunk, sequence 1's token 37 as a decode row.
    chunk = np.zeros(CHUNK, np.int32)
    chunk[:13] = tokens[0, :13]
    batch = RaggedBatch(
        chunk_tokens=jnp.asarray(chunk), chunk_start=jnp.int32(0), chunk_len=jnp.int32(13),
        chunk_table=jnp.asarray(tables[0]),
        row_tokens=jnp.asarray([tokens[1, PROMPT_LEN], 0], jnp.int32),
        row_src=jnp.full(2, FROM_HOST, jnp.int32),
        row_positions=jnp.asarray([PROMPT_LEN, 0], jnp.int32),
        row_tables=jnp.asarray(np.stack([tables[1], np.full(WIDTH, DUMMY_PAGE, np.int32)])))
    logits, _ = steps["ragged"](params, kv, batch, None)
    np.testing.assert_allclose(np.asarray(logits[0]), expected[0][12], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(np.asarray(logits[1]), expected[1][PROMPT_LEN],
                               atol=TOLERANCE, rtol=0)


def test_greedy_decoding_equals_transformers_generate(world):
    model, config, params, tokens, _, tables, steps = world
    logits, kv = prefill_prompt(steps["prefill"], params, empty_kv(config), tokens[0],
                                tables[0])
    ours = [int(np.argmax(logits))]
    for position in range(PROMPT_LEN, PROMPT_LEN + NUM_DECODE - 1):
        logits, kv = decode_rows(steps["decode"], params, kv, ours[-1], position, tables[0])
        ours.append(int(np.argmax(logits)))
    with torch.no_grad():
        theirs = model.generate(torch.tensor([list(tokens[0, :PROMPT_LEN])]), do_sample=False,
                                max_new_tokens=NUM_DECODE, pad_token_id=0)[0, PROMPT_LEN:]
    assert ours == theirs.tolist()
