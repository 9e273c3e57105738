"""Tensor parallelism: how the params, caches and attention of a step split over a device mesh.

The engine builds a one-axis `jax.sharding.Mesh` (axis AXIS, N devices) and passes it to the
compiled step as a static argument (`mesh=None`: one device, nothing here applies). Weights
and caches are placed with the NamedShardings this module names, and XLA's SPMD partitioner
splits every product by them (Megatron layout, one all-reduce after each attention and MLP):

    column parallel (output axis split): wq wk wv wqkv w_gate w_up w_gate_up, the GDN in_*
        projections, shared-expert gate/up, lm_head (vocabulary-parallel), q/k/v biases
    row parallel (input axis split): wo w_down out shared_w_down, embed (its vocabulary rows)
    replicated: norms, routers, the routed experts, and any leaf whose split axis the mesh
        does not divide (a tiny artifact's odd vocabulary)
    expert parallel (`--expert-parallel`, split by expert index instead of replicated): the
        routed experts, renamed experts_gate_up_ep / experts_down_ep (EXPERT_LEAVES) so the
        model code sees the layout in the tree; each device runs its E/N experts for every
        token (the others weighted zero) and a psum adds the partial outputs
        (`expert_parallel`). The tokens are replicated over the mesh already, so no
        dispatch is needed: the only collective is that psum, the all-reduce a
        row-parallel MLP has anyway.

Fused projections (model/fused_projections.py) are laid out per shard: wqkv holds, for each
of the G = N groups, that group's q heads, then its k heads, then its v heads, so a column
split gives every device whole heads; w_gate_up holds each group's gate columns then its up
columns. `split_fused` undoes that layout after the product. The Gated DeltaNet in_qkv and
conv channels (Q | K | V) are permuted the same way at placement (`group_columns`).
Caches: KV pages [P, K, S, D] split on their kv-head axis K, GDN state slots on their head
axis (conv channels, recurrent value heads). Attention runs per shard under shard_map
(`attention_op`): each device writes and reads only its own heads' pages, so the reference
and the Pallas kernels run unchanged on local shapes.
Shape letters: N rows, G groups (mesh size), H hidden, D head dim.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ninfer_jax.kernels import attention_prologue, paged_attention, ragged_attention
from ninfer_jax.model import ragged_batch
from ninfer_jax.model.config import ModelConfig

AXIS = "tp"

COLUMN_LEAVES = ("wq", "wk", "wv", "wqkv", "w_gate", "w_up", "w_gate_up", "in_qkv",
                 "in_qkv_grouped", "in_z", "in_b", "in_a", "shared_w_gate", "shared_w_up",
                 "lm_head")
# a Gated DeltaNet layer's Q | K | V channel leaves -> their per-shard renamed form
GROUPED_CHANNELS = {"in_qkv": "in_qkv_grouped", "conv": "conv_grouped"}
ROW_LEAVES = ("wo", "w_down", "out", "shared_w_down", "embed")
HEAD_VECTORS = ("bq", "bk", "bv", "dt_bias", "A_log")  # one entry per head (or head column)
# the routed experts as stored -> their name once split by expert index over the mesh
EXPERT_LEAVES = {"experts_gate_up": "experts_gate_up_ep", "experts_down": "experts_down_ep"}


def shard_map(fn, *, mesh: Mesh, in_specs, out_specs):
    """`jax.shard_map` (JAX >= 0.7) or the older `jax.experimental.shard_map`, without the
    replication checks (the per-shard bodies are plain jnp)."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=False)
    from jax.experimental.shard_map import shard_map as experimental

    return experimental(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def make_mesh(num_devices: int, devices=None) -> Mesh:
    """A one-axis mesh over the first `num_devices` devices."""
    devices = list(devices if devices is not None else jax.devices())
    if not 1 <= num_devices <= len(devices):
        raise ValueError(f"--tensor-parallel {num_devices}: {len(devices)} device(s) visible")
    return Mesh(np.array(devices[:num_devices]), (AXIS,))


def num_groups(mesh: Mesh | None) -> int:
    return 1 if mesh is None else mesh.shape[AXIS]


# ----------------------------------------------------------------------------- placement


def leaf_spec(name: str, shape: tuple[int, ...], size: int,
              expert_parallel: bool = False) -> P:
    """The PartitionSpec of a plain weight leaf named `name` (its last dotted part) of this
    shape on a mesh of `size` devices (module docstring); replicated when not divisible.
    `expert_parallel`: the routed experts under their stored names split too (a checkpoint
    restored straight into expert shards, before the runner renames them)."""
    if name in EXPERT_LEAVES.values() or expert_parallel and name in EXPERT_LEAVES:
        axis = 0
    elif name in COLUMN_LEAVES and len(shape) == 2:
        axis = 1
    elif name in ROW_LEAVES and len(shape) == 2:
        axis = 0
    elif name in HEAD_VECTORS and len(shape) == 1 or name == "conv_grouped":
        axis = len(shape) - 1
    else:
        return P()
    if shape[axis] % size:
        return P()
    return P(*([None] * axis), AXIS)


def param_specs(params, size: int, expert_parallel: bool = False):
    """The PartitionSpec tree of a params tree (plain leaves; a quantized leaf's dict gets
    P() for each array: such weights are refused with a mesh, see check_plain)."""
    def walk(node, name):
        if isinstance(node, dict):
            return {key: walk(value, key) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(walk(value, name) for value in node)
        return leaf_spec(name, tuple(node.shape), size, expert_parallel)
    return walk(params, "")


def split_experts(layer: dict) -> dict:
    """A layer with its routed experts renamed to their expert-parallel names (EXPERT_LEAVES);
    the arrays are unchanged, only their placement differs."""
    return {EXPERT_LEAVES.get(name, name): leaf for name, leaf in layer.items()}


def check_plain(params) -> None:
    """ValueError when the tree holds quantized leaves (their tensor-parallel layout is not
    built: each format's arrays split differently)."""
    for layer in params.get("layers", []):
        for name, leaf in layer.items():
            if isinstance(leaf, dict):
                raise ValueError(f"--tensor-parallel needs plain float weights; {name} is "
                                 "quantized")


def shardings(specs, mesh: Mesh):
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                        is_leaf=lambda x: isinstance(x, P))


def cache_specs(cache_shapes, size: int):
    """PartitionSpecs of a family's cache list: KV pages (and their scales) on the kv-head
    axis 1, Gemma's sliding KV rings [S, R, K, ...] on axis 2, GDN conv state on its channel
    axis 2, recurrent state on its head axis 1."""
    def layer(entry):
        if isinstance(entry, dict) and "k" in entry:
            return jax.tree.map(lambda _: P(None, None, AXIS), entry)
        if isinstance(entry, dict):
            return {"conv": P(None, None, AXIS), "recurrent": P(None, AXIS)}
        return jax.tree.map(lambda _: P(None, AXIS), entry)
    del size
    return [layer(entry) for entry in cache_shapes]


def group_columns(array, sizes: tuple[int, ...], groups: int, axis: int = -1):
    """Reorder `axis` from parts [A | B | ...] (part widths `sizes`) to per-group blocks
    [A_0 B_0 ... | A_1 B_1 ... | ...], each part split into `groups` equal pieces."""
    xp = jnp if isinstance(array, jax.Array) else np
    axis = axis % array.ndim
    parts = xp.split(array, np.cumsum(sizes)[:-1], axis=axis)
    pieces = [xp.split(part, groups, axis=axis) for part in parts]
    return xp.concatenate([piece[g] for g in range(groups) for piece in pieces], axis=axis)


def group_deltanet_layer(layer: dict, config: ModelConfig, groups: int) -> dict:
    """A Gated DeltaNet layer's in_qkv and conv with their channels ordered per shard,
    renamed (GROUPED_CHANNELS) so the layout is never applied twice; others unchanged."""
    if "in_qkv" not in layer:
        return layer
    key_dim = config.linear_num_key_heads * config.linear_key_head_dim
    sizes = (key_dim, key_dim, config.linear_num_value_heads * config.linear_value_head_dim)
    layer = dict(layer)
    for name, grouped in GROUPED_CHANNELS.items():
        layer[grouped] = group_columns(layer.pop(name), sizes, groups)
    return layer


def per_shard_deltanet(core, mesh: Mesh):
    """`core(mixed, gates, conv_weight, conv, recurrent, slots)` of model/gated_deltanet.py
    run per shard: channels, heads and state columns split, the slot indices replicated."""
    columns = P(None, AXIS)
    return shard_map(core, mesh=mesh,
                     in_specs=(columns, columns, columns, P(None, None, AXIS), columns, P()),
                     out_specs=(columns, P(None, None, AXIS), columns))


def split_fused(y, sizes: tuple[int, ...], groups: int):
    """The parts [..., sum(sizes)] of a product with a per-group fused weight: inverse of
    group_columns on the last axis (groups == 1: a plain split)."""
    lead = y.shape[:-1]
    grouped = y.reshape(*lead, groups, sum(sizes) // groups)
    local = [size // groups for size in sizes]
    parts = jnp.split(grouped, np.cumsum(local)[:-1], axis=-1)
    return [part.reshape(*lead, size) for part, size in zip(parts, sizes)]


def replicated(x, mesh: Mesh | None):
    """x gathered onto every device (sampling reads whole logits rows)."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P()))


def gathered_logits(logits, mesh: Mesh | None):
    """The logits [R, V] replicated for sampling, computed vocabulary-parallel first when the
    mesh divides V: without that hint XLA (on CPU, seen in the TP test's HLO) all-gathers the
    column-split head [H, V] in every step and multiplies on each device, instead of
    gathering the R rows of logits."""
    if mesh is not None and logits.shape[-1] % num_groups(mesh) == 0:
        logits = jax.lax.with_sharding_constraint(logits, NamedSharding(mesh, P(None, AXIS)))
    return replicated(logits, mesh)


# ----------------------------------------------------------------------------- experts


def expert_parallel(routed_experts, mesh: Mesh):
    """`routed_experts(x, expert_ids, expert_weights, gate_up, down)` (kernels/moe) over
    experts split by index: each device runs the step's assignments through its own E/N
    experts, those routed elsewhere clamped to a local expert and weighted zero, and a psum
    adds the partial [N, H] outputs. Exact (each assignment counted on one device) and free
    of any dispatch, but every device computes all N*k assignments: the saving is the
    expert weights' memory and, in decode, their reads, not prefill FLOPs."""
    def local(x, expert_ids, expert_weights, gate_up, down):
        num_local = gate_up.shape[0]
        local_ids = expert_ids - jax.lax.axis_index(AXIS) * num_local
        is_local = (local_ids >= 0) & (local_ids < num_local)
        out = routed_experts(x, jnp.where(is_local, local_ids, 0),
                             jnp.where(is_local, expert_weights, 0), gate_up, down)
        return jax.lax.psum(out, AXIS)

    experts = P(AXIS)
    return shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), experts, experts),
                     out_specs=P())


# ----------------------------------------------------------------------------- attention


class AttentionOp:
    """The step's attention for one layer's caches: call it as fn(q [N, NH, D], k, v [N, NK, D],
    (k_cache, v_cache), slots [N]) -> (out [N, NH, D], (k_cache, v_cache)): the new K/V
    written at `slots`, then ragged paged attention over the step's tables. With a mesh both
    run per shard on the local heads and pages."""

    def __init__(self, batch: ragged_batch.RaggedBatch, *, scale: float, mesh: Mesh | None):
        self._meta = dict(chunk_table=batch.chunk_table, chunk_start=batch.chunk_start,
                          row_tables=batch.row_tables, row_lengths=batch.row_positions + 1)
        self._num_chunk = ragged_batch.num_chunk_tokens(batch)
        self._scale, self._mesh = scale, mesh
        if mesh is not None:
            heads, pages = P(None, AXIS, None), P(None, AXIS)
            self._mapped = shard_map(self._local, mesh=mesh,
                                     in_specs=(heads, heads, heads, pages, P(), P()),
                                     out_specs=(heads, pages))

    def __call__(self, q, k, v, cache, slots):
        if self._mesh is None:
            return self._local(q, k, v, cache, slots, self._meta)
        return self._mapped(q, k, v, cache, slots, self._meta)

    def _local(self, q, k, v, cache, slots, meta):
        k_cache, v_cache = paged_attention.write_kv(*cache, k, v, slots)
        return self._read(q, k_cache, v_cache, meta), (k_cache, v_cache)

    def _read(self, q, k_cache, v_cache, meta):
        return ragged_attention.ragged_paged_attention(q, k_cache, v_cache, scale=self._scale,
                                                       num_chunk_tokens=self._num_chunk,
                                                       **meta)

    def from_qkv(self, qkv, q_norm, k_norm, cos, sin, cache, slots, *, num_heads: int,
                 num_kv_heads: int, eps: float, zero_centred: bool = False,
                 gated: bool = False):
        """The same from the fused projection's output qkv (one group: the q heads, each
        followed by its output gate when gated, then the k and v heads) with the per-head
        norms (None: no QK-norm; zero_centred: 1 + w) and the RoPE of each head's first
        2 * cos.shape[-1] dims still to apply, through kernels/attention_prologue's one
        kernel; None where that does not apply (its switch off, a mesh, 8- or 4-bit pages,
        other shapes), and the caller norms, rotates and calls this op itself."""
        if self._mesh is not None or not attention_prologue.prologue_kernel_on():
            return None
        from ninfer_jax.kernels.attention_prologue import kernel

        done = kernel.attention_prologue(qkv, q_norm, k_norm, cos, sin, slots, *cache,
                                         num_heads=num_heads, num_kv_heads=num_kv_heads,
                                         eps=eps, zero_centred=zero_centred, gated=gated)
        if done is None:
            return None
        q, k_cache, v_cache = done
        return self._read(q, k_cache, v_cache, self._meta), (k_cache, v_cache)


def attention_op(batch: ragged_batch.RaggedBatch, *, scale: float,
                 mesh: Mesh | None) -> AttentionOp:
    """The step's AttentionOp (one per step, shared by its layers)."""
    return AttentionOp(batch, scale=scale, mesh=mesh)
