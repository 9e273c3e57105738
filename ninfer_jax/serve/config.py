"""Every `ninfer serve` option, resolved once at start-up into one frozen value.

The Click command (cli/serve.py) builds a ServeConfig; the launcher, engine, app and adapters
read it. Defaults follow the serving contract's option table.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SamplingOverrides:
    """Process-level sampling overrides (--temperature ... --greedy). None = not set.

    Precedence: architecture/thinking-mode defaults < these flags < request fields, and
    --greedy finally forces temperature 0."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    greedy: bool = False


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    artifact: str
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None  # --api-key, NINFER_API_KEY or --api-key-file, resolved
    # Host header names answered besides IP literals, localhost and this machine's names;
    # "*" answers any (serve/http.py says why the check exists)
    allowed_hosts: tuple[str, ...] = ()
    model_id: str | None = None  # None -> artifact metadata name
    cors: bool = False
    # context and scheduling
    max_context: int = 8192
    kv_capacity: int | str | None = None  # tokens, "auto", or None (= max_context)
    max_concurrency: int = 1
    max_pending_requests: int = 16
    pending_timeout_ms: int = 30000
    prefill_chunk: int = 1024
    decode_share: float = 0.25
    default_max_tokens: int = 8192
    # The contract's table says 384; a parsed body costs several times its size, so with every
    # lane and pending request holding one that admitted tens of GB (docs/operations.md).
    max_request_mib: int = 32
    no_prefix_reuse: bool = False
    verify_checksums: bool = True  # artifact/checksums.py, when the core reads the weights
    host_context_mib: int | None = None  # None: the contract's default (engine/config.py)
    kv_dtype: str = "auto"  # auto: f32 on CPU, bf16 on GPU
    # hybrid models: state slots beyond one per lane (accepted and unused on dense models);
    # None: as many as --max-concurrency, the spec's default (engine/state_slots.extra_slots)
    device_state_slots: int | None = None
    # speculative decoding (engine/speculation.py): backend, draft tokens per round
    spec: str | None = None
    draft_tokens: int | None = None  # None: the backend's default
    # templates and reasoning
    chat_template: str | None = None  # path of a Jinja file overriding the artifact's
    default_thinking_budget: int | None = None
    no_thinking: bool = False
    preserve_thinking: bool = False
    vision: bool = False
    # Responses store
    response_store_max_records: int = 1024
    response_store_max_mib: int = 256
    # observability
    request_log_jsonl: str | None = None
    capture_requests: str | None = None
    log_stats_interval_ms: int = 5000
    log_level: str = "info"
    # sampling
    sampling: SamplingOverrides = SamplingOverrides()
    # device (applied to the engine-core process's environment only)
    device: int = 0  # CUDA device index among the visible ones
    no_cuda_graph: bool = False  # XLA command buffers (CUDA graphs) off
    step_shapes: str = "all"  # or "essential" (engine/runner.py: STEP_SHAPE_SETS)
    # gunicorn (serve/http_worker.py: head and read timeouts, the connection cap)
    header_timeout_s: float = 10.0  # a request head must arrive within this
    read_timeout_s: float = 30.0  # longest wait on one socket read or write in a thread
    max_connections: int = 1000  # open connections per HTTP worker, idle ones included
    shutdown_timeout_s: float = 30.0  # SIGTERM/SIGINT: in-flight requests may finish this long
    http_threads: int | None = None  # per worker; None: see http_threads_per_worker
    http_workers: int = 1  # HTTP worker processes sharing the one engine core
    # argv as typed, kept for the request log's server_start record (redacted there)
    argv: tuple[str, ...] = ()


def http_threads_per_worker(config: ServeConfig) -> int:
    """gthread holds one thread per open connection, so every lane and pending request needs
    one (plus a few for /health and /metrics), shared among the workers; at least 32."""
    if config.http_threads is not None:
        return config.http_threads
    needed = config.max_concurrency + config.max_pending_requests + 16
    return max(32, -(-needed // config.http_workers))
