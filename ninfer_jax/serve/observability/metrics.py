"""GET /metrics: Prometheus text format 0.0.4 (prometheus_client), one registry per app.

Two sources, neither of which touches the device or waits on the engine thread:
- `EngineCollector` reads the engine's latest immutable stats snapshot (`Engine.stats()`, a
  reference read) at scrape time and turns it into gauges and counters: lanes and limits,
  scheduler gauges, token/step counters, KV occupancy. Resources this engine does not have yet
  (host context backing, transfers) are exported as zero so
  dashboards see every documented name; docs/operations.md lists them.
- `ServeMetrics` holds what the HTTP side counts through the request trace: requests by
  outcome, response failures, and the TTFT / duration / queue histograms (each observed
  once per request).

With several HTTP workers (--http-workers) each worker counts only its own requests, so the
launcher sets PROMETHEUS_MULTIPROC_DIR before forking them: prometheus_client then keeps
those counters in per-process files and a scrape on any worker sums every worker's. The
engine series come from the one engine core's snapshot either way.

The route sits behind the same API-key middleware as the API. After an engine failure the last
snapshot is still served, with ninfer_engine_ready 0.
"""
from __future__ import annotations

import os

import falcon
from prometheus_client import (CollectorRegistry, Counter, Histogram,
                               disable_created_metrics, multiprocess)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from ninfer_jax.engine.stats import HOST_PHASES, LAUNCH_KINDS

# Outcomes of requests_total: rejected at preparation, the engine's finish reasons, a queue
# timeout, and failures without an outcome.
OUTCOMES = ("rejected", "stop", "length", "cancelled", "timeout", "failed")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0, 600.0)

