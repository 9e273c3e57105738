"""Hybrid Qwen checkpoints (qwen3_5, qwen3_5_moe, qwen3_next) saved by transformers itself
convert to our params contract: every leaf equals its transformed HF tensor, the fused
Qwen3-Next projections and the conv layout are checked against what the transformers modules
compute, and a fake MTP head lands in the artifact's mtp component."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ninfer_jax.artifact.convert import convert  # noqa: E402
from ninfer_jax.artifact.format import load_artifact  # noqa: E402
from ninfer_jax.artifact.safetensors_io import write_safetensors  # noqa: E402
from ninfer_jax.errors import ArtifactError  # noqa: E402
from hf_hybrid_models import (FAMILIES, FULL_LAYER, HIDDEN, build_model,  # noqa: E402
                              save_checkpoint, state, write_packed_checkpoint)

# Our leaf -> the transformers module path inside a decoder layer (one tensor each).
SIMPLE = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
          "wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
          "wo": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
          "in_qkv": "linear_attn.in_proj_qkv", "in_z": "linear_attn.in_proj_z",
          "in_b": "linear_attn.in_proj_b", "in_a": "linear_attn.in_proj_a",
          "dt_bias": "linear_attn.dt_bias", "A_log": "linear_attn.A_log",
          "gdn_norm": "linear_attn.norm", "out": "linear_attn.out_proj",
          "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj",
          "router": "mlp.gate", "shared_gate": "mlp.shared_expert_gate",
          "shared_w_gate": "mlp.shared_expert.gate_proj",
          "shared_w_up": "mlp.shared_expert.up_proj",
          "shared_w_down": "mlp.shared_expert.down_proj"}
FUSED = ("in_qkv", "in_z", "in_b", "in_a")  # qwen3_next: checked through the module instead


def hf_tensor(tensors: dict, prefix: str, leaf: str) -> np.ndarray:
    """Our expected value of `leaf` from HF tensors named `prefix` + module path."""
    if leaf == "conv":
        return tensors[prefix + "linear_attn.conv1d.weight"][:, 0, :].T
    if leaf in ("experts_gate_up", "experts_down"):
        return _experts(tensors, prefix, leaf)
    path = prefix + SIMPLE[leaf]
    value = tensors.get(path + ".weight", tensors.get(path))
    return value.T if value.ndim == 2 else value


def _experts(tensors: dict, prefix: str, leaf: str) -> np.ndarray:
    packed = prefix + ("mlp.experts.gate_up_proj" if leaf == "experts_gate_up"
                       else "mlp.experts.down_proj")
    if packed in tensors:  # [E, out, in]
        return tensors[packed].transpose(0, 2, 1)
    count = len({n for n in tensors if n.startswith(prefix + "mlp.experts.")}) // 3
    one = lambda j, kind: tensors[f"{prefix}mlp.experts.{j}.{kind}_proj.weight"].T  # noqa: E731
    if leaf == "experts_down":
        return np.stack([one(j, "down") for j in range(count)])
    return np.stack([np.concatenate([one(j, "gate"), one(j, "up")], axis=1)
                     for j in range(count)])


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request, tmp_path_factory):
    family = request.param
    model = build_model(family)
    directory = tmp_path_factory.mktemp(family) / "hf"
    mtp = save_checkpoint(model, directory)
    artifact = load_artifact(convert(directory, directory.parent / "out.ninfer"), mtp=True)
    return family, model, mtp, artifact


def test_config_fields_come_from_the_hf_config(converted):
    family, model, _, artifact = converted
    config = artifact.config
    assert config.architecture == family
    assert config.layer_types == ("linear_attention", "full_attention", "linear_attention")
    assert (config.partial_rotary_factor, config.rope_theta, config.rope_scaling) == (0.25, 1e7, None)
    assert config.attn_output_gate and config.qk_norm and not config.tie_word_embeddings
    assert (config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
            config.linear_value_head_dim, config.linear_conv_kernel_dim) == (2, 4, 8, 6, 4)
    assert config.mtp_num_layers == 1 and artifact.components["mtp"]
    if family == "qwen3_5":
        assert (config.num_experts, config.intermediate_size) == (0, 48)
    else:
        assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                config.shared_expert_intermediate_size, config.norm_topk_prob) == (4, 2, 12, 20, True)
        assert config.mlp_only_layers == ((2,) if family == "qwen3_next" else ())
    assert artifact.eos_ids == [262]


def test_every_text_leaf_is_its_transformed_hf_tensor(converted):
    family, model, _, artifact = converted
    tensors = state(model)
    np.testing.assert_array_equal(artifact.params["embed"], tensors["model.embed_tokens.weight"])
    np.testing.assert_array_equal(artifact.params["final_norm"], tensors["model.norm.weight"])
    np.testing.assert_array_equal(artifact.params["lm_head"], tensors["lm_head.weight"].T)
    for i, layer in enumerate(artifact.params["layers"]):
        for leaf, value in layer.items():
            if family == "qwen3_next" and leaf in FUSED:
                continue
            np.testing.assert_array_equal(value, hf_tensor(tensors, f"model.layers.{i}.", leaf),
                                          err_msg=f"layers.{i}.{leaf}")


def test_the_mtp_head_lands_in_the_mtp_component(converted):
    family, _, mtp, artifact = converted
    head = artifact.params["mtp"]
    np.testing.assert_array_equal(head["fc"], mtp["mtp.fc.weight"].T)
    assert head["fc"].shape == (2 * HIDDEN, HIDDEN)
    for name in ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        np.testing.assert_array_equal(head[name], mtp[f"mtp.{name}.weight"])
    (layer,) = head["layers"]
    assert set(layer) == set(artifact.params["layers"][FULL_LAYER])
    for leaf, value in layer.items():
        np.testing.assert_array_equal(value, hf_tensor(mtp, "mtp.layers.0.", leaf), err_msg=leaf)
    assert "mtp" not in load_artifact(artifact.path).params  # loaded only when asked for


def test_fused_qwen3_next_projections_match_the_module(converted):
    """x = I makes the module's outputs the exact columns of the un-grouped weights."""
    family, model, _, artifact = converted
    if family != "qwen3_next":
        pytest.skip("only Qwen3-Next groups in_proj_qkvz / in_proj_ba per key head")
    module = model.model.layers[0].linear_attn
    layer = artifact.params["layers"][0]
    eye = torch.eye(HIDDEN)[None]
    with torch.no_grad():
        q, k, v, z, b, a = module.fix_query_key_value_ordering(module.in_proj_qkvz(eye),
                                                               module.in_proj_ba(eye))
    flat = lambda t: t[0].reshape(HIDDEN, -1).numpy()  # noqa: E731  [H, heads * dim]
    np.testing.assert_array_equal(layer["in_qkv"], np.concatenate([flat(q), flat(k), flat(v)], 1))
    np.testing.assert_array_equal(layer["in_z"], flat(z))
    np.testing.assert_array_equal(layer["in_b"], flat(b))
    np.testing.assert_array_equal(layer["in_a"], flat(a))


