"""benchmarks/hybrid_bench.py: the device-made params mirror what the artifact path builds,
the byte/FLOP model on hand-checkable cases, and the --smoke run's JSON lines (CPU; with two
images, so the vision prefill path runs too)."""
from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_bench
import hybrid_costs
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.random_init import random_params


def _described(tree):
    leaves, structure = jax.tree_util.tree_flatten(tree)
    return structure, [(leaf.shape, np.dtype(leaf.dtype)) for leaf in leaves]


def test_device_params_have_the_artifact_trees_names_shapes_and_dtypes():
    # bf16 storage: norms and the DeltaNet vectors stay float32 (traced only: no compiles)
    for name in ("qwen3.6-tiny-moe", "qwen3.5-tiny"):
        config = dataclasses.replace(PRESETS[name].config, vocab_size=512)
        expected = random_params(config, seed=0, dtype="bf16")
        with_mtp = jax.eval_shape(
            lambda: hybrid_bench.device_params(config, jnp.bfloat16, mtp=True))
        assert _described(with_mtp) == _described(expected)
        expected.pop("mtp")  # without --mtp the runner never reads the MTP head
        got = jax.eval_shape(lambda: hybrid_bench.device_params(config, jnp.bfloat16))
        assert _described(got) == _described(expected)


def test_joined_params_are_the_runners_join_and_it_keeps_them(monkeypatch):
    """device_params(fuse=True) joins each layer as it is drawn: leaf for leaf the tree the
    runner would join from the unjoined one, and the runner places those very arrays (no
    second copy). Leaves past BLOCK_ELEMENTS (made small here) are drawn in blocks, each its
    own key, with the leaf's law."""
    from ninfer_jax.engine.runner import place_params
    from ninfer_jax.model import fused_projections

    monkeypatch.setattr(hybrid_bench, "BLOCK_ELEMENTS", 4096)
    hybrid_bench._random_leaf.clear_cache()  # traces made with the real block size
    try:
        for name in ("qwen3.5-tiny", "qwen3.6-tiny-moe"):
            config = dataclasses.replace(PRESETS[name].config, vocab_size=512)
            joined = hybrid_bench.device_params(config, jnp.float32, mtp=True, fuse=True)
            expected = fused_projections.fuse_projections(
                hybrid_bench.device_params(config, jnp.float32, mtp=True), config)
            assert jax.tree.structure(joined) == jax.tree.structure(expected)
            assert all(np.array_equal(a, b) for a, b in
                       zip(jax.tree.leaves(joined), jax.tree.leaves(expected)))
            assert "in_qkvzba" in joined["layers"][0] and "in_qkv" not in joined["layers"][0]
            placed = place_params(joined, config, jnp.float32)
            assert all(a is b for a, b in zip(jax.tree.leaves(joined), jax.tree.leaves(placed)))
        embed = np.asarray(joined["embed"])  # 512 x 64: 8 blocks of 64 rows, std 1
        assert hybrid_bench._block_rows(embed.shape) == 64
        assert abs(embed.std() - 1.0) < 0.05 and abs(embed.mean()) < 0.05
        assert not np.array_equal(embed[:64], embed[64:128])
    finally:
        hybrid_bench._random_leaf.clear_cache()


def test_expected_distinct_experts():
    assert hybrid_costs.expected_distinct_experts(256, 8, 1) == 8
    assert 15.7 < hybrid_costs.expected_distinct_experts(256, 8, 2) < 15.8
    assert hybrid_costs.expected_distinct_experts(256, 8, 10_000) == 256


@pytest.mark.parametrize("preset", ["qwen3.6-tiny-moe", "nemotron-3-nano-tiny"])
def test_decode_bytes_count_each_weight_once_and_only_selected_experts(preset):
    # nemotron: squared-ReLU experts (experts_up, no gate), whose bytes run 37 first counted whole
    config = dataclasses.replace(PRESETS[preset].config, vocab_size=512)
    params = jax.eval_shape(lambda: hybrid_bench.device_params(config, jnp.bfloat16))
    one = hybrid_costs.decode_bytes(config, params, rows=1, context=0, kv_itemsize=2,
                                    state_itemsize=2)
    experts = sum(hybrid_costs.tree_bytes(layer[name]) for layer in params["layers"]
                  for name in hybrid_costs.EXPERT_LEAVES if name in layer)
    k, E = config.num_experts_per_tok, config.num_experts
    assert experts and one["expert_bytes"] == experts * k // E
    embed_row = 0 if config.tie_word_embeddings else config.hidden_size * 2
    # tied embeddings: the table is read whole as the LM head, no separate row
    assert one["weight_bytes"] == \
        hybrid_costs.tree_bytes(params) - experts + experts * k // E + embed_row
    assert one["bytes"] == one["weight_bytes"] + one["kv_bytes"] + one["state_bytes"]
    if preset == "qwen3.6-tiny-moe":
        # one attention layer: k and v of 2 KV heads x 16 dims read at position 0 and written
        assert one["kv_bytes"] == 2 * (2 * 1 * 16 * 2)
    many = hybrid_costs.decode_bytes(config, params, rows=64, context=0, kv_itemsize=2,
                                     state_itemsize=2)
    assert one["expert_bytes"] < many["expert_bytes"] <= experts


