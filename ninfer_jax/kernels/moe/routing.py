"""The tail of the softmax router with norm_topk_prob (qwen3_5_moe, qwen3_next): from the
router's float32 logits to the (expert ids, combine weights) the routed experts take.

`softmax_top_experts(logits, live, num_experts=, top_k=, shared_expert=)`: each row's k best
logits (ties: the lower index first, as lax.top_k), weighted by the softmax of those k (the
softmax over E renormalised over the k kept: its normaliser cancels); padding rows (`live`
False, model/moe_mlp.py) take the first live row's experts (row 0's when none is live) with
zero weights; with `shared_expert`, column E of `logits` is the shared gate's logit (the
router | shared_gate product as it comes, model/fused_projections.py) and every row gets a
(k+1)-th assignment to expert E weighted by its sigmoid (zero on padding rows).

Dispatch, decided while tracing: routing_kernel.py, one Pallas kernel for the whole tail, on
a GPU (kernels/dispatch.py) when GPU_ROUTER_KERNEL is on or NINFER_MOE_ROUTER_KERNEL=1, for
at most MAX_KERNEL_ROWS rows (decode) and a power-of-two E; otherwise the reference below,
which is the computation model/moe_mlp.py has always run, built from the same pieces
(top_k_softmax, without_padding_experts, with_shared_expert).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.kernels import dispatch
from ninfer_jax.kernels.moe import routing_kernel

# On since run 57: its `-m gpu` tests passed natively (run 56); the 35B-A3B's 2-row step on
# an H100 255.8 -> 274.8 tok/s with it (the GDN rows fused in both), 8 rows 916.6 -> 942.4.
GPU_ROUTER_KERNEL = True
ROUTER_ENV = "NINFER_MOE_ROUTER_KERNEL"  # "1" / "0" overrides GPU_ROUTER_KERNEL while tracing
# Every program scans the whole `live` vector (routing_kernel.py), quadratic in the rows: a
# decode batch's few dozen rows cost nothing, a prefill chunk's thousands would.
MAX_KERNEL_ROWS = 64


def router_kernel_on() -> bool:
    """The switch: NINFER_MOE_ROUTER_KERNEL if set ("1" or "0"), else GPU_ROUTER_KERNEL."""
    return dispatch.switch(ROUTER_ENV, GPU_ROUTER_KERNEL)


def uses_router_kernel() -> bool:
    """Whether the router's tail traced now may take routing_kernel.py: the switch is on and
    the kernels run (a GPU, not NINFER_FORCE_REFERENCE)."""
    return router_kernel_on() and dispatch.use_kernels()


def softmax_top_experts(logits, live, *, num_experts: int, top_k: int,
                        shared_expert: bool = False, weights_dtype=jnp.float32):
    """logits f32 [N, C >= E] (column E the shared gate's logit when `shared_expert`), live
    bool [N] or None (all live) -> (ids int32 [N, k'], weights [N, k'] computed in float32,
    rounded to `weights_dtype`), k' = k + 1 with the shared expert, else k. See the module
    docstring. The expert kernels take the weights in the activations' dtype: the kernel
    writes them so, where a convert would be a kernel of its own."""
    if uses_router_kernel() and logits.shape[0] <= MAX_KERNEL_ROWS:
        result = routing_kernel.softmax_top_experts(
            logits, live, num_experts=num_experts, top_k=top_k, shared_expert=shared_expert,
            weights_dtype=weights_dtype)
        if result is not None:
            return result
    return reference_softmax_top_experts(logits, live, num_experts=num_experts, top_k=top_k,
                                         shared_expert=shared_expert,
                                         weights_dtype=weights_dtype)


def reference_softmax_top_experts(logits, live, *, num_experts: int, top_k: int,
                                  shared_expert: bool = False, weights_dtype=jnp.float32):
    """softmax_top_experts in jnp: the oracle and the path off the kernel."""
    ids, weights = top_k_softmax(logits[:, :num_experts].astype(jnp.float32), top_k)
    if live is not None:
        ids, weights = without_padding_experts(ids, weights, live)
    if shared_expert:
        shared_logit = logits[:, num_experts:num_experts + 1]
        ids, weights = with_shared_expert(ids, weights, shared_logit, live, num_experts)
    return ids, weights.astype(weights_dtype)


def top_k_softmax(logits, top_k: int):
    """logits f32 [N, E] -> the k best experts of each row and the softmax of their logits:
    (int32 [N, k], f32 [N, k])."""
    # The softmax over E renormalised over the k kept is the softmax of the k logits (its
    # normaliser cancels), and the softmax keeps the logits' order: one reduction over k
    # instead of two over E.
    top, ids = jax.lax.top_k(logits, top_k)
    scaled = jnp.exp(top - top[:, :1])  # top_k sorts: column 0 is each row's max
    return ids.astype(jnp.int32), scaled / jnp.sum(scaled, axis=-1, keepdims=True)


def without_padding_experts(expert_ids, expert_weights, live):
    """Rows not `live` take the first live row's expert ids (row 0's when none is live) and
    zero weights: the distinct experts of the step are the live rows' own."""
    first = jnp.argmax(live)
    ids = jnp.where(live[:, None], expert_ids, expert_ids[first][None, :])
    return ids, jnp.where(live[:, None], expert_weights, jnp.zeros_like(expert_weights))


def with_shared_expert(expert_ids, expert_weights, shared_logit, live, num_experts: int):
    """The folded shared expert (expert E) appended to every row, weighted by the sigmoid of
    its gate's logit [N, 1] (zero on rows not `live`): ids and weights [N, k + 1]."""
    gate = jax.nn.sigmoid(shared_logit.astype(jnp.float32))
    if live is not None:
        gate = jnp.where(live[:, None], gate, 0.0)
    shared_ids = jnp.full((expert_ids.shape[0], 1), num_experts, jnp.int32)
    return (jnp.concatenate([expert_ids, shared_ids], axis=-1),
            jnp.concatenate([expert_weights, gate], axis=-1))