# (metric name, help, EngineStats field); a field of None belongs to a feature not built yet:
# always 0, and its help text says so.
ENGINE_GAUGES = (
    ("ninfer_requests_running", "Resident requests (holding an execution lane).", "running"),
    ("ninfer_requests_waiting", "Requests waiting for admission.", "waiting"),
    ("ninfer_requests_paused", "Requests paused under KV pressure.", "paused"),
    ("ninfer_requests_prefilling", "Resident requests with prompt (or gap) to prefill.",
     "prefilling"),
    ("ninfer_requests_decode_ready", "Resident requests ready for a decode row.", "decode_ready"),
    ("ninfer_requests_replaying", "Resident requests rebuilding KV after a pause.", "replaying"),
    ("ninfer_requests_materializing", "Requests materializing host context (not built yet: always 0).", None),
    ("ninfer_device_kv_used_pages", "KV pages in use, retained prefixes included.",
     "kv_pages_used"),
    ("ninfer_device_kv_capacity_pages", "KV pages in the pool.", "kv_pages_capacity"),
    ("ninfer_device_kv_cached_pages", "KV pages retained by the prefix cache.", "kv_pages_cached"),
    ("ninfer_device_state_used_slots", "Device state slots held by requests and prefix "
     "checkpoints (hybrid models; 0 for dense ones).", "state_slots_used"),
    ("ninfer_device_state_capacity_slots", "Device state slots (hybrid models: "
     "--max-concurrency + --device-state-slots; 0 for dense ones).", "state_slots_capacity"),
    ("ninfer_host_context_used_bytes", "Host tier in use: spilled prefix pages, hybrid state "
     "checkpoints and pause snapshots (--host-context-mib).",
     ("host_pages_used", "host_page_bytes")),
    ("ninfer_host_context_cached_bytes", "Host tier held by prefix pages (spilled ones and "
     "clean copies of device pages).", ("host_pages_cached", "host_page_bytes")),
    ("ninfer_host_context_clean_bytes", "Host tier held by clean copies of prefix pages "
     "still on the device (evicting those moves no bytes).",
     ("host_pages_clean", "host_page_bytes")),
    ("ninfer_host_context_checkpoint_bytes", "Host tier held by spilled state checkpoints "
     "of prefix pages (hybrid models; 0 for dense ones).",
     ("host_pages_checkpoints", "host_page_bytes")),
    ("ninfer_host_context_reserved_bytes", "Host context reservations (not built yet: "
     "always 0; copies are queued with their slot held and counted as used).", None),
    ("ninfer_host_context_capacity_bytes", "Host tier budget.",
     ("host_pages_capacity", "host_page_bytes")),
    ("ninfer_host_context_peak_bytes", "Host tier peak use.",
     ("host_pages_peak", "host_page_bytes")),
)
ENGINE_COUNTERS = (
    ("ninfer_prompt_tokens_total", "Prompt tokens of admitted requests, counted once.",
     "prompt_tokens"),
    ("ninfer_prompt_tokens_cached_total", "Prompt tokens reused from the prefix cache.",
     "cached_tokens"),
    ("ninfer_prefill_tokens_total", "Tokens computed by prefill for the first time.",
     "prefill_tokens"),
    ("ninfer_replayed_tokens_total", "Tokens recomputed to recover paused requests.",
     "replayed_tokens"),
    ("ninfer_generation_tokens_total", "Committed output tokens (forced ones included).",
     "generation_tokens"),
    ("ninfer_decode_tokens_total", "Output tokens committed by decode rounds.", "decode_tokens"),
    ("ninfer_preemptions_total", "Pauses under KV pressure.", "preemptions"),
    ("ninfer_replay_restores_total", "Paused requests restored by replay.", "replay_restores"),
    ("ninfer_snapshot_restores_total", "Paused requests restored from host snapshots.",
     "snapshot_restores"),
    ("ninfer_spec_decode_rounds_total", "Speculative rounds: a request's verify rows with at "
     "least one draft in one step (--spec).", "spec_rounds"),
    ("ninfer_spec_decode_draft_tokens_total", "Draft tokens verified.", "spec_draft_tokens"),
    ("ninfer_spec_decode_accepted_tokens_total", "Draft tokens accepted (and committed).",
     "spec_accepted_tokens"),
    ("ninfer_spec_decode_fallback_steps_total", "Decode rows of speculation-eligible requests "
     "that ran without drafts (no proposal, no room, penalties or a token policy).",
     "spec_fallback_steps"),
    ("ninfer_prefill_units_total", "Prefill units run.", "prefill_units"),
    ("ninfer_vision_items_encoded_total", "Images and videos run through the vision tower "
     "(items inside a reused prefix are not).", "vision_items"),
    ("ninfer_vision_encode_seconds_total", "Device time of vision encodes (each measured "
     "after the steps queued before it).", "vision_seconds"),
    ("ninfer_decode_rounds_total", "Decode rounds run.", "decode_rounds"),
    ("ninfer_decode_rows_total", "Decode rows run (sum of batch sizes).", "decode_rows"),
    ("ninfer_device_wait_seconds_total", "Engine-thread wall time blocked on the device "
     "waiting for a step's samples (not kernel time: steps overlap host work).",
     "device_wait_seconds"),
    ("ninfer_step_launch_compiles_total", "XLA compiles (or loads from the persistent "
     "compilation cache) inside step launches: a shape or helper warm-up did not compile; "
     "every stream waits for each.", "launch_compiles"),
    ("ninfer_step_launch_compile_seconds_total", "Engine-thread time XLA spent compiling (or "
     "loading from the cache) inside step launches (part of "
     "ninfer_step_launch_seconds_total).", "launch_compile_seconds"),
)
TRANSFER_RESOURCES = ("state", "main_kv", "backend_kv")
TRANSFER_DIRECTIONS = ("device_to_host", "host_to_device")
HOST_WORK_PHASES = HOST_PHASES


def _value(stats, field) -> float:
    """A field's value; a (count, unit) pair is their product (pages times page bytes).
    A field the snapshot lacks raises: a renamed EngineStats field must not read as 0."""
    if field is None:
        return 0.0
    if isinstance(field, tuple):
        count, unit = field
        return float(getattr(stats, count) * getattr(stats, unit))
    return float(getattr(stats, field))


