"""Routed MoE experts: `routed_experts(x, expert_ids, expert_weights, gate_up, down)`.

The path is picked while tracing from the static shapes: when the step's assignments (N * k)
are fewer than the experts, gathering the selected experts' weights reads less than a grouped
matmul over every expert (decode); otherwise the grouped matmul (prefill). Both are the
references of reference.py; a GPU kernel would plug in here behind kernels/dispatch.py.
"""
from __future__ import annotations

from ninfer_jax.kernels.moe import reference


def routed_experts(x, expert_ids, expert_weights, gate_up, down):
    """x [N, H], expert_ids int32 [N, k], expert_weights [N, k], gate_up [E, H, 2I],
    down [E, I, H] -> [N, H] in x's dtype."""
    num_assignments = expert_ids.shape[0] * expert_ids.shape[1]
    if num_assignments < gate_up.shape[0]:
        return reference.gathered_experts(x, expert_ids, expert_weights, gate_up, down)
    return reference.grouped_experts(x, expert_ids, expert_weights, gate_up, down)
