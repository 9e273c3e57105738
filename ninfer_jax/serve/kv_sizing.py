"""`--kv-capacity auto`: the KV pool size, measured once the weights are resident.

On an accelerator the pool takes the device memory that is still free after the weights were
placed (`memory_stats()`: bytes_limit - bytes_in_use), minus the 1 GiB headroom the serving
contract leaves for compiled steps and temporaries, in whole pages (engine.config's
`auto_kv_tokens`). A CPU backend reports no memory statistics and its "device" memory is the
host's RAM, shared with everything else on the machine, so auto is bounded there: at most a
quarter of the RAM available now (after the weights were read), and at most 16 full contexts
(`16 * max_context`), in whole pages, never less than one page.

Without --kv-capacity the pool holds one full context per lane (`default_kv_tokens`), within
the same bound, and never less than one context.

Hybrid models: only their full-attention layers hold KV pages, and their state slots
(--max-concurrency + --device-state-slots, plus the dummy slot) are allocated with the pool,
so both bounds leave the slots' bytes out before sizing pages (`state_bytes_of`). Gemma 4 is
sized the same way: its full layers hold pages, its sliding layers' KV rings are state slots
(model/gemma.py), each of window + step tokens.

The engine core calls `resolve_pool` (serve/engine_setup.py: `place_weights`, then
`auto_kv_tokens_for`) before it builds the runner; only that process imports JAX (the two
functions that need it import it in their bodies), HTTP workers never size the pool. The
runner's own cast of already-placed params is then a no-op, so the measurement sees
exactly the weights the server will hold.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib

import numpy as np

from ninfer_jax.engine.config import AUTO_KV_HEADROOM_BYTES, auto_kv_tokens
from ninfer_jax.engine.penalty_lanes import penalty_counts_bytes
from ninfer_jax.engine.state_slots import extra_slots, state_slot_capacity

log = logging.getLogger("ninfer_jax.serve")

# How far a remembered auto pool may stray from the one measured now and still be kept:
# above it by at most this many bytes (taken from the headroom and compile scratch, 5.6 GiB
# for the 8B shape), below it by at most 1/32 of the pool (pages left unused).
KEEP_POOL_OVER_BYTES = 256 << 20
KEEP_POOL_UNDER_SHARE = 32

# On CPU: the share of available host RAM the pool may take, and its size in full contexts.
CPU_RAM_SHARE = 4  # available RAM / 4
CPU_MAX_CONTEXTS = 16


@dataclasses.dataclass(frozen=True)
class KvSizing:
    tokens: int
    bytes_per_token: int
    basis: str  # how it was decided, for the start-up log line


def attention_layers(model_config) -> int:
    """Layers with paged KV: all of a dense model's, a hybrid's (and Nemotron-H's) attention
    ones, Gemma's full layers that are not KV-shared."""
    if model_config.is_gemma:  # KV-shared layers read another layer's cache, sliding ones
        # keep their KV in rings
        return len(_paged_gemma_layers(model_config))
    if model_config.is_nemotron:  # its MLP layers have no cache
        return len(model_config.cache_layers())
    if not model_config.is_hybrid:
        return model_config.num_layers
    return sum(kind == "full_attention" for kind in model_config.layer_types)


def _paged_gemma_layers(model_config) -> list[int]:
    rings = set(model_config.ring_layers())
    return [i for i in model_config.cache_layers() if i not in rings]


def state_bytes_of(model_config, compute_dtype, num_slots: int, *, kv_dtype=None,
                   page_size: int = 0, step_tokens: int = 0) -> int:
    """Device bytes of `num_slots` state slots: per Gated DeltaNet or Mamba-2 layer the conv
    state in the compute dtype and the recurrent state in float32 (model/config.py
    state_shapes); per Gemma sliding cache layer a KV ring of `kv_dtype` pages
    (config.ring_pages(page_size, step_tokens), the runner's JaxRunner.step_tokens)."""
    if not model_config.has_state or num_slots == 0:
        return 0
    if model_config.has_sliding_rings:
        from ninfer_jax.kernels import paged_attention  # JAX: HTTP workers never get here

        tokens = model_config.ring_pages(page_size, step_tokens) * page_size
        return num_slots * tokens * sum(paged_attention.cache_bytes_per_token(
            model_config.layer_kv_heads(i), model_config.layer_head_dim(i), kv_dtype)
            for i in model_config.ring_layers())
    shapes = model_config.state_shapes()
    per_layer = (int(np.prod(shapes["conv"])) * np.dtype(compute_dtype).itemsize
                 + int(np.prod(shapes["recurrent"])) * 4)
    return num_slots * len(model_config.state_layers()) * per_layer


def device_state_slots_of(config, model_config) -> int:
    """Slots the runner allocates for a ServeConfig: the usable ones plus the dummy slot."""
    usable = state_slot_capacity(has_state=model_config.has_state,
                                 max_concurrency=config.max_concurrency,
                                 extra_slots=extra_slots(config.device_state_slots,
                                                         config.max_concurrency))
    return usable + 1 if usable else 0


def bytes_per_token_of(model_config, dtype, *, mtp: bool = False, dflash=None) -> int:
    """Device bytes of one token's KV in every attention layer (the scales of 8- and 4-bit
    pages included); `mtp`: the MTP head's layer too (--spec mtp keeps its KV in the same
    pages); `dflash`: a DFlash drafter's config, whose draft layers keep their context K/V
    there too."""
    from ninfer_jax.kernels import paged_attention  # JAX: the HTTP workers never import it

    if dflash is not None:
        return bytes_per_token_of(model_config, dtype, mtp=mtp) + dflash.num_layers * \
            paged_attention.cache_bytes_per_token(dflash.num_kv_heads, dflash.head_dim, dtype)

    if model_config.is_gemma:  # per paged layer: full layers have their own heads and dims
        return sum(paged_attention.cache_bytes_per_token(
            model_config.layer_kv_heads(i), model_config.layer_head_dim(i), dtype)
            for i in _paged_gemma_layers(model_config))
    return (attention_layers(model_config) + int(mtp)) * paged_attention.cache_bytes_per_token(
        model_config.num_kv_heads, model_config.head_dim, dtype)


def device_free_bytes(device) -> int | None:
    """Free bytes the device's allocator can still hand out; None when it does not say (CPU)."""
    stats = device.memory_stats()
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def host_available_bytes() -> int:
    """RAM available to new allocations (Linux MemAvailable; free pages elsewhere)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cpu_auto_kv_tokens(available_bytes: int, bytes_per_token: int, *, page_size: int,
                       max_context: int, state_bytes: int = 0) -> int:
    """The CPU bound: min(available RAM / 4 less the state slots, 16 contexts), whole
    pages, at least one page."""
    by_memory = max(0, available_bytes // CPU_RAM_SHARE - state_bytes) // bytes_per_token
    tokens = min(by_memory, CPU_MAX_CONTEXTS * max_context)
    return max(1, tokens // page_size) * page_size


def compile_scratch_bytes(params) -> int:
    """Device memory step compiles need on top of the pool: XLA's GPU autotuner runs
    candidate kernels on scratch copies of a matmul's operands, the largest being a copy of
    the largest weight (the LM head); the runner compiles BACKGROUND_COMPILE_THREADS shapes
    at a time after the pool is allocated, so that many copies of that weight."""
    import jax

    from ninfer_jax.engine.runner import BACKGROUND_COMPILE_THREADS

    sizes = [leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(params)]
    return BACKGROUND_COMPILE_THREADS * max(sizes, default=0)


def auto_kv_sizing(*, free_device_bytes: int | None, available_host_bytes: int,
                   bytes_per_token: int, page_size: int, max_context: int,
                   scratch_bytes: int = 0, state_bytes: int = 0) -> KvSizing:
    """`state_bytes`: the hybrid state slots, allocated with the pool (none: dense)."""
    states = f", {state_bytes / 2**20:.1f} MiB of state slots" if state_bytes else ""
    if free_device_bytes is not None:
        tokens = auto_kv_tokens(free_device_bytes, bytes_per_token, page_size=page_size,
                                headroom_bytes=AUTO_KV_HEADROOM_BYTES + scratch_bytes
                                + state_bytes)
        basis = (f"{free_device_bytes / 2**30:.2f} GiB free on the device, 1 GiB + "
                 f"{scratch_bytes / 2**30:.2f} GiB of compile scratch left over{states}")
    else:
        tokens = cpu_auto_kv_tokens(available_host_bytes, bytes_per_token,
                                    page_size=page_size, max_context=max_context,
                                    state_bytes=state_bytes)
        basis = (f"CPU: min(1/{CPU_RAM_SHARE} of {available_host_bytes / 2**30:.2f} GiB "
                 f"available RAM{states}, {CPU_MAX_CONTEXTS} x {max_context}-token contexts)")
    return KvSizing(tokens, bytes_per_token, basis)


def default_kv_tokens(*, lanes: int, max_context: int, bound: int, page_size: int) -> int:
    """The pool when --kv-capacity is not given: a full context for every lane, so that N
    resident requests do not pause one another, within what `auto` would allow (`bound`);
    never less than one context, which a lone request must always be able to reach."""
    tokens = max(max_context, min(lanes * max_context, bound))
    return -(-tokens // page_size) * page_size


def resolve_pool(config, artifact, compute_dtype, kv_dtype, *, max_context: int,
                 page_size: int, step_tokens: int = 0, mesh=None):
    """(artifact, pool tokens or None) for a ServeConfig. Measuring places the weights on the
    device first (the returned artifact holds them); None leaves the pool at one context.
    With a tensor-parallel `mesh` the weights are placed split over it and the pool is
    sized per device: each holds 1/N of every token's KV (its kv heads), so the free memory
    of the fullest device is divided by the per-device bytes of a token."""
    if config.kv_capacity not in ("auto", None):
        return artifact, config.kv_capacity
    if config.kv_capacity is None and config.max_concurrency == 1:
        return artifact, None  # one lane: one context, nothing to measure
    artifact = place_weights(artifact, compute_dtype, mesh,
                             expert_parallel=config.expert_parallel)
    state_bytes = state_bytes_of(artifact.config, compute_dtype,
                                 device_state_slots_of(config, artifact.config),
                                 kv_dtype=kv_dtype, page_size=page_size,
                                 step_tokens=step_tokens)
    size = 1 if mesh is None else mesh.size
    # the penalty lanes' counts, replicated on every device (engine/penalty_lanes.py)
    counts = penalty_counts_bytes(config.max_concurrency, artifact.config.vocab_size)
    bound = auto_kv_tokens_for(artifact, kv_dtype, page_size=page_size,
                               max_context=max_context,
                               state_bytes=state_bytes // size + counts, mesh=mesh).tokens
    if config.kv_capacity == "auto":
        return artifact, bound
    return artifact, default_kv_tokens(lanes=config.max_concurrency, max_context=max_context,
                                       bound=bound, page_size=page_size)


def place_weights(artifact, dtype, mesh=None, *, expert_parallel: bool = False):
    """The artifact with its params fused (on the host) and cast to `dtype` on the default
    device (or split over `mesh`), as the runner does by default (it keeps fused leaves and
    placed trees as given), so that free memory can be measured with the weights resident,
    and resident once."""
    import jax

    from ninfer_jax.engine.runner import place_params

    params = place_params(artifact.params, artifact.config, dtype, mesh,
                          expert_parallel=expert_parallel)
    jax.block_until_ready(params)
    return dataclasses.replace(artifact, params=params)


def vision_scratch_bytes(artifact) -> int:
    """With the vision tower loaded (--vision), the memory its encodes need at run time."""
    vision = getattr(artifact, "vision_config", None)
    if vision is None or "vision" not in artifact.params:
        return 0
    from ninfer_jax.engine.vision_rows import encode_scratch_bytes

    return encode_scratch_bytes(vision)


def auto_kv_tokens_for(artifact, kv_dtype, *, page_size: int, max_context: int,
                       state_bytes: int = 0, mesh=None) -> KvSizing:
    """Measure and size pages of `kv_dtype`: call with the weights already placed
    (`place_weights`); `state_bytes` of state slots come out of the same memory. With a
    `mesh`, per device: its free memory (the least of the mesh's) against its share of a
    token's KV and of the compile scratch."""
    import jax

    size = 1 if mesh is None else mesh.size
    devices = jax.devices()[:1] if mesh is None else list(mesh.devices.flat)
    free = [device_free_bytes(device) for device in devices]
    sizing = auto_kv_sizing(free_device_bytes=None if None in free else min(free),
                            available_host_bytes=host_available_bytes(),
                            bytes_per_token=bytes_per_token_of(
                                artifact.config, kv_dtype, mtp="mtp" in artifact.params,
                                dflash=_loaded_drafter(artifact)) // size,
                            page_size=page_size, max_context=max_context,
                            scratch_bytes=(compile_scratch_bytes(artifact.params)
                                           + vision_scratch_bytes(artifact)) // size,
                            state_bytes=state_bytes)
    if None not in free:
        sizing = keep_last_pool(sizing, page_size=page_size, key={
            "device": getattr(devices[0], "device_kind", str(devices[0])),
            "devices": size, "page_size": page_size, "max_context": max_context,
            "bytes_per_token": sizing.bytes_per_token, "state_bytes": state_bytes})
    log.info("KV pool bound (the --kv-capacity auto rule): %d tokens (%.1f KiB per token; %s)",
             sizing.tokens, sizing.bytes_per_token / 1024, sizing.basis)
    if sizing.tokens < max_context:
        log.warning("--kv-capacity auto gives %d tokens, less than one --max-context of %d",
                    sizing.tokens, max_context)
    return sizing


def keep_last_pool(sizing: KvSizing, *, page_size: int, key: dict,
                   directory: str | os.PathLike | None = None) -> KvSizing:
    """`sizing`, or the pool the last start with the same `key` chose where that one still
    fits (KEEP_POOL_*): the same pool means the same step shapes, so a restart loads its
    stored executables instead of compiling (auto pools are rounded, engine/config.py, but
    two starts can straddle a granule's edge). Kept as a small file beside the executables
    ($JAX_COMPILATION_CACHE_DIR/ninfer-executables); without that directory, `sizing`."""
    if directory is None:
        cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
        if not cache:
            return sizing
        directory = pathlib.Path(cache) / "ninfer-executables"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    path = pathlib.Path(directory) / f"pool-{digest}.json"
    try:
        last = int(json.loads(path.read_text())["tokens"])
    except (OSError, ValueError, KeyError, TypeError):
        last = None
    over = KEEP_POOL_OVER_BYTES // sizing.bytes_per_token
    if last is not None and last % page_size == 0 and \
            sizing.tokens - sizing.tokens // KEEP_POOL_UNDER_SHARE <= last <= sizing.tokens + over:
        if last != sizing.tokens:
            sizing = KvSizing(last, sizing.bytes_per_token,
                              f"{sizing.basis}; the last start's {last} tokens kept, not "
                              f"{sizing.tokens}: its step shapes are stored")
        return sizing
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"tokens": sizing.tokens, "key": key}))
    except OSError as exc:  # a read-only cache: every start measures afresh
        log.warning("could not remember the KV pool in %s: %s", path, exc)
    return sizing


def _loaded_drafter(artifact):
    """The DFlash / DFlash2 config of the drafter loaded with the weights, or None."""
    for variant in ("dflash", "dflash2"):
        if variant in (artifact.params or {}):
            return artifact.dflash_config(variant)
    return None
