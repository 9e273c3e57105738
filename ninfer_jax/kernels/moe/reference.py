"""Pure-jnp reference of the routed-experts product of a MoE MLP (the CPU path and the oracle).

Each of N tokens goes through its k selected experts and their outputs are summed with the
router's combine weights. Expert weights are stacked: gate_up [E, H, 2I] (gate columns
first), down [E, I, H]; the `activation` between the two products is "swiglu" (silu(gate) *
up) or, for experts without a gate (Nemotron-H), "relu2" (relu(up)^2) with gate_up [E, H, I]
holding the up columns only. Two ways to compute it, same result:
  grouped_experts   prefill: the N*k (token, expert) assignments sorted by expert and run as one
                    grouped matmul (jax.lax.ragged_dot), so each expert's weights are read once
  gathered_experts  decode: the k selected experts' weights gathered per token, so a few tokens
                    read k expert matrices each instead of all E
  dense_experts     every token through every expert, weighted by a dense [N, E] combine matrix:
                    the test oracle (E times the work)
Products accumulate in float32; the result is returned in x's dtype.
Shape letters: N tokens, k experts per token, E experts, H hidden, I expert width.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def grouped_experts(x, expert_ids, expert_weights, gate_up, down, *,
                    activation: str = "swiglu"):
    """x [N, H], expert_ids int32 [N, k], expert_weights [N, k] -> [N, H]."""
    N, top_k = expert_ids.shape
    num_experts = gate_up.shape[0]
    flat_experts = expert_ids.reshape(-1)
    order = jnp.argsort(flat_experts, stable=True)  # assignments grouped by expert
    tokens = order // top_k
    group_sizes = jnp.bincount(flat_experts, length=num_experts).astype(jnp.int32)
    hidden = jax.lax.ragged_dot(x[tokens], gate_up, group_sizes,
                                preferred_element_type=jnp.float32)
    out = jax.lax.ragged_dot(activate(hidden, activation).astype(x.dtype), down, group_sizes,
                             preferred_element_type=jnp.float32)  # [N*k, H]
    weighted = out * expert_weights.reshape(-1)[order, None].astype(jnp.float32)
    return jnp.zeros((N, x.shape[1]), jnp.float32).at[tokens].add(weighted).astype(x.dtype)


def gathered_experts(x, expert_ids, expert_weights, gate_up, down, *,
                     activation: str = "swiglu"):
    """Same as grouped_experts, reading only the selected experts' weights."""
    hidden = jnp.einsum("nh,nkhi->nki", x, gate_up[expert_ids],
                        preferred_element_type=jnp.float32)
    out = jnp.einsum("nki,nkih->nkh", activate(hidden, activation).astype(x.dtype),
                     down[expert_ids],
                     preferred_element_type=jnp.float32)
    return jnp.einsum("nkh,nk->nh", out, expert_weights.astype(jnp.float32)).astype(x.dtype)


def dense_experts(x, expert_ids, expert_weights, gate_up, down, *, activation: str = "swiglu"):
    """The oracle: a loop over all E experts, each applied to every token."""
    num_experts = gate_up.shape[0]
    combine = jnp.zeros((x.shape[0], num_experts), jnp.float32)
    combine = combine.at[jnp.arange(x.shape[0])[:, None], expert_ids].add(
        expert_weights.astype(jnp.float32))
    total = jnp.zeros(x.shape, jnp.float32)
    for e in range(num_experts):
        hidden = jnp.dot(x, gate_up[e], preferred_element_type=jnp.float32)
        out = jnp.dot(activate(hidden, activation).astype(x.dtype), down[e],
                      preferred_element_type=jnp.float32)
        total = total + combine[:, e:e + 1] * out
    return total.astype(x.dtype)


def activate(hidden, activation: str):
    """The experts' activation of the first product [..., 2I] ("swiglu") or [..., I]
    ("relu2"), in float32."""
    if activation == "swiglu":
        return _swiglu(hidden)
    if activation == "relu2":
        return jnp.square(jax.nn.relu(hidden))
    raise ValueError(f"unknown expert activation {activation!r}")


def _swiglu(hidden):
    """silu(gate) * up of [..., 2I] (gate columns first), in float32."""
    gate, up = jnp.split(hidden, 2, axis=-1)
    return jax.nn.silu(gate) * up