class EngineCollector:
    """Prometheus collector over the engine's published snapshot (never the live state)."""

    def __init__(self, ctx):
        self.ctx = ctx

    def collect(self):
        ctx = self.ctx
        stats = ctx.engine.stats()
        yield self._info()
        yield self._mesh()
        ready = bool(stats.ready and stats.healthy and ctx.engine.healthy)
        yield _gauge("ninfer_engine_ready", "1 when the engine serves requests.", float(ready))
        yield _gauge("ninfer_max_concurrency", "Resident execution lanes.",
                     float(stats.max_concurrency))
        yield _gauge("ninfer_max_context_tokens", "Per-sequence context ceiling.",
                     float(ctx.max_context))
        for name, doc, field in ENGINE_GAUGES:
            yield _gauge(name, doc, _value(stats, field))
        for name, doc, field in ENGINE_COUNTERS:
            counter = CounterMetricFamily(name, doc)
            counter.add_metric([], _value(stats, field))
            yield counter
        transfers = CounterMetricFamily("ninfer_context_transfer_bytes_total",
                                        "Host/device context payload transfers (main_kv: the "
                                        "host tier's page copies; state and backend_kv: not "
                                        "built yet, always 0).", labels=["resource",
                                                                             "direction"])
        moved = {("main_kv", "device_to_host"): "kv_bytes_to_host",
                 ("main_kv", "host_to_device"): "kv_bytes_to_device"}
        for resource in TRANSFER_RESOURCES:
            for direction in TRANSFER_DIRECTIONS:
                transfers.add_metric([resource, direction],
                                     _value(stats, moved.get((resource, direction))))
        yield transfers
        host_work = CounterMetricFamily("ninfer_host_work_seconds_total",
                                        "Engine-thread host work by phase.", labels=["phase"])
        phases = stats.host_work
        for phase in HOST_WORK_PHASES:
            host_work.add_metric([phase], float(phases.get(phase, 0.0)))
        yield host_work
        launches = CounterMetricFamily("ninfer_step_launches_total",
                                       "Steps launched, by what they carry (decode rows, a "
                                       "prefill chunk, or both: mixed).", labels=["kind"])
        launch_seconds = CounterMetricFamily(
            "ninfer_step_launch_seconds_total", "Engine-thread time inside step launches "
            "(part of program_submit; planning excluded), by step kind.", labels=["kind"])
        for kind in LAUNCH_KINDS:
            launches.add_metric([kind], float(stats.launches.get(kind, 0)))
            launch_seconds.add_metric([kind], float(stats.launch_seconds.get(kind, 0.0)))
        yield launches
        yield launch_seconds

    def _info(self) -> GaugeMetricFamily:
        ctx = self.ctx
        info = GaugeMetricFamily("ninfer_model_info", "Served model identity.",
                                 labels=["model", "architecture", "backend"])
        info.add_metric([ctx.model_id, ctx.architecture, _backend(ctx.engine)], 1.0)
        return info

    def _mesh(self) -> GaugeMetricFamily:
        """The devices the model is split over (--tensor-parallel): value = their count."""
        mesh = (getattr(self.ctx.engine, "runtime", None) or {}).get("mesh") or {}
        gauge = GaugeMetricFamily("ninfer_tensor_parallel",
                                  "Devices the model is split over (tensor parallelism).",
                                  labels=["axis", "devices"])
        gauge.add_metric([mesh.get("axis", ""), ",".join(mesh.get("devices", []))],
                         float(mesh.get("tensor_parallel", 1)))
        return gauge


def _backend(engine) -> str:
    import sys

    runtime = getattr(engine, "runtime", None)  # an engine-core client: JAX runs there
    if runtime is not None:
        return runtime.get("backend", "none")
    jax = sys.modules.get("jax")
    try:
        return jax.default_backend() if jax is not None else "none"
    except Exception:  # noqa: BLE001 - identity only
        return "unknown"


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class ServeMetrics:
    def __init__(self, ctx):
        self.registry = CollectorRegistry(auto_describe=False)  # what a scrape renders
        own = self.registry
        shared_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if shared_dir:
            # The request series below are written to this worker's file and rendered by
            # summing every worker's file: registering them for rendering too would count
            # this worker twice.
            own = CollectorRegistry(auto_describe=False)
            multiprocess.MultiProcessCollector(self.registry, path=shared_dir)
        self.registry.register(EngineCollector(ctx))
        self.requests = Counter(
            "ninfer_requests", "Generation requests by outcome (validation failures before "
            "preparation and token counting excluded).", ["outcome"], registry=own)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)  # every outcome is visible from the start
        self.response_failures = Counter(
            "ninfer_response_failures", "Started generation requests whose reply then failed "
            "on the server's side (rendering, storage), once per request.",
            registry=own)
        self.ttft = Histogram(
            "ninfer_time_to_first_token_seconds", "Preparation start to first committed token.",
            buckets=LATENCY_BUCKETS, registry=own)
        self.duration = Histogram(
            "ninfer_request_duration_seconds", "Preparation start to the engine outcome.",
            buckets=LATENCY_BUCKETS, registry=own)
        self.queue = Histogram(
            "ninfer_request_queue_seconds", "Submission to admission (initial queue wait).",
            buckets=LATENCY_BUCKETS, registry=own)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsResource:
    def __init__(self, metrics: ServeMetrics):
        self.metrics = metrics

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = CONTENT_TYPE_PLAIN_0_0_4
        resp.data = self.metrics.render()


def register(app: falcon.App, ctx) -> None:
    disable_created_metrics()  # no *_created series: counters reset with the server anyway
    metrics = ServeMetrics(ctx)
    ctx.extras["metrics"] = metrics
    app.add_route("/metrics", MetricsResource(metrics))
