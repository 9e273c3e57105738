"""Routed MoE experts: `routed_experts(x, expert_ids, expert_weights, gate_up, down)`.

Dispatch, decided while tracing (kernels/dispatch.py): on a GPU the Pallas kernels of
kernel.py, which read only the selected experts' weights and read them in place (XLA's GPU
`ragged_dot` is a dense dot over every expert, and gathering weights copies them); shapes
that do not tile fall back to the references. Elsewhere, or with NINFER_FORCE_REFERENCE, the
references of reference.py. Either way the path follows the static shapes: when the step's
assignments (N * k) are fewer than the experts, per-assignment products (decode); otherwise a
grouped matmul over the assignments sorted by expert (prefill).

Routing (routing.py): the tail of the softmax router with norm_topk_prob, from its logits to
the ids and weights above (top k, renormalisation, padding rows, the folded shared expert),
one Pallas kernel (routing_kernel.py) on a GPU behind GPU_ROUTER_KERNEL /
NINFER_MOE_ROUTER_KERNEL, else its jnp reference.
"""
from __future__ import annotations

from ninfer_jax.kernels.dispatch import use_kernels
from ninfer_jax.kernels.moe import reference
from ninfer_jax.kernels.moe.routing import (  # noqa: F401
    ROUTER_ENV, router_kernel_on, softmax_top_experts, top_k_softmax, uses_router_kernel,
    with_shared_expert, without_padding_experts)


def routed_experts(x, expert_ids, expert_weights, gate_up, down, *,
                   activation: str = "swiglu"):
    """x [N, H], expert_ids int32 [N, k], expert_weights [N, k], gate_up [E, H, 2I] (or
    [E, H, I] for "relu2"), down [E, I, H] -> [N, H] in x's dtype."""
    if use_kernels():
        from ninfer_jax.kernels.moe import kernel

        out = kernel.routed_experts(x, expert_ids, expert_weights, gate_up, down,
                                    activation=activation)
        if out is not None:
            return out
    num_assignments = expert_ids.shape[0] * expert_ids.shape[1]
    path = (reference.gathered_experts if num_assignments < gate_up.shape[0]
            else reference.grouped_experts)
    return path(x, expert_ids, expert_weights, gate_up, down, activation=activation)