def test_conv_and_gated_query_layouts_match_the_modules(converted):
    _, model, _, artifact = converted
    layers = model.model.layers if hasattr(model.model, "layers") else None
    gdn, attn = layers[0].linear_attn, layers[FULL_LAYER].self_attn
    ours, full = artifact.params["layers"][0], artifact.params["layers"][FULL_LAYER]
    x = np.random.default_rng(0).standard_normal((1, gdn.conv_dim, 7)).astype(np.float32)
    with torch.no_grad():
        theirs = gdn.conv1d(torch.from_numpy(x))[..., :7].numpy()[0]  # causal: first T outputs
    taps = ours["conv"].shape[0]
    padded = np.concatenate([np.zeros((taps - 1, gdn.conv_dim), np.float32), x[0].T])
    mine = sum(padded[j:j + 7] * ours["conv"][j] for j in range(taps))  # [T, conv_dim]
    np.testing.assert_allclose(mine, theirs.T, rtol=1e-5, atol=1e-5)
    h = torch.randn(3, HIDDEN)
    with torch.no_grad():
        query, gate = attn.q_proj(h).view(3, -1, 2 * attn.head_dim).chunk(2, dim=-1)
    per_head = (h.numpy() @ full["wq"]).reshape(3, -1, 2 * attn.head_dim)
    np.testing.assert_allclose(per_head[..., :attn.head_dim], query.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(per_head[..., attn.head_dim:], gate.numpy(), rtol=1e-5, atol=1e-5)


def test_experts_compute_what_the_moe_block_computes(converted):
    family, model, _, artifact = converted
    if family == "qwen3_5":
        pytest.skip("dense MLP")
    experts, layer = model.model.layers[0].mlp.experts, artifact.params["layers"][0]
    x = torch.randn(5, HIDDEN)
    chosen = torch.tensor([[0, 3], [1, 2], [2, 0], [3, 1], [1, 3]])
    weights = torch.rand(5, 2)
    with torch.no_grad():
        theirs = experts(x, chosen, weights).numpy()
    inter = layer["experts_down"].shape[1]
    mine = np.zeros_like(theirs)
    for t in range(5):
        for slot in range(2):
            j = int(chosen[t, slot])
            gate_up = x[t].numpy() @ layer["experts_gate_up"][j]
            act = gate_up[:inter] / (1 + np.exp(-gate_up[:inter])) * gate_up[inter:]
            mine[t] += float(weights[t, slot]) * (act @ layer["experts_down"][j])
    np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)


