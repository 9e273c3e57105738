"""Every `ninfer serve` option, declared once: default, help text and bounds.

Each ServeConfig (and SamplingOverrides) field carries its option's declaration in its
metadata (`option(...)`); serve/options.py builds the Click options of `ninfer serve` from it
and parses `ninfer replay`'s serve-args the same way, and engine/config.py builds the
EngineConfig from the resulting value. Defaults of what the engine enforces are the
EngineConfig's own (one place: engine/config.py).
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.engine.config import (DEFAULT_HOST_CONTEXT_MIB, DEFAULT_HOST_STATE_IMAGES,
                                      MAX_LANES, MIN_LANES, EngineConfig)
from ninfer_jax.engine.speculation import BACKENDS, DRAFT_RANGES

_ENGINE = EngineConfig()


@dataclasses.dataclass(frozen=True)
class Option:
    """How a field is spelled and checked on the command line (None: not a CLI option)."""

    help: str | None = None
    flag: str | None = None  # default: --field-name
    type: type | None = None  # int, float or str; default: the default's type
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None
    is_flag: bool = False
    flag_value: object = True  # what the flag sets (False for a --no-... of a True field)
    envvar: str | None = None
    path: str | None = None  # a file path: "existing" (must exist) or "new"


def option(default, help: str | None = None, **spec):  # noqa: A002 - Click's own word
    return dataclasses.field(default=default, metadata={"option": Option(help=help, **spec)})


def option_of(field: dataclasses.Field) -> Option | None:
    return field.metadata.get("option")


_OVERRIDE = "Process-wide override of the model's default; a request's own field wins."


@dataclasses.dataclass(frozen=True)
class SamplingOverrides:
    """Process-level sampling overrides (--temperature ... --greedy). None = not set.

    Precedence: architecture/thinking-mode defaults < these flags < request fields, and
    --greedy finally forces temperature 0."""

    temperature: float | None = option(None, _OVERRIDE, type=float, min=0, max=2)
    top_p: float | None = option(None, _OVERRIDE, type=float, min=0, max=1)
    top_k: int | None = option(None, _OVERRIDE + " Zero or below disables top-k filtering "
                               "(the 20-candidate cap stays).", type=int, max=20)
    min_p: float | None = option(None, _OVERRIDE, type=float, min=0, max=1)
    presence_penalty: float | None = option(None, _OVERRIDE, type=float, min=-2, max=2)
    frequency_penalty: float | None = option(None, _OVERRIDE, type=float, min=-2, max=2)
    seed: int | None = option(None, "Seed of requests that give none (default: a fresh "
                              "random seed per request).", type=int)
    greedy: bool = option(False, "Force greedy decoding (temperature 0) for every request, "
                          "whatever it asks.", is_flag=True)


_DRAFT_HELP = "; ".join(f"{b} {lo}..{hi} (default {d})" for b, (lo, hi, d) in DRAFT_RANGES.items())


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    artifact: str  # the command's argument (default: the embedded SmolLM2 artifact)
    host: str = option("127.0.0.1", "Listen address.")
    port: int = option(8080, "Listen port.", min=1, max=65535)
    # --api-key, NINFER_API_KEY or --api-key-file (serve/options.py), resolved
    api_key: str | None = option(
        None, "Require this bearer token / x-api-key. Prefer NINFER_API_KEY or "
        "--api-key-file: a command-line value is visible in `ps`.", type=str,
        envvar="NINFER_API_KEY")
    # Host header names answered besides IP literals, localhost and this machine's names;
    # "*" answers any (serve/wire/http.py says why the check exists). The CLI value is one
    # comma-separated string.
    allowed_hosts: tuple[str, ...] = option(
        (), "Comma-separated Host header names answered besides IP addresses, localhost, "
        "--host and this machine's names; '*' answers any host.", type=str)
    model_id: str | None = option(None, "Public model alias (default: artifact name).", type=str)
    cors: bool = option(False, "Permissive browser CORS headers.", is_flag=True)
    # context and scheduling
    max_context: int = option(_ENGINE.max_context, "Prompt + reply ceiling of each request, "
                              "in tokens (never beyond the model's positions).", min=16)
    # tokens, "auto", or None (= max_context)
    kv_capacity: int | str | None = option(
        None, "Shared KV pool in tokens, or 'auto' (free device memory). Default: one "
        "--max-context per lane, within the auto bound.", type=str)
    max_concurrency: int = option(_ENGINE.max_concurrency,
                                  "Resident execution lanes (also the largest decode batch).",
                                  min=MIN_LANES, max=MAX_LANES)
    max_pending_requests: int = option(
        _ENGINE.max_pending, "Requests allowed to wait for a lane; beyond that, 429 "
        "server_overloaded.", min=0)
    pending_timeout_ms: int = option(
        round(_ENGINE.pending_timeout * 1000), "Longest wait for preparation and admission; "
        "then 503 request_queue_timeout.", min=1)
    prefill_chunk: int = option(_ENGINE.prefill_chunk, "Prompt tokens prefilled per step.",
                                min=16)
    chunk_segments: int | None = option(
        None, "Most prompts prefilled together in one step, each up to 256 tokens of it "
        "(default: 8 on GPUs for dense llama / qwen3 text models, else 1).", type=int, min=1,
        max=32)
    decode_share: float = option(
        _ENGINE.decode_share, "0: a step that prefills a prompt chunk carries no decode rows "
        "(prompts first); above 0 running streams decode in every step, chunks included.",
        min=0, max=16)
    default_max_tokens: int = option(8192, "Reply limit of a request that gives none "
                                     "(capped by the context left).", min=1)
    # The contract's table says 384; a parsed body costs several times its size, so with every
    # lane and pending request holding one that admitted tens of GB (docs/operations.md).
    max_request_mib: int = option(32, "Largest request body, refused with 413 before it is "
                                  "parsed.", min=1)
    no_prefix_reuse: bool = option(
        not _ENGINE.prefix_reuse, "No cross-request prefix reuse (pause snapshots and replay "
        "still work).", is_flag=True)
    # None: the contract's default (engine/config.py)
    host_context_mib: int | None = option(
        None, "Host memory budget for KV spilled from the device pool and for pause "
        f"snapshots [default: {DEFAULT_HOST_CONTEXT_MIB}, plus {DEFAULT_HOST_STATE_IMAGES} "
        "recurrent states for hybrid models]; 0 disables the host tier.",
        type=int, min=0)
    # artifact/checksums.py, when the core reads the weights
    verify_checksums: bool = option(
        True, "Skip checking the artifact's file checksums at load (they read every weight "
        "byte once: about 1 s per GB).", flag="--no-verify-checksums", is_flag=True,
        flag_value=False)
    # hybrid models: state slots beyond one per lane (accepted and unused on dense models);
    # None: as many as --max-concurrency, the spec's default (engine/state_slots.extra_slots)
    device_state_slots: int | None = option(
        None, "Hybrid models: device state slots beyond one per lane (total capacity "
        "--max-concurrency + N; default N = --max-concurrency). Dense models have no state "
        "slots: accepted, no effect.", type=int, min=0)
    # speculative decoding (engine/speculation.py): backend, draft tokens per round
    spec: str | None = option(
        None, "Speculative decoding backend (off by default). ngram: prompt lookup, no "
        "weights, every model; mtp, dflash, dflash2: the artifact's MTP head or DFlash / "
        "DFlash2 drafter component, drafting inside the step (hybrid models).",
        type=str, choices=tuple(BACKENDS))
    draft_tokens: int | None = option(  # None: the backend's default
        None, f"Draft tokens per speculative round: {_DRAFT_HELP}.", type=int, min=1)
    lm_head_draft: bool = option(
        False, "With --spec mtp|dflash|dflash2: propose through the artifact's reduced "
        "proposal head (its draft_head component, a vocabulary-subset lm_head) instead of "
        "the full lm_head; refused when the artifact has none.", is_flag=True)
    weights: str | None = option(
        None, "Quantize the artifact's float projection matrices at load (what `ninfer "
        "convert --weights` would store; no second artifact): q8_0, q4_0, q4_1 for the CPU "
        "block kernel, int8, fp8, int4, nvfp4 for the GPU kernels. Refused on an artifact "
        "whose projections are already quantized, and with --tensor-parallel.",
        choices=("q8_0", "q4_0", "q4_1", "int8", "fp8", "int4", "nvfp4"))
    kv_dtype: str = option(
        "auto", "KV page storage (auto: the compute dtype, f32 on CPU, bf16 on GPU, but f16 "
        "for GGUF block weights on the CPU; f16: CPU only, llama.cpp's KV format, half of "
        "f32's bytes; fp8 (e4m3) and int8: 8-bit codes "
        "with a scale per token and KV head, about half of bf16's bytes; k8v4: int8 keys and "
        "int4 values, nvfp4: E2M1 keys and values, 4-bit codes with an e4m3 scale per 16 and "
        "a float32 one per token and KV head, about 0.41x and 0.30x of bf16's bytes at head "
        "dim 128; head dims must be multiples of 16).",
        choices=("auto", "f32", "bf16", "f16", "fp8", "int8", "k8v4", "nvfp4"))
    # templates and reasoning
    # path of a Jinja file overriding the artifact's
    chat_template: str | None = option(None, "A Jinja chat template file used instead of the "
                                       "artifact's.", type=str, path="existing")
    default_thinking_budget: int | None = option(
        None, "Reasoning models: cap on the thinking tokens of every thinking-enabled request "
        "that sets no budget of its own.", type=int, min=1)
    no_thinking: bool = option(False, "Reasoning models: thinking off unless a request turns "
                               "it on.", is_flag=True)
    preserve_thinking: bool = option(False, "Reasoning models: keep closed earlier turns' "
                                     "reasoning in the prompt unless a request says otherwise "
                                     "(as the template allows).", is_flag=True)
    vision: bool = option(False, "Accept media input (needs an artifact with a vision "
                          "component).", is_flag=True)
    # serve/media/: prepared media payloads (--vision only)
    media_cache_mib: int = option(1024, "LRU-retained prepared media payloads, MiB; 0 "
                                  "disables retention.", min=0)
    media_live_mib: int = option(2048, "All live prepared media payloads (cached or held by "
                                 "requests), MiB.", min=1)
    media_preprocess_threads: int = option(
        0, "Media preprocessing workers per HTTP worker; 0: the host's CPU count, at most "
        "16.", min=0, max=256)
    # Responses store
    response_store_max_records: int = option(
        1024, "Responses kept for previous_response_id and GET /v1/responses/{id}; 0 turns "
        "the store off.", min=0)
    response_store_max_mib: int = option(256, "Size budget of the Responses store, MiB; 0 "
                                         "turns it off.", min=0)
    # observability
    request_log_jsonl: str | None = option(
        None, "Append one JSON line per server and request event to this file (no prompt or "
        "generated text).", type=str, path="new")
    capture_requests: str | None = option(
        None, "Append every generation request's body to this file, for `ninfer replay` (it "
        "holds user data).", type=str, path="new")
    log_stats_interval_ms: int = option(5000, "Interval of the throughput line on stderr; 0 "
                                        "turns it off.", min=0)
    # serve/ui/routes.py: the chat and metrics page at / and its files under /ui/
    no_ui: bool = option(False, "Do not serve the built-in web page (/ and /ui/...).",
                         is_flag=True)
    log_level: str = option("info", "Verbosity of the stderr records.",
                            choices=("trace", "debug", "info", "warning", "error", "critical",
                                     "off"))
    # sampling (its own fields are the options)
    sampling: SamplingOverrides = SamplingOverrides()
    # device (applied to the engine-core process's environment only)
    device: int = option(  # CUDA device index among the visible ones
        0, "CUDA device index (among CUDA_VISIBLE_DEVICES when set) the engine core uses. "
        "On CPU: accepted, no effect beyond the core's environment.", min=0)
    # model/tensor_parallel.py; "auto" or a device count, parsed by serve/options.py
    tensor_parallel: int | str = option(
        1, "Devices the model is split over (tensor parallelism: heads, MLP columns and "
        "the vocabulary): N, or 'auto' for every visible device. N must divide the "
        "attention heads and kv heads (and a hybrid model's linear-attention heads).",
        type=str)
    # model/tensor_parallel.py, `expert_parallel`
    expert_parallel: bool = option(
        False, "MoE models with --tensor-parallel N (N >= 2): split the routed experts by "
        "expert index over the N devices (each holds E/N of them) instead of replicating "
        "them on every device; attention, dense MLPs and shared experts stay tensor-parallel. "
        "N must divide the routed experts.", is_flag=True)
    # serve/engine_setup.core_environment: XLA_PYTHON_CLIENT_MEM_FRACTION of the core
    gpu_memory_utilization: float = option(
        0.9, "Fraction of each GPU's memory the engine core may use: weights, the KV pool "
        "(--kv-capacity auto takes what is left) and compiled steps; the rest stays with the "
        "CUDA context and libraries. (XLA's own default is 0.75.) No effect on CPU.",
        type=float, min=0.05, max=1.0)
    no_cuda_graph: bool = option(  # XLA command buffers (CUDA graphs) off
        False, "Disable CUDA Graph decode graphs (XLA command buffers) in the engine core. "
        "On CPU: accepted, no effect beyond the core's environment.", is_flag=True)
    # engine/runner.py: STEP_SHAPE_SETS
    step_shapes: str = option(
        "all", "Step shapes compiled before the server is ready. 'essential': only the few "
        "that can serve any step by padding (the smallest and largest decode steps, the "
        "largest chunk step): a start several times faster, each step padded to one of "
        "them.", choices=("all", "essential"))
    # gunicorn (serve/wire/http_worker.py: head and read timeouts, the connection cap)
    header_timeout_s: float = option(
        10.0, "Seconds a client has to send a request head (408 after).",
        flag="--header-timeout", min=0.1)
    read_timeout_s: float = option(
        30.0, "Seconds one read of a request body, or one write of a reply, may stall.",
        flag="--read-timeout", min=0.1)
    max_connections: int = option(
        1000, "Open connections per HTTP worker, idle ones included (independent of "
        "--http-threads); past it new clients wait in the listen backlog.", min=1)
    shutdown_timeout_s: float = option(
        30.0, "On SIGTERM/SIGINT: seconds in-flight requests may take to finish before they "
        "are ended with an error.", flag="--shutdown-timeout", min=0)
    # per worker; None: see http_threads_per_worker
    http_threads: int | None = option(
        None, "HTTP threads per worker (one per open stream). Default: enough for every lane "
        "and pending request, at least 32.", type=int, min=2)
    http_workers: int = option(
        1, "HTTP worker processes sharing the one engine core. Above 1 it needs the Responses "
        "store off (--response-store-max-records 0) and no --request-log-jsonl / "
        "--capture-requests: those are per worker.", min=1, max=64)
    # argv as typed, kept for the request log's server_start record (redacted there)
    argv: tuple[str, ...] = ()


def http_threads_per_worker(config: ServeConfig) -> int:
    """gthread holds one thread per open connection, so every lane and pending request needs
    one (plus a few for /health and /metrics), shared among the workers; at least 32."""
    if config.http_threads is not None:
        return config.http_threads
    needed = config.max_concurrency + config.max_pending_requests + 16
    return max(32, -(-needed // config.http_workers))
