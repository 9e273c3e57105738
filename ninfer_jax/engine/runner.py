"""JaxRunner: the only place that runs compiled model steps (implements runner_api.StepRunner).

Threading: used by the engine thread only; it owns the params, the KV pool arrays and the
compiled executables.
Memory: per layer one (k, v) pair shaped by paged_attention.get_kv_cache_shape over `num_pages`
pages; page DUMMY_PAGE (0) absorbs the writes of padding rows. Every step donates the caches
and gets them back, so they are updated in place.
Shapes: inputs are padded to buckets (decode batch 1, 2, 4, 8; prefill chunks and page-table
widths as `bucket_plan` decides). `warmup()` compiles every bucket so no request waits on a
compile; with JAX_COMPILATION_CACHE_DIR set the executables also go to JAX's persistent cache,
and later starts load them from disk.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec
from ninfer_jax.kernels import paged_attention
from ninfer_jax.kernels.dispatch import use_kernels
from ninfer_jax.model import sampling, steps

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8)
SMALLEST_CHUNK = 16
SMALLEST_WIDTH = 8  # pages


def default_dtype():
    """f32 on CPU (XLA's bf16 matmuls there are ~20x slower), bf16 on accelerators."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


KV_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def kv_dtype_for(name: str):
    """`--kv-dtype`: auto stores KV in the compute dtype. On CPU bf16 pages halve the pool's
    memory (attention reads them back into f32); the GPU kernels read pages in the compute
    dtype only, so anything else is refused there rather than silently changed."""
    compute = default_dtype()
    if name == "auto":
        return compute
    if name not in KV_DTYPES:
        raise ValueError(f"--kv-dtype {name} is not supported (choose auto, f32 or bf16)")
    dtype = KV_DTYPES[name]
    if use_kernels() and jnp.dtype(dtype) != jnp.dtype(compute):
        raise ValueError(f"--kv-dtype {name} is not available with the GPU kernels, which "
                         f"read {jnp.dtype(compute).name} pages (use auto)")
    return dtype


def has_quantized_projections(params) -> bool:
    return any(isinstance(leaf, dict) for layer in params["layers"] for leaf in layer.values())


def decode_batch_buckets(max_batch: int, min_decode_batch: int) -> tuple[int, ...]:
    """Batch buckets 1, 2, 4, 8 up to max_batch, starting at min_decode_batch."""
    sizes = [b for b in BATCH_BUCKETS if min_decode_batch <= b < max_batch]
    return tuple(sizes) + (max_batch,)


def geometric_buckets(smallest: int, largest: int, growth: int) -> tuple[int, ...]:
    """smallest, smallest*growth, ... below largest, then largest itself."""
    sizes, size = [], min(smallest, largest)
    while size < largest:
        sizes.append(size)
        size *= growth
    return tuple(sizes) + (largest,)


def bucket_plan(prefill_chunk: int, max_pages: int, *, width_growth: int,
                attention_follows_lengths: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefill chunk buckets, page-table width buckets).

    The GPU kernels cost what the page-table width says, so widths grow geometrically and
    chunks by 4 (few shapes: GPU compiles are slow). The references (CPU) walk pages only up
    to the real lengths, so one width serves every step at no cost, and the shapes saved pay
    for chunk buckets growing by 2: a 20-token prompt then runs as 32 rows, not 64."""
    if attention_follows_lengths:
        return geometric_buckets(SMALLEST_CHUNK, prefill_chunk, 2), (max_pages,)
    return (geometric_buckets(SMALLEST_CHUNK, prefill_chunk, 4),
            geometric_buckets(SMALLEST_WIDTH, max_pages, width_growth))


def fit_bucket(buckets: Sequence[int], size: int, what: str) -> int:
    for bucket in buckets:
        if bucket >= size:
            return bucket
    raise ValueError(f"{what} {size} exceeds the largest compiled bucket {buckets[-1]}")


def enable_persistent_cache() -> None:
    """Cache every executable, not only slow ones: a server start compiles dozens of steps of
    a few seconds each, and the next start should load them all (when a cache dir is set)."""
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


class JaxRunner:
    """Pads scheduler units to compiled shapes, runs one step, returns sampled tokens."""

    def __init__(self, artifact, *, num_pages: int, page_size: int = 16, max_batch: int,
                 max_context: int, prefill_chunk: int, dtype=None, kv_dtype=None,
                 width_growth: int = 4,
                 attention_follows_lengths: bool | None = None,
                 min_decode_batch: int | None = None, expand_quantized: bool | None = None):
        if num_pages < 2:
            raise ValueError("num_pages must leave at least one page besides the dummy page")
        enable_persistent_cache()
        self.config = artifact.config
        self.page_size, self.num_pages, self.max_batch = page_size, num_pages, max_batch
        self.max_context = max_context
        self.dtype = dtype or default_dtype()
        self.kv_dtype = jnp.dtype(kv_dtype or self.dtype)
        self.params = steps.cast_params(artifact.params, self.dtype)
        if expand_quantized is None:  # without the quantized kernels, dense weights are faster
            expand_quantized = not use_kernels()
        if expand_quantized and has_quantized_projections(self.params):
            self.params = steps.expand_quantized(self.params, self.dtype)
        self.kv = self._empty_kv()
        if min_decode_batch is None:
            # On the H200 XLA's one-row matrix-vector path for bf16 weights is slower than its
            # two-row matmul (Llama-3-8B shape: 5.60 ms per step at batch 1, 4.46 ms at batch
            # 2; docs/benchmarks.md), so a lone row runs padded with a dummy row there.
            # Quantized projections keep batch 1: their one-row kernel is built for it.
            min_decode_batch = 2 if use_kernels() and not has_quantized_projections(
                self.params) else 1
        self.batch_buckets = decode_batch_buckets(max_batch, min(min_decode_batch, max_batch))
        if attention_follows_lengths is None:  # the references do; the GPU kernels do not
            attention_follows_lengths = not use_kernels()
        self.chunk_buckets, self.width_buckets = bucket_plan(
            prefill_chunk, math.ceil(max_context / page_size), width_growth=width_growth,
            attention_follows_lengths=attention_follows_lengths)
        static = dict(static_argnames=("config", "page_size"), donate_argnames=("kv",))
        self._jitted = {"prefill": jax.jit(steps.prefill_step, **static),
                        "decode": jax.jit(steps.decode_step, **static)}
        self._executables: dict[tuple, object] = {}
        self._zero_bias: dict[int, jax.Array] = {}
        self.is_warm = False

    def _empty_kv(self):
        shape = paged_attention.get_kv_cache_shape(
            self.num_pages, self.page_size, self.config.num_kv_heads, self.config.head_dim)
        return [(jnp.zeros(shape, self.kv_dtype), jnp.zeros(shape, self.kv_dtype))
                for _ in range(self.config.num_layers)]

    # ------------------------------------------------------------------ shapes and compiling

    def step_shapes(self) -> list[tuple[str, int, int]]:
        """Every (kind, rows, width) the runner can be asked for. A prefill chunk bucket pairs
        only with widths that can hold more tokens than the next smaller chunk bucket."""
        shapes = [("decode", b, w) for b in self.batch_buckets for w in self.width_buckets]
        smaller = (0,) + self.chunk_buckets[:-1]
        for chunk, below in zip(self.chunk_buckets, smaller):
            shapes += [("prefill", chunk, w) for w in self.width_buckets
                       if w * self.page_size > below]
        return shapes

    @property
    def compiled_shapes(self) -> set[tuple[str, int, int]]:
        return set(self._executables)

    def warmup(self) -> None:
        """Compile every step shape, then run each once on padding inputs (they only write
        the dummy page): an executable's first run pays a one-time set-up, measured at
        0.3-0.4 s per shape on CPU, that would otherwise land on a request's first token."""
        started = time.perf_counter()
        shapes = self.step_shapes()
        for kind, rows, width in shapes:
            self._executable(kind, rows, width)
        compiled = time.perf_counter()
        for kind, rows, width in shapes:
            _, self.kv = self._executable(kind, rows, width)(
                self.params, self.kv, *self._example_inputs(kind, rows, width))
        jax.block_until_ready(self.kv)
        self.is_warm = True
        log.info("compiled %d step shapes in %.1f s, first runs %.1f s", len(shapes),
                 compiled - started, time.perf_counter() - compiled)

    def _executable(self, kind: str, rows: int, width: int):
        key = (kind, rows, width)
        if key not in self._executables:
            if self.is_warm:
                log.warning("compiling %s after warm-up (a bucket was missed)", key)
            example = self._example_inputs(kind, rows, width)
            lowered = self._jitted[kind].lower(self.params, self.kv, *example,
                                               config=self.config, page_size=self.page_size)
            self._executables[key] = lowered.compile()
        return self._executables[key]

    def _example_inputs(self, kind: str, rows: int, width: int):
        batch = self._sampling([], 1 if kind == "prefill" else rows)
        zeros = np.zeros(rows, np.int32)
        if kind == "prefill":
            return zeros, np.int32(0), np.int32(1), np.zeros(width, np.int32), batch
        return zeros, zeros, np.zeros((rows, width), np.int32), batch

    def _sampling(self, specs: Sequence[SampleSpec | None], rows: int) -> sampling.SamplingBatch:
        """Host sampling inputs; the [rows, V] bias is sent only when some row has penalties,
        otherwise a device-resident zero array stands in."""
        with_bias = any(s is not None and sampling.needs_bias(s) for s in specs)
        batch = sampling.host_batch(specs, rows, self.config.vocab_size, with_bias=with_bias)
        if not with_bias:
            if rows not in self._zero_bias:
                self._zero_bias[rows] = jnp.zeros((rows, self.config.vocab_size), jnp.float32)
            batch = dataclasses.replace(batch, logit_bias=self._zero_bias[rows])
        return batch

    # ------------------------------------------------------------------ steps

    def prefill(self, unit: PrefillUnit) -> int | None:
        num_tokens = len(unit.tokens)
        end = unit.start + num_tokens
        if num_tokens < 1 or end > self.max_context:
            raise ValueError(f"prefill of {num_tokens} tokens at {unit.start} exceeds the context")
        chunk = fit_bucket(self.chunk_buckets, num_tokens, "prefill chunk")
        width = fit_bucket(self.width_buckets, len(unit.page_table), "page table")
        _check_covers(unit.page_table, end, self.page_size)
        tokens = np.zeros(chunk, np.int32)
        tokens[:num_tokens] = unit.tokens
        page_table = _padded_row(unit.page_table, width)
        token, self.kv = self._executable("prefill", chunk, width)(
            self.params, self.kv, tokens, np.int32(unit.start), np.int32(num_tokens), page_table,
            self._sampling([unit.sample], 1))
        # Without a sample nothing is read back, so consecutive chunks queue up on the device.
        return None if unit.sample is None else int(np.asarray(token)[0])

    def decode(self, rows: Sequence[DecodeRow]) -> np.ndarray:
        if not 1 <= len(rows) <= self.max_batch:
            raise ValueError(f"decode batch of {len(rows)} rows (max {self.max_batch})")
        batch = fit_bucket(self.batch_buckets, len(rows), "decode batch")
        width = fit_bucket(self.width_buckets, max(len(r.page_table) for r in rows), "page table")
        tokens, positions = np.zeros(batch, np.int32), np.zeros(batch, np.int32)
        # Padding rows: position 0 in an all-dummy page table, so they write the dummy page.
        page_tables = np.full((batch, width), paged_attention.DUMMY_PAGE, np.int32)
        for i, row in enumerate(rows):
            if row.position >= self.max_context:
                raise ValueError(f"decode position {row.position} exceeds the context")
            _check_covers(row.page_table, row.position + 1, self.page_size)
            tokens[i], positions[i] = row.token, row.position
            page_tables[i, :len(row.page_table)] = row.page_table
        sampled, self.kv = self._executable("decode", batch, width)(
            self.params, self.kv, tokens, positions, page_tables,
            self._sampling([r.sample for r in rows], batch))
        return np.asarray(sampled)[:len(rows)].astype(np.int32)


def _padded_row(page_table, width: int) -> np.ndarray:
    row = np.full(width, paged_attention.DUMMY_PAGE, np.int32)
    row[:len(page_table)] = page_table
    return row


def _check_covers(page_table, num_positions: int, page_size: int) -> None:
    if len(page_table) * page_size < num_positions:
        raise ValueError(f"page table of {len(page_table)} pages does not cover "
                         f"{num_positions} positions")