def test_packed_experts_convert_like_one_tensor_per_expert(converted, tmp_path):
    family, model, _, artifact = converted
    if family == "qwen3_5":
        pytest.skip("dense MLP")
    write_packed_checkpoint(model, tmp_path / "packed")
    packed = load_artifact(convert(tmp_path / "packed", tmp_path / "packed.ninfer"))
    assert packed.config.mtp_num_layers == 0 and not packed.components["mtp"]
    for ours, theirs in zip(packed.params["layers"], artifact.params["layers"]):
        assert set(ours) == set(theirs)
        for leaf in ours:
            np.testing.assert_array_equal(ours[leaf], theirs[leaf], err_msg=leaf)


def test_multimodal_wrapper_converts_its_language_model_and_tower(tmp_path):
    model = build_model("qwen3_5", multimodal=True)
    save_checkpoint(model, tmp_path / "hf", mtp=False)
    artifact = load_artifact(convert(tmp_path / "hf", tmp_path / "out.ninfer"), vision=True)
    tensors = state(model)
    assert artifact.config.architecture == "qwen3_5" and artifact.config.num_layers == 3
    assert artifact.components["vision"] and not artifact.components["mtp"]
    assert artifact.config.mrope_section == (1, 1, 0)
    vision = artifact.vision_config
    assert vision.depth == 1 and vision.deepstack_layers == () and vision.image_token_id == 256
    assert "deepstack" not in artifact.params["vision"]
    conv = tensors["model.visual.patch_embed.proj.weight"]
    np.testing.assert_array_equal(artifact.params["vision"]["patch_embed"],
                                  conv.reshape(conv.shape[0], -1).T)
    np.testing.assert_array_equal(artifact.params["vision"]["blocks"][0]["wqkv"],
                                  tensors["model.visual.blocks.0.attn.qkv.weight"].T)
    np.testing.assert_array_equal(artifact.params["layers"][1]["wq"],
                                  tensors["model.language_model.layers.1.self_attn.q_proj.weight"].T)
    np.testing.assert_array_equal(artifact.params["embed"],
                                  tensors["model.language_model.embed_tokens.weight"])


def test_incomplete_or_extra_experts_are_refused(tmp_path):
    model = build_model("qwen3_next")
    save_checkpoint(model, tmp_path / "hf", mtp=False)
    write_safetensors(tmp_path / "hf" / "extra.safetensors", {
        "model.layers.0.mlp.experts.9.up_proj.weight": np.zeros((12, HIDDEN), np.float32)})
    with pytest.raises(ArtifactError, match="expert 9 is beyond num_experts=4"):
        convert(tmp_path / "hf", tmp_path / "x.ninfer")
    (tmp_path / "hf" / "extra.safetensors").unlink()
    write_packed_checkpoint(model, tmp_path / "short")
    tensors = state(model)
    del tensors["model.layers.0.mlp.experts.gate_up_proj"]
    for j in range(3):  # one-per-expert gate and down of experts 0-2 only
        tensors[f"model.layers.0.mlp.experts.{j}.gate_proj.weight"] = np.zeros((12, HIDDEN),
                                                                            np.float32)
    write_safetensors(tmp_path / "short" / "model.safetensors", tensors)
    with pytest.raises(ArtifactError, match=r"layers.0.mlp.experts incomplete \(missing \['down:0'"):
        convert(tmp_path / "short", tmp_path / "x.ninfer")
    assert not (tmp_path / "x.ninfer").exists()


def test_cli_converts_a_moe_checkpoint_with_quantized_projections(tmp_path):
    import json

    from click.testing import CliRunner

    from ninfer_jax.cli.main import main

    model = build_model("qwen3_5_moe")
    save_checkpoint(model, tmp_path / "hf")
    out = tmp_path / "int8.ninfer"
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "hf"), str(out), "--dtype", "bf16",
                                       "--weights", "int8", "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    artifact = load_artifact(out, mtp=True)
    assert artifact.weight_formats == {"embed": "bf16", "layers": "int8", "norms": "f32",
                                       "lm_head": "int8", "mtp": "int8"}
    linear, head = artifact.params["layers"][0], artifact.params["mtp"]
    assert set(linear["in_qkv"]) == {"int8", "scale"} and set(head["fc"]) == {"int8", "scale"}
    assert set(head["layers"][0]["wq"]) == {"int8", "scale"}
    # Kept in float: stacked experts, router and gates, conv taps; f32 per-head vectors.
    for leaf in ("experts_gate_up", "router", "shared_gate", "conv", "in_b"):
        assert str(linear[leaf].dtype) == "bfloat16", leaf
    assert str(linear["A_log"].dtype) == str(linear["dt_bias"].dtype) == "float32"
    inspected = CliRunner().invoke(main, ["inspect-artifact", str(out), "--json"])
    report = json.loads(inspected.output)
    assert report["model"]["layers"]["pattern"] == "1 linear, 1 full, 1 linear"
    assert report["model"]["moe"]["experts"] == 4 and report["model"]["mtp"]["layers"] == 1
    assert {r["name"]: r["format"] for r in report["tensors"]}["mtp.fc.int8"] == "int8"
