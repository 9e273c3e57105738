"""Drafter components: `ninfer convert ARTIFACT OUT --dflash DIR` imports checkpoints written
here in the public DFlash / DFlash2 layout (z-lab/dflash: torch [out, in] weights, HF names,
config.json with dflash_config), and --lm-head-draft-vocab adds the reduced proposal head;
the artifact reads them back as the components, tensor for tensor."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ninfer_jax.artifact import convert
from ninfer_jax.artifact.format import load_artifact
from ninfer_jax.artifact.safetensors_io import write_safetensors
from ninfer_jax.errors import ArtifactError

H, LAYERS, HEADS, KV, D, F, V = 16, 2, 4, 2, 4, 24, 264  # the tiny llama's H and V


def public_checkpoint(directory, variant: str, seed: int = 0, hidden: int = H) -> dict:
    """A DFlash (variant "dflash") or DFlash2 checkpoint directory with random tensors in
    the public names and layout; returns the tensors by their public name."""
    rng = np.random.default_rng(seed)
    tensors = {"fc.weight": (hidden, 2 * hidden), "hidden_norm.weight": (hidden,),
               "norm.weight": (hidden,)}
    for i in range(LAYERS):
        layer = {"input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
                 "self_attn.q_proj.weight": (HEADS * D, hidden),
                 "self_attn.k_proj.weight": (KV * D, hidden),
                 "self_attn.v_proj.weight": (KV * D, hidden),
                 "self_attn.o_proj.weight": (hidden, HEADS * D),
                 "self_attn.q_norm.weight": (D,), "self_attn.k_norm.weight": (D,),
                 "mlp.gate_proj.weight": (F, hidden), "mlp.up_proj.weight": (F, hidden),
                 "mlp.down_proj.weight": (hidden, F)}
        if variant == "dflash2":
            for conv in ("attention_conv", "mlp_conv"):
                layer[f"{conv}.base_kernel"] = (2, 2, hidden)
                layer[f"{conv}.kernel_projection.weight"] = (2 * 2 * hidden // 8, hidden)
        tensors.update({f"layers.{i}.{name}": shape for name, shape in layer.items()})
    extra = {"target_layer_ids": [0, 1], "block_size": 16, "mask_token_id": 260}
    if variant == "dflash2":
        tensors.update({"candidate_selector.hidden_projection.weight": (8, hidden),
                        "candidate_selector.predecessor_codebook": (V, 8),
                        "candidate_selector.successor_codebook": (V, 8)})
        extra.update(conv_kernel_size=2, conv_group_size=8, selector_rank=8, selector_top_k=4,
                     output_multiplier=0.5, final_logit_softcapping=20.0)
    arrays = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in tensors.items()}
    arrays["embed_tokens.weight"] = np.zeros((V, hidden), np.float32)  # the target's: skipped
    config = {"architectures": ["DFlash2DraftModel" if variant == "dflash2"
                                else "DFlashDraftModel"],
              "hidden_size": hidden, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV, "head_dim": D, "intermediate_size": F,
              "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 1e6}
    if variant == "dflash2":  # nested, as the public DFlash2 fixture has it
        config.update(dflash_config=extra, layer_types=["sliding_attention"] * LAYERS,
                      sliding_window=64, is_causal=False)
    else:  # top-level keys, which the reference reads too
        config.update(extra)
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    write_safetensors(directory / "model.safetensors", arrays)
    return arrays


def test_convert_adds_public_dflash_and_dflash2_and_the_proposal_head(tiny_artifact_dir,
                                                                      tmp_path):
    v1 = public_checkpoint(tmp_path / "v1", "dflash", seed=1)
    v2 = public_checkpoint(tmp_path / "v2", "dflash2", seed=2)
    out = convert.convert(tiny_artifact_dir, tmp_path / "out.ninfer",
                          dflash=(tmp_path / "v1", tmp_path / "v2"), draft_head_vocab=100)
    first = load_artifact(out, dflash="dflash")
    tree = first.params["dflash"]
    np.testing.assert_array_equal(tree["fc"], v1["fc.weight"].T)
    np.testing.assert_array_equal(tree["layers"][1]["wq"], v1["layers.1.self_attn.q_proj.weight"].T)
    np.testing.assert_array_equal(tree["layers"][0]["mlp_norm"],
                                  v1["layers.0.post_attention_layernorm.weight"])
    config = first.dflash_config("dflash")
    assert (config.target_layer_ids, config.mask_token_id, config.block_size,
            config.sliding_window, config.causal) == ((0, 1), 260, 16, 0, False)
    original = load_artifact(tiny_artifact_dir)
    np.testing.assert_array_equal(first.params["embed"], original.params["embed"])

    second = load_artifact(out, dflash="dflash2", draft_head=True)
    tree = second.params["dflash2"]
    np.testing.assert_array_equal(tree["selector"]["predecessor"],
                                  v2["candidate_selector.predecessor_codebook"])
    np.testing.assert_array_equal(tree["selector"]["hidden_projection"],
                                  v2["candidate_selector.hidden_projection.weight"].T)
    np.testing.assert_array_equal(tree["layers"][0]["mlp_conv_proj"],
                                  v2["layers.0.mlp_conv.kernel_projection.weight"].T)
    config = second.dflash_config("dflash2")
    assert (config.sliding_window, config.selector_top_k, config.output_multiplier,
            config.final_logit_softcapping) == (64, 4, 0.5, 20.0)
    head = second.params["draft_head"]
    np.testing.assert_array_equal(head["token_ids"], np.arange(100))
    np.testing.assert_array_equal(head["weight"], original.params["lm_head"][:, :100])
    assert "dflash" not in second.params  # only the drafter asked for is read


def test_a_bad_public_checkpoint_or_a_missing_component_is_an_error(tiny_artifact_dir,
                                                                   tmp_path):
    with pytest.raises(ArtifactError, match="no dflash component"):
        load_artifact(tiny_artifact_dir, dflash="dflash")
    public_checkpoint(tmp_path / "wide", "dflash", hidden=2 * H)
    with pytest.raises(ValueError, match="hidden size"):
        convert.convert(tiny_artifact_dir, tmp_path / "a.ninfer", dflash=(tmp_path / "wide",))
    arrays = public_checkpoint(tmp_path / "odd", "dflash")
    write_safetensors(tmp_path / "odd" / "model.safetensors",
                      {**arrays, "layers.0.self_attn.q_bias": np.zeros(16, np.float32)})
    with pytest.raises(ArtifactError, match="unknown DFlash tensor layers.0.self_attn.q_bias"):
        convert.convert(tiny_artifact_dir, tmp_path / "b.ninfer", dflash=(tmp_path / "odd",))
    assert not (tmp_path / "a.ninfer").exists() and not (tmp_path / "b.ninfer").exists()
