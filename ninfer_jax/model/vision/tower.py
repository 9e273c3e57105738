"""The vision tower as one pure function: encode(params, inputs) -> (embeds, deepstack).

    encode(params, VisionInputs[N rows]) -> (embeds [N/m2, O], deepstack [S, N/m2, O])

Patch embedding (the Conv3d as one product over the flattened patch), the resampled learned
positions, `depth` pre-norm ViT blocks whose attention is 2D-rotary and confined to each frame
(segment ids, grid.py), then the merger folding m2 = merge**2 consecutive rows into one token.
The deepstack taps (S = len(config.deepstack_layers), possibly 0) are the outputs of the tapped
blocks through their own mergers. Activations run in the params' dtype; norms, rotary and the
attention softmax in f32. Attention is dense over the N rows with a segment mask: fine for the
few thousand patches of one image, quadratic beyond.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.model.layers import apply_rope, linear
from ninfer_jax.model.vision.config import VisionConfig
from ninfer_jax.model.vision.grid import VisionInputs


def encode(params, inputs: VisionInputs, *, config: VisionConfig):
    """Merged embeddings of every m2 rows and the deepstack features (see module docstring)."""
    x = _affine(inputs.pixel_values.astype(params["patch_embed"].dtype), params["patch_embed"],
                params["patch_bias"])
    x = x + _positions(params["pos_embed"], inputs).astype(x.dtype)
    cos, sin = _rotary_tables(inputs.rope_hw, config)
    same_frame = inputs.segment[:, None] == inputs.segment[None, :]
    taps = []
    for index, block in enumerate(params["blocks"]):
        x = _block(x, block, cos, sin, same_frame, config)
        if index in config.deepstack_layers:
            taps.append(_merge(x, params["deepstack"][config.deepstack_layers.index(index)],
                               config, norm_after_shuffle=True))
    embeds = _merge(x, params["merger"], config, norm_after_shuffle=False)
    deepstack = jnp.stack(taps) if taps else jnp.zeros((0, *embeds.shape), embeds.dtype)
    return embeds, deepstack


def _affine(x, w, b):
    return linear(x, w) + b.astype(x.dtype)


def _positions(table, inputs: VisionInputs):
    """Each row's bilinear blend of four learned grid positions [N, Hv] (f32)."""
    taps = jnp.take(table, inputs.pos_index, axis=0).astype(jnp.float32)  # [N, 4, Hv]
    return jnp.einsum("nk,nkh->nh", inputs.pos_weight.astype(jnp.float32), taps)


def _rotary_tables(rope_hw, config: VisionConfig):
    """cos, sin [N, D/2]: the first D/4 frequencies turn with the row, the next D/4 with the
    column (the same frequencies on both axes)."""
    quarter = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, quarter, 2, dtype=np.float32)
                                            / quarter))
    angles = rope_hw.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq, jnp.float32)
    angles = angles.reshape(rope_hw.shape[0], -1)  # [N, 2 * D/4]: row angles, column angles
    return jnp.cos(angles), jnp.sin(angles)


def _layer_norm(x, weight, bias, eps: float):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    normed = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (normed * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def _block(x, block, cos, sin, same_frame, config: VisionConfig):
    h = _layer_norm(x, block["attn_norm"], block["attn_norm_bias"], config.layer_norm_eps)
    x = x + _attention(h, block, cos, sin, same_frame, config)
    h = _layer_norm(x, block["mlp_norm"], block["mlp_norm_bias"], config.layer_norm_eps)
    hidden = _affine(h, block["w_fc1"], block["b_fc1"])
    hidden = jax.nn.gelu(hidden, approximate=config.hidden_act == "gelu_pytorch_tanh")
    return x + _affine(hidden, block["w_fc2"], block["b_fc2"])


def _attention(h, block, cos, sin, same_frame, config: VisionConfig):
    """Bidirectional attention of every row to the rows of its own frame."""
    N, NH, D = h.shape[0], config.num_heads, config.head_dim
    q, k, v = jnp.split(_affine(h, block["wqkv"], block["bqkv"]).reshape(N, 3, NH, D), 3,
                        axis=1)
    q, k, v = q[:, 0], k[:, 0], v[:, 0]
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = jnp.einsum("qhd,khd->hqk", q.astype(jnp.float32), k.astype(jnp.float32))
    scores = jnp.where(same_frame[None], scores * D ** -0.5, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("hqk,khd->qhd", weights, v).reshape(N, NH * D)
    return _affine(out, block["wo"], block["bo"])


def _merge(x, merger, config: VisionConfig, *, norm_after_shuffle: bool):
    """Fold every m2 consecutive rows into one [M] row and project it to the text width."""
    rows = x.shape[0] // config.merge_unit
    if norm_after_shuffle:
        h = _layer_norm(x.reshape(rows, config.merged_dim), merger["norm"], merger["norm_bias"],
                        config.layer_norm_eps)
    else:
        h = _layer_norm(x, merger["norm"], merger["norm_bias"], config.layer_norm_eps)
        h = h.reshape(rows, config.merged_dim)
    hidden = jax.nn.gelu(_affine(h, merger["w_fc1"], merger["b_fc1"]), approximate=False)
    return _affine(hidden, merger["w_fc2"], merger["b_fc2"])
