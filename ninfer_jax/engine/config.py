"""EngineConfig: the scheduling limits the engine runs under, fixed at start-up.

Built from the serve options (`from_serve_config`) or directly in tests. Sizes are in tokens
here; the KV pool size in pages follows from the runner's page size (`num_pages`), which the
launcher computes before it builds the runner so both agree on one pool.
"""
from __future__ import annotations

import dataclasses
import math

from ninfer_jax.engine.speculation import SpeculativeConfig
from ninfer_jax.engine.state_slots import extra_slots, state_slot_capacity

# Bounds of --max-concurrency (resident execution lanes): the contract's 1..8, widened to 256
# for GPUs, where large decode batches are what keeps the device busy.
MIN_LANES, MAX_LANES = 1, 256
# Without --kv-capacity the pool follows --max-context; on CPU "auto" means this many tokens
# (a bounded default: host memory is shared with everything else on the machine).
CPU_AUTO_KV_TOKENS = 65536


# --kv-capacity auto leaves this much device memory unclaimed (the serving contract's margin).
AUTO_KV_HEADROOM_BYTES = 1 << 30
# --host-context-mib's default: the contract's 8 GiB plus room for this many state snapshots
# of a hybrid model (one state slot's bytes each; nothing for dense models).
DEFAULT_HOST_CONTEXT_MIB = 8192
DEFAULT_HOST_STATE_IMAGES = 8
AUTO_POOL_GRANULE_PAGES = 512