def test_smoke_run_prints_sane_json_lines(capsys):
    # Compiles are most of the time (about 1.5 s a step shape on CPU): with two-row buckets,
    # as on the GPU, batches 1 and 2 share one decode shape and batch 1 runs padded.
    records = hybrid_bench.main(["--smoke", "--json", "--images", "2", "--image-size", "64",
                                 "--min-rows", "2"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{")]
    assert lines == records
    for preset in ("qwen3.5-tiny", "qwen3.6-tiny-moe"):
        mine = {(r["op"], r.get("batch", r.get("rows"))): r for r in records
                if r["preset"] == preset}
        assert set(mine) == {("setup", None), ("decode", 1), ("decode", 2), ("prefill", None),
                             ("prefill_images", None), ("gdn_prefill", None),
                             ("gdn_decode", 1), ("gdn_decode", 2)}
        assert mine["setup", None]["gemv_bytes_per_s"] > 0
        assert mine["setup", None]["matmul_flops_per_s"] > 0
        assert [mine["decode", batch]["padded_rows"] for batch in (1, 2)] == [2, 2]
        for batch in (1, 2):
            decode = mine["decode", batch]
            assert decode["tok_per_s"] > 0 and decode["ms_per_step"] > 0
            assert decode["bytes"] >= decode["weight_bytes"] > 0
            assert decode["kv_bytes"] > 0 and decode["state_bytes"] > 0
            assert decode["bandwidth_bytes_per_s"] > 0 and decode["fraction_of_gemv_ceiling"] > 0
        prefill = mine["prefill", None]
        assert prefill["tok_per_s"] > 0 and prefill["prompt"] == 48
        assert prefill["flops"] > prefill["weight_flops"] > 0 and prefill["gdn_flops"] > 0
        assert 0 < prefill["fraction_of_matmul_rate"]
        images = mine["prefill_images", None]
        # two 4 x 4-patch images of 4 tokens each inside the 48-token prompt
        assert (images["image_tokens"], images["patches"], images["prompt"]) == (8, 32, 48)
        assert images["tok_per_s"] > 0 and 0 < images["encode_ms"] < images["ms"]
        gdn = mine["gdn_prefill", None]
        assert list(gdn["layer_ms"]) == ["reference"] == [gdn["serving_path"]]  # CPU
        assert set(gdn["kernel_ms"]) == {"reference", "reference_unrolled", "wy"}
        assert all(ms > 0 for ms in [*gdn["layer_ms"].values(), *gdn["kernel_ms"].values()])
        assert gdn["layer_flops"] > gdn["kernel_flops"] > 0
        assert gdn["kernel_fraction_of_matmul_rate"]["wy"] > 0
        for rows in (1, 2):
            gdn = mine["gdn_decode", rows]
            assert gdn["ms"] > 0 and gdn["weight_bytes"] > 0
            assert gdn["state_bytes"] == rows * mine["gdn_decode", 1]["state_bytes"] > 0
    moe = next(r for r in records if r["preset"] == "qwen3.6-tiny-moe" and r["op"] == "decode")
    assert moe["expert_bytes"] > 0 and moe["experts_touched_per_layer"] == 2.0


def test_verify_steps_with_the_mtp_head_drafting(capsys):
    """--verify / --mtp / --mtp-acceptance on the tiny hybrid: a verify record per K against
    the plain step, and the scheduler's MTP rounds (random weights: drafts made, not kept)."""
    # One row bucket of 3 (B x (K + 1) at the largest K): the plain step, K = 1 and the MTP
    # rounds run padded in it, so two MTP step shapes compile (decode, chunk; about 2.5 s each
    # on CPU), not four.
    records = hybrid_bench.main(["--smoke", "--json", "--presets", "qwen3.5-tiny", "--batches",
                                 "1", "--verify", "1,2", "--mtp", "2", "--mtp-acceptance", "12",
                                 "--no-gdn", "--min-rows", "3"])
    verify = [r for r in records if r["op"] == "verify"]
    assert [(r["batch"], r["draft_tokens"], r["rows"]) for r in verify] == [(1, 1, 2), (1, 2, 3)]
    assert all(r["ms_per_step"] > 0 and r["plain_ms_per_step"] > 0 for r in verify)
    (acceptance,) = [r for r in records if r["op"] == "mtp_acceptance"]
    assert acceptance["rounds"] > 0 and acceptance["drafted"] >= acceptance["rounds"]
    assert not any(r["op"].startswith("gdn") for r in records)


def test_a_folded_shared_expert_costs_what_it_did_unfolded(monkeypatch):
    from ninfer_jax.model import fused_projections

    config = dataclasses.replace(PRESETS["qwen3.6-tiny-moe"].config, vocab_size=512)
    params = jax.eval_shape(lambda: hybrid_bench.device_params(config, jnp.bfloat16))
    costs = []
    for fold in ("0", "1"):
        monkeypatch.setenv(fused_projections.FOLD_ENV, fold)
        tree = jax.eval_shape(lambda p: fused_projections.fuse_projections(p, config), params)
        costs.append((hybrid_costs.decode_bytes(config, tree, rows=1, context=0,
                                                kv_itemsize=2, state_itemsize=2)["bytes"],
                      hybrid_costs.active_matmul_params(config, tree)))
    assert costs[0] == costs[1]