def kv_bytes_per_token(*, num_layers: int, num_kv_heads: int, head_dim: int,
                       dtype_bytes: int) -> int:
    """Device bytes one token of KV takes: a key and a value per layer and KV head."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def auto_kv_tokens(free_bytes: int, bytes_per_token: int, *, page_size: int,
                   headroom_bytes: int = AUTO_KV_HEADROOM_BYTES) -> int:
    """--kv-capacity auto: the tokens (whole pages) that fit in `free_bytes` (measured after
    the weights are resident) minus the headroom, at least one page. Pools are rounded down
    to a granule of pages (a power of two, at most 1/64 of the pool, at most
    AUTO_POOL_GRANULE_PAGES): free memory varies by a few MiB between starts, and a pool one
    page different changes every step's shapes, so a restart would find neither its stored
    executables nor JAX's cache (run 9: 695488 then 695744 tokens; run 41 on an H100:
    17144 then 17173 pages, below the old 32768-page threshold for rounding, and the
    restart compiled everything again). Two starts can still straddle a granule's edge:
    serve/kv_sizing.py keeps the pool of the last start when it still fits."""
    usable = max(0, free_bytes - headroom_bytes)
    pages = usable // (bytes_per_token * page_size)
    pages -= pages % auto_pool_granule(pages)
    return max(1, pages) * page_size


def auto_pool_granule(pages: int) -> int:
    """The rounding granule of an auto pool of `pages` pages (1: no rounding)."""
    granule = 1 << max(0, (pages // 64).bit_length() - 1) if pages >= 64 else 1
    return min(granule, AUTO_POOL_GRANULE_PAGES)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    max_concurrency: int = 1  # resident lanes; also the largest decode batch
    max_pending: int = 16  # requests allowed to wait on top of the resident ones
    pending_timeout: float = 30.0  # seconds from arrival until admission must have happened
    prefill_chunk: int = 1024  # tokens per prefill unit
    decode_share: float = 0.25  # decode time per unit of prefill time while both are pending
    max_context: int = 8192  # per-sequence ceiling: prompt + output
    kv_capacity: int | None = None  # pool size in tokens; None = max_context
    prefix_reuse: bool = True
    # The host tier's budget (spilled prefix pages and pause snapshots); 0 disables it.
    # None: the default, DEFAULT_HOST_CONTEXT_MIB plus DEFAULT_HOST_STATE_IMAGES states.
    host_context_mib: int | None = None
    # How many later requests may overtake a waiting head that does not fit yet.
    max_bypass: int = 4
    # Hybrid models: device state slots beyond one per lane (--device-state-slots).
    device_state_slots: int = 0
    # --spec / --draft-tokens (engine/speculation.py); None: plain decoding only.
    speculative: SpeculativeConfig | None = None

    def __post_init__(self):
        if not MIN_LANES <= self.max_concurrency <= MAX_LANES:
            raise ValueError(f"max_concurrency must be in {MIN_LANES}..{MAX_LANES}")
        if self.max_pending < 0 or self.pending_timeout <= 0:
            raise ValueError("max_pending must be >= 0 and pending_timeout > 0")
        if self.prefill_chunk < 1 or self.max_context < 2:
            raise ValueError("prefill_chunk must be >= 1 and max_context >= 2")
        if self.decode_share < 0:
            raise ValueError("decode_share must be >= 0")
        if self.kv_capacity is not None and self.kv_capacity < 1:
            raise ValueError("kv_capacity must be positive")
        if self.host_context_mib is not None and self.host_context_mib < 0:
            raise ValueError("host_context_mib must be >= 0")
        if self.device_state_slots < 0:
            raise ValueError("device_state_slots must be >= 0")

    @property
    def kv_tokens(self) -> int:
        return self.kv_capacity if self.kv_capacity is not None else self.max_context

    @property
    def max_outstanding(self) -> int:
        """Requests that may exist at once, resident or waiting (beyond: Overloaded)."""
        return self.max_concurrency + self.max_pending

    def state_slot_capacity(self, has_state: bool) -> int:
        """Usable device state slots for a model with (hybrid) or without recurrent state."""
        return state_slot_capacity(has_state=has_state, max_concurrency=self.max_concurrency,
                                   extra_slots=self.device_state_slots)

    def host_pages(self, page_bytes: int, state_bytes: int = 0) -> int:
        """Host tier slots for pages of `page_bytes` (0: no host tier); a state snapshot of
        `state_bytes` takes whole slots of the same budget."""
        if page_bytes <= 0:
            return 0
        if self.host_context_mib is not None:
            return self.host_context_mib * (1 << 20) // page_bytes
        budget = DEFAULT_HOST_CONTEXT_MIB * (1 << 20) // page_bytes
        return budget + DEFAULT_HOST_STATE_IMAGES * -(-state_bytes // page_bytes)

    def num_pages(self, page_size: int) -> int:
        """Pool size in pages for a runner with `page_size`, the dummy page included."""
        return math.ceil(self.kv_tokens / page_size) + 1

    @classmethod
    def from_serve_config(cls, serve, *, resolved_kv_tokens: int | None = None
                          ) -> "EngineConfig":
        """From a serve.config.ServeConfig. `resolved_kv_tokens` is the pool the launcher
        resolved (serve/kv_sizing.resolve_pool) for --kv-capacity auto or unset; without it,
        auto uses the CPU default and unset means one --max-context."""
        kv = serve.kv_capacity
        if kv in ("auto", None) and resolved_kv_tokens is not None:
            kv = resolved_kv_tokens
        elif kv == "auto":
            kv = CPU_AUTO_KV_TOKENS
        return cls(
            max_concurrency=serve.max_concurrency,
            max_pending=serve.max_pending_requests,
            pending_timeout=serve.pending_timeout_ms / 1000.0,
            prefill_chunk=serve.prefill_chunk,
            decode_share=serve.decode_share,
            max_context=serve.max_context,
            kv_capacity=kv,
            prefix_reuse=not serve.no_prefix_reuse,
            host_context_mib=serve.host_context_mib,
            device_state_slots=extra_slots(serve.device_state_slots, serve.max_concurrency),
            speculative=SpeculativeConfig.from_options(serve.spec, serve.draft_tokens,
                                                     serve.lm_head_draft),
        )
