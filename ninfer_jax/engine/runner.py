"""JaxRunner: the only place that runs compiled model steps (implements runner_api.StepRunner).

Threading: used by the engine thread only, except that `warmup()` may leave a background
thread compiling the less urgent step shapes; it owns the params, the KV pool arrays and the
compiled executables.
Memory: the family's caches (`init_caches` / `cache_shapes` of steps.FAMILIES): per attention
layer one (k, v) pair shaped by paged_attention.get_kv_cache_shape over `num_pages` pages;
page DUMMY_PAGE (0) absorbs the writes of padding rows. Hybrid families add per Gated
DeltaNet (or Mamba-2) layer the conv and recurrent state of `state_slot_capacity + 1` slots
(slot 0 the dummy, engine/state_slots.py), Gemma 4 per sliding layer a KV ring of each slot
(sized by `step_tokens`), and their steps carry each unit's slot. The presence/frequency
penalties' output counts, int32 [penalty_lanes + 1, V] (engine/penalty_lanes.py), and the
same lanes' token-policy automata, int32 [penalty_lanes + 1, token_automaton.ROW_WIDTH]
(engine/policy_lanes.py). Every step donates the caches, the counts and the automata and
gets them back, so they are updated in place.
Steps: one compiled body, `steps.ragged_step`: an optional prefill chunk plus a region of
single-token rows (decode now, verify rows later). Its output, the tokens sampled after the
chunk and after every row, stays on the device and is passed to the next step, whose rows can
name an entry (`DecodeRow.from_previous`): that is how step n+1 is launched before step n's
tokens reach the host. `collect` copies one small int32 array back.
Shapes: (chunk bucket C, row bucket R) pairs, one page-table width (`max_context` pages: both
attention paths cost what the real lengths say, not the width). Decode-only steps (C = 0) get
every row bucket (1 or 2, 4, ... up to max_batch); steps with a chunk get a sparser set of
row buckets. `warmup()` compiles, in parallel, the few shapes that can serve any step
(the smallest and largest decode steps, the largest chunk step) before the server reports
ready; the rest compile after, in a background thread on GPUs (all before ready on CPU, where
compiles compete with serving for two cores). A step uses the cheapest compiled shape that
holds it, so it never waits for a compile. With `vision` every shape also gets a media
variant (`steps.packed_media_step`, compiled alongside), which only steps of prompts with
media and rows after them run (engine/vision_rows.py builds their MediaRows). With JAX_COMPILATION_CACHE_DIR set, executables go
to JAX's persistent cache and later starts load them from disk.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import math
import os
import threading
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ninfer_jax.engine.compile_clock import COMPILE_CLOCK
from ninfer_jax.engine.executable_store import ExecutableStore
from ninfer_jax.engine import page_store
from ninfer_jax.engine.host_pages import StateCopy
from ninfer_jax.engine.runner_api import (
    DecodeRow, PageCopyError, PrefillUnit, StepPlan, StepResult, chunk_index,
)
from ninfer_jax.engine.state_slots import DUMMY_STATE_SLOT
from ninfer_jax.kernels import paged_attention, quant_matmul
from ninfer_jax.kernels.quant_matmul import w8a8 as quant_w8a8
from ninfer_jax.kernels.dispatch import use_kernels
from ninfer_jax.model import fused_projections, packed_inputs, sampling, steps, token_automaton
from ninfer_jax.model.dflash_config import DENSE_TARGETS as DENSE_DFLASH_TARGETS
from ninfer_jax.model import tensor_parallel as tp

log = logging.getLogger(__name__)

SMALLEST_CHUNK = 16
GPU_SMALLEST_CHUNK = 64
# Shapes compiled at once after ready; each may hold a scratch copy of the largest weight
# while XLA autotunes (serve/kv_sizing.compile_scratch_bytes leaves room for that).
BACKGROUND_COMPILE_THREADS = 4
# Steps with several prompts' chunks (JaxRunner._init_segments): on GPUs 8 segments of 256
# tokens, a 2048-token step as cheap per token as the 1024-token chunk.
DEFAULT_CHUNK_SEGMENTS = 8
DEFAULT_SEGMENT_TOKENS = 256


def step_tokens_of(prefill_chunk: int, max_batch: int) -> int:
    """The most tokens one sequence adds in one step: its largest chunk, or its verify rows
    (at most every row of a step)."""
    return max(prefill_chunk, max_batch)


def default_dtype():
    """f32 on CPU (XLA's bf16 matmuls there are ~20x slower), bf16 on accelerators."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


# fp8 (e4m3) and int8 pages carry a float32 scale per token and kv head (paged_attention's
# ScaledPages); k8v4 (int8 keys, int4 values) and nvfp4 (E2M1 keys and values) are
# paged_attention.KVFormats whose 4-bit pages carry an e4m3 scale per 16 elements and a float32
# one per token and kv head (FourBitPages). Every reader widens the codes to the compute dtype
# and applies the scales (on the CPU the jnp reference reads 8- and 4-bit pages).
KV_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16,
             "fp8": jnp.float8_e4m3fn, "int8": jnp.int8,
             "k8v4": paged_attention.K8V4, "nvfp4": paged_attention.NVFP4}


def kv_dtype_for(name: str, *, block_weights: bool = False):
    """`--kv-dtype`: auto stores KV in the compute dtype, or in f16 for GGUF block weights
    (`block_weights`) on the CPU. On CPU bf16 or f16 pages halve the
    pool's memory and what decode attention reads (it widens them in registers), fp8/int8
    pages quarter it, k8v4 and nvfp4 pages (4-bit codes and their scales) take less still;
    decode attention over 8- and 4-bit pages runs the jnp reference there. The GPU kernels
    widen what they load to the compute dtype, which is exact for bf16, fp8, int8, k8v4 and
    nvfp4 pages under bf16 compute (a 4-bit level times an e4m3 block scale has at most 7
    significant bits); f32 pages there would only double the bytes read, so they are refused
    rather than silently narrowed."""
    compute = default_dtype()
    if name == "auto":
        # GGUF block weights on the CPU round activations as llama.cpp does; their KV goes in
        # llama.cpp's f16 too: half the bytes decode attention reads (189 against 158 tok/s
        # served at one stream, docs/benchmarks.md), golden agreement within the block
        # artifact's spread (docs/numerics.md)
        return jnp.dtype(jnp.float16) if block_weights and not use_kernels() else compute
    if name not in KV_DTYPES:
        raise ValueError(f"--kv-dtype {name} is not supported (choose auto, "
                         f"{', '.join(KV_DTYPES)})")
    dtype = KV_DTYPES[name]
    if use_kernels() and name == "f16":  # the GPU kernels widen pages to bf16, not from f16
        raise ValueError("--kv-dtype f16 is for the CPU (llama.cpp's KV format there); on the "
                         "GPU use auto, bf16, fp8 or int8")
    if isinstance(dtype, paged_attention.KVFormat):  # 8- and 4-bit codes, widened exactly
        return dtype
    if use_kernels() and jnp.dtype(dtype).itemsize > jnp.dtype(compute).itemsize:
        raise ValueError(f"--kv-dtype {name} is not available with the GPU kernels, which "
                         f"compute in {jnp.dtype(compute).name} (use auto, bf16, fp8 or int8)")
    return dtype


def has_quantized_projections(params) -> bool:
    return any(isinstance(leaf, dict) for layer in params["layers"] for leaf in layer.values())


# "all": every bucket (each step runs at the shape nearest its size); "essential": only the
# shapes that can serve any step by padding, for a fast start (tests, a quick try) at the cost
# of padded steps.
STEP_SHAPE_SETS = ("all", "essential")


def row_buckets(max_rows: int, min_rows: int) -> tuple[int, ...]:
    """Row buckets min_rows, 2*min_rows, ... doubling up to max_rows (always included)."""
    return geometric_buckets(min(min_rows, max_rows), max_rows, 2)


def geometric_buckets(smallest: int, largest: int, growth: int) -> tuple[int, ...]:
    """smallest, smallest*growth, ... below largest, then largest itself."""
    sizes, size = [], min(smallest, largest)
    while size < largest:
        sizes.append(size)
        size *= growth
    return tuple(sizes) + (largest,)


def chunk_buckets(prefill_chunk: int, *, growth: int,
                  smallest: int = SMALLEST_CHUNK) -> tuple[int, ...]:
    """Prefill chunk buckets: smallest, smallest*growth, ... up to prefill_chunk. On GPUs
    chunks start at 64 and grow by 4 (compiles are slow; an 8B step reads its weights for
    ~3.4 ms whatever the tokens, so a few hundred padding tokens cost little); on CPU they
    start at 16 and grow by 2, so a 20-token prompt runs as 32 rows."""
    return geometric_buckets(smallest, prefill_chunk, growth)


def chunk_row_buckets(rows: Sequence[int], *, growth: int) -> tuple[int, ...]:
    """The row buckets steps with a chunk use: every `growth`-th size from the smallest, and
    the largest. A chunk's cost dwarfs a few padding rows, so fewer shapes are worth it."""
    picked = [b for i, b in enumerate(rows) if i % growth == 0]
    return tuple(sorted(set(picked) | {rows[-1]}))


def fit_bucket(buckets: Sequence[int], size: int, what: str) -> int:
    for bucket in buckets:
        if bucket >= size:
            return bucket
    raise ValueError(f"{what} {size} exceeds the largest compiled bucket {buckets[-1]}")


def enable_persistent_cache() -> None:
    """Cache every executable, not only slow ones: a server start compiles dozens of steps of
    a few seconds each, and the next start should load them all (when a cache dir is set)."""
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@dataclasses.dataclass(frozen=True)
class _Launched:
    out: jax.Array  # int32 [1 + max_batch] on the device
    plan: StepPlan
    vision: tuple[int, float] = (0, 0.0)  # (items encoded, seconds) for the chunk's sequence


class JaxRunner:
    """Pads step plans to compiled shapes, launches them, collects the sampled tokens."""

    def __init__(self, artifact, *, num_pages: int, page_size: int = 16, max_batch: int,
                 max_context: int, prefill_chunk: int, dtype=None, kv_dtype=None,
                 min_rows: int | None = None, expand_quantized: bool | None = None,
                 background_compile: bool | None = None, compile_threads: int | None = None,
                 greedy_variants: bool | None = None, state_slot_capacity: int | None = None,
                 store_executables: bool | None = None, stable_buffers: bool | None = None,
                 fuse_projections: bool | None = None, max_chunk_rows: int | None = None,
                 step_shapes: str = "all", tensor_parallel: int = 1, vision: bool = False,
                 speculative: bool = False, mtp_drafts: int = 0,
                 dflash_drafts: int = 0, dflash_config=None,
                 expert_parallel: bool = False, penalty_lanes: int | None = None,
                 chunk_segments: int | None = None, segment_tokens: int | None = None):
        if num_pages < 2:
            raise ValueError("num_pages must leave at least one page besides the dummy page")
        if step_shapes not in STEP_SHAPE_SETS:
            raise ValueError(f"step_shapes must be one of {STEP_SHAPE_SETS}, not {step_shapes!r}")
        self.step_shape_set = step_shapes
        enable_persistent_cache()
        self.config = artifact.config
        self.page_size, self.num_pages, self.max_batch = page_size, num_pages, max_batch
        self.max_context = max_context
        # Tokens one sequence adds in a step at most (a chunk, or its verify rows): Gemma's
        # sliding rings are sized by it (model/gemma.py).
        self.step_tokens = step_tokens_of(prefill_chunk, max_batch)
        self.dtype = dtype or default_dtype()
        self.kv_dtype = paged_attention.kv_format(kv_dtype or self.dtype)
        # The sampled tokens' readback starts at launch where they live in device memory
        # (launch() says why); CPU arrays already are host memory.
        self._readback_at_launch = jax.default_backend() != "cpu"
        kernels = use_kernels()
        # Tensor parallelism: None on one device, else a mesh the params and caches are
        # split over (model/tensor_parallel.py); it is a static argument of every step.
        # `expert_parallel`: the routed experts split by expert index over that mesh.
        self.mesh = None
        if tensor_parallel > 1 or expert_parallel:
            self.config.check_tensor_parallel(tensor_parallel, expert_parallel)
            self.mesh = tp.make_mesh(tensor_parallel)
        self.expert_parallel = expert_parallel
        # q|k|v and gate|up joined on the host, before the put (on by default: on the CPU no
        # slower, measured with runner_bench; fused leaves given are kept either way)
        text_params = {k: v for k, v in artifact.params.items() if k != "vision"}
        self.params = place_params(text_params, self.config, self.dtype, self.mesh,
                                   fuse=fuse_projections is None or fuse_projections,
                                   expert_parallel=expert_parallel)
        if expand_quantized is None:  # without the quantized kernels, dense weights are faster
            expand_quantized = not kernels
        if expand_quantized and has_quantized_projections(self.params):
            self.params = steps.expand_quantized(self.params, self.dtype)
        # The pool is allocated on first use (after warm-up compiled the essential shapes:
        # XLA's GPU autotuner needs scratch copies of the largest weights while it compiles,
        # and the pool takes nearly all the memory that is free then).
        self._kv = None
        self._init_state_slots(state_slot_capacity)
        # Speculation on a hybrid family: verify rows of one sequence share its state slot
        # and chain (ragged_batch.chain_depths); dense families need nothing (under a DFlash
        # drafter their rows carry draft-store slots, which find the chains, but no state).
        # (Gemma's sliding rings are position-addressed KV: its verify rows need no chain.)
        self.needs_chained_rows = self.config.has_recurrent_state
        self.chained_rows = self.needs_chained_rows and speculative
        if self.chained_rows and not self.config.is_hybrid:  # Mamba-2 states do not chain
            raise ValueError("speculative decoding on state models is built for Gated "
                             f"DeltaNet only, not for {self.config.architecture}")
        if self.chained_rows and self.mesh is not None:
            raise ValueError("speculative decoding on hybrid models is not built for "
                             "--tensor-parallel")
        # --spec mtp: every step also drafts K tokens after each sample with the artifact's
        # MTP head (model/mtp.py), whose KV is one more cache entry in the same pages.
        self.num_drafts = mtp_drafts
        if mtp_drafts and not (self.chained_rows and "mtp" in self.params):
            raise ValueError("MTP drafts need a hybrid model loaded with its MTP head "
                             "(load_artifact(..., mtp=True)) and speculative=True")
        # --spec dflash / dflash2: the drafter (model/dflash.py) drafts K tokens after each
        # sample in the same step; its draft layers' KV are more cache entries in the pages.
        self.dflash = dflash_config if dflash_drafts else None
        if dflash_drafts:
            dense = self.config.architecture in DENSE_DFLASH_TARGETS
            if mtp_drafts or dflash_config is None or \
                    not (self.chained_rows or (dense and speculative)) or \
                    dflash_config.variant not in self.params:
                raise ValueError("DFlash drafts need a hybrid or dense llama / qwen3 model "
                                 "loaded with the drafter (load_artifact(..., "
                                 "dflash=variant)), its config, and speculative=True")
            if dense and self.mesh is not None:
                raise ValueError("DFlash drafts on a dense model are not built for "
                                 "--tensor-parallel")
            dflash_config.check_target(self.config)
            self.num_drafts = dflash_drafts
            if dense:  # slots that hold the sequences' draft store only (no state)
                self.has_slots = True
                self.state_slot_capacity = state_slot_capacity or max_batch
        self._kv_spec = self._family.cache_shapes(self.config, **self._cache_sizes())
        self._kv_shardings = None
        if self.mesh is not None:  # the caches split on their head axes, per device
            self._kv_shardings = tp.shardings(
                tp.cache_specs(self._kv_spec, tensor_parallel), self.mesh)
            self._kv_spec = jax.tree.map(
                lambda spec, sharding: jax.ShapeDtypeStruct(spec.shape, spec.dtype,
                                                            sharding=sharding),
                self._kv_spec, self._kv_shardings)
        # The host tier's copies (engine/page_store.py); page_bytes sizes its budget.
        self.page_bytes = page_store.page_bytes(self._kv_spec, num_pages)
        # one slot's (0: dense, whose draft-store slots are never saved)
        self.state_bytes = page_store.state_bytes(self._kv_spec) if self.has_state else 0
        self._page_store = page_store.HostPageStore(self.mesh)
        COMPILE_CLOCK.install()  # the step loop counts compiles inside launches
        # The host tier's copy shapes past warm-up's smallest, compiled on a thread and run
        # once while the engine is idle (prime_one) once the engine says its host tier is
        # on (use_host_tier).
        self._unwarmed_copies: list = []
        self._copy_shapes = 0  # how many use_host_tier planned
        self._copy_warm_seconds = 0.0
        self._copy_compile_failed = False
        self.copies_compiled = threading.Event()  # the copy compile thread is done
        self._pinning: threading.Thread | None = None  # use_host_tier's reservation
        if min_rows is None:
            # On the H200 XLA's one-row matrix-vector path for bf16 weights is slower than its
            # two-row matmul (Llama-3-8B shape: 5.60 ms per step at batch 1, 4.46 ms at batch
            # 2; docs/benchmarks.md), so a lone row runs padded with a dummy row there.
            # Quantized projections keep one row: their one-row kernel is built for it. MoE
            # models pad too: a padding row selects no experts of its own (model/moe_mlp.py),
            # and one row measured slower (35B-A3B shape, H200 runs 15-16: 4.88 ms per step
            # with a padding row that still read its own experts, 5.83 ms without it).
            min_rows = 2 if kernels and not has_quantized_projections(self.params) else 1
        self.row_buckets = row_buckets(max_batch, min_rows)
        self.chunk_buckets = (chunk_buckets(prefill_chunk, growth=4, smallest=GPU_SMALLEST_CHUNK)
                              if kernels else chunk_buckets(prefill_chunk, growth=2))
        # Steps with a chunk: GPU row buckets x16 apart (2, 32, 256); on CPU every bucket
        # (there a padding row costs nearly a real one: 8 rows are 2.3x the time of one).
        self.chunk_rows = chunk_row_buckets(
            self.row_buckets, growth=4 if kernels else 1)
        if max_chunk_rows is not None:  # speculation: verify rows widen decode steps only
            cap = fit_bucket(self.row_buckets, min(max_chunk_rows, max_batch), "chunk rows")
            self.chunk_rows = tuple(r for r in self.chunk_rows if r < cap) + (cap,)
        self.max_chunk_rows = self.chunk_rows[-1]
        self.width = math.ceil(max_context / page_size)  # page-table entries per row
        self.background_compile = kernels if background_compile is None else background_compile
        # XLA:CPU (JAX 0.10) has crashed compiling two steps at once: a segmentation fault in
        # backend_compile_and_load on a compile thread, three fresh-clone CI runs of
        # 2026-12-04/05. The CPU compiles one shape at a time; the GPU keeps its threads.
        self.compile_threads = compile_threads or (min(8, os.cpu_count() or 1) if kernels
                                                   else 1)
        # `stable_buffers`: every buffer a step reads or writes keeps its device address
        # from step to step. XLA's command buffer (CUDA graph) records addresses, and any
        # allocation that moved makes the next launch update the graph: 1.0-1.4 ms of host
        # time per launch of the 8B step however few nodes change (H200 run 14). With it the
        # packed inputs are copied into per-shape staging buffers donated back to
        # themselves, `prev_out` is donated and comes back as `out`, and the host reads a
        # copy of `out` made by a tiny executable of its own. Off by default: the graph
        # updates fell from every launch to 1 in 10, yet the step did not get faster
        # (run 16: 212.1 / 1,674 / 9,334 tok/s at 1 / 8 / 64 rows, 214.1 / 1,691 / 9,352
        # without), the two extra small launches costing what the updates did.
        self.stable_buffers = bool(stable_buffers)
        if self.stable_buffers and self.mesh is not None:  # its staging buffers are per device
            raise ValueError("stable_buffers is not built for tensor parallelism")
        self._jitted = jax.jit(steps.packed_step,
                               static_argnames=("config", "page_size", "layout", "draws",
                                                "mesh"),
                               donate_argnames=self._donated(), **self._step_shardings())
        self._staging: dict[tuple[int, int], tuple[jax.Array, jax.Array]] = {}
        self._restage = jax.jit(_overwrite, donate_argnums=(0, 1))
        self._snapshot = jax.jit(_host_copy)
        self._zero = jnp.zeros((), jnp.int32)
        # GPU: every decode-only shape also gets a variant without the draws, which steps
        # whose rows are all greedy use once it has compiled (sampling.sample: the draws'
        # top-k is a sort of the vocabulary there, and the CPU's run-time skip would stall the
        # launch). Chunk steps keep one variant: their chunk dwarfs the sort.
        self.greedy_variants = kernels if greedy_variants is None else greedy_variants
        self._init_vision(artifact, vision, max_batch)
        self._init_segments(chunk_segments, segment_tokens)
        self._copy_slot = jax.jit(copy_state_slot, donate_argnames=("kv",),
                                  **({} if self.mesh is None
                                     else {"out_shardings": self._kv_shardings}))
        self._packer = packed_inputs.HostPacker()
        self._executables: dict[tuple[int, int], object] = {}
        self._greedy_executables: dict[tuple[int, int], object] = {}
        self._media_executables: dict[tuple[int, int], object] = {}
        # (shape, variant) of executables compiled but never run, in compile order (a dict:
        # compile threads add, the engine thread removes; each operation is atomic)
        self._unprimed: dict[tuple[tuple[int, int], str], None] = {}
        self._compile_lock = threading.Lock()
        self._prev_out = self._replicated(np.zeros(self._out_size, np.int32))
        # Presence/frequency penalties (engine/penalty_lanes.py): the output counts of each
        # lane, updated by every step in place (donated). One lane per resident sequence.
        self.penalty_lanes = max_batch if penalty_lanes is None else penalty_lanes
        self.penalty_counts = self._replicated(
            np.zeros((self.penalty_lanes + 1, self.config.vocab_size), np.int32))
        # Token policies the device applies: each lane's automaton (model/token_automaton.py),
        # ~10 KB a lane; rows without one read lane 0's zeros, the identity.
        self.vocab_size = self.config.vocab_size  # what the scheduler compiles policies over
        self.policy_table = self._replicated(
            np.zeros((self.penalty_lanes + 1, token_automaton.ROW_WIDTH), np.int32))
        self._load_lane = jax.jit(_load_lane, donate_argnums=(0, 1),
                                  **({} if self.mesh is None else {
                                      "out_shardings": NamedSharding(self.mesh,
                                                                     PartitionSpec())}))
        self.is_warm = False
        self.compile_done = threading.Event()  # every shape compiled (background included)
        self.on_compiled = None  # called (from any thread) after each shape compiles
        # Executables kept on disk next to JAX's cache: a restart loads them untraced.
        # Not on XLA:CPU by default: an executable it deserialises runs in the process that
        # compiled it but fails in another ("Function multiply_add_fusion not found"), and a
        # CPU restart is cheap anyway (JAX's own cache still applies there).
        if store_executables is None:
            store_executables = jax.default_backend() != "cpu"
        self._store = (ExecutableStore.from_environment(self._fingerprint())
                       if store_executables else None)

    def _init_vision(self, artifact, vision: bool, max_batch: int) -> None:
        """--vision: the tower's params and a second set of step executables that take
        MediaRows (model/multimodal.py), used only by steps that hold media or rows after a
        prompt with media; text steps keep the plain executables."""
        self.accepts_media = vision
        self.max_frame_patches = None  # with vision: vision_rows.MAX_FRAME_PATCHES
        self.vision = None
        if not vision:
            return
        if artifact.vision_config is None or "vision" not in artifact.params:
            raise ValueError("vision needs an artifact loaded with its vision component")
        if self.mesh is not None:
            raise ValueError("the vision tower is not built for tensor parallelism")
        from ninfer_jax.engine.vision_rows import MAX_FRAME_PATCHES, VisionRows

        self.max_frame_patches = MAX_FRAME_PATCHES
        self.vision = VisionRows(steps.cast_params(artifact.params["vision"], self.dtype),
                                 artifact.vision_config, hidden=self.config.hidden_size,
                                 dtype=self.dtype, max_sequences=4 * max_batch,
                                 wait_previous=lambda: self._prev_out.block_until_ready())
        self._media_jitted = jax.jit(steps.packed_media_step,
                                     static_argnames=("config", "page_size", "layout", "draws",
                                                      "mesh"),
                                     donate_argnames=self._donated())

    def _init_segments(self, chunk_segments: int | None, segment_tokens: int | None) -> None:
        """Several sequences' chunks in one step (StepPlan.more_chunks): `chunk_segments` K
        segments of `segment_tokens` tokens each (model/ragged_batch.py), so prompts that
        arrive together prefill together instead of one step each (64 prompts on an H100
        took 64 mixed steps of 60-70 ms, run 41). On by default on GPUs for the text steps
        of the dense families (8 x 256 tokens); the CPU, whose step time grows with its
        tokens anyway, keeps one chunk unless told. K = 1: one chunk per step."""
        family_takes = getattr(self._family, "CHUNK_SEGMENTS", False)
        plain = (family_takes and not self.has_slots and not self.num_drafts
                 and self.vision is None)
        if chunk_segments is None:
            chunk_segments = DEFAULT_CHUNK_SEGMENTS if use_kernels() and plain else 1
        if chunk_segments < 1 or (chunk_segments > 1 and not plain):
            raise ValueError(f"chunk_segments={chunk_segments}: several chunks per step are "
                             "built for the text steps of dense llama / qwen3 models")
        self.chunk_segments = chunk_segments
        largest = self.chunk_buckets[-1]
        self.segment_tokens = fit_bucket(
            self.chunk_buckets, min(segment_tokens or DEFAULT_SEGMENT_TOKENS, largest),
            "segment tokens")

    def _segment_shapes(self, rows_buckets) -> list[tuple[int, int, int]]:
        """(chunk tokens, rows, segments) of the steps with several chunks."""
        if self.chunk_segments == 1:
            return []
        K = self.chunk_segments
        return [(K * self.segment_tokens, rows, K) for rows in rows_buckets]

    def step_hlo(self, shape: tuple[int, int], variant: str = "draws") -> str | None:
        """The optimized HLO text of a compiled step (`variant` "draws", "greedy" or "media"),
        or None when that executable is not compiled or cannot print itself (benchmarks
        attribute a trace's kernels to source lines: benchmarks/trace_summary.py)."""
        executable = self._variant_executables(variant).get(shape)
        try:
            return executable.as_text() if executable is not None else None
        except Exception:  # noqa: BLE001 - a deserialised executable may not have its text
            return None

    def _variant_executables(self, variant: str) -> dict:
        return {"draws": self._executables, "greedy": self._greedy_executables,
                "media": self._media_executables}[variant]

    def _media_shapes(self, shapes) -> list[tuple[int, int]]:
        return list(shapes) if self.vision is not None else []

    # the pre-v2 names, still read by tests and tools
    @property
    def batch_buckets(self) -> tuple[int, ...]:
        return self.row_buckets

    def _init_state_slots(self, capacity: int | None) -> None:
        """Hybrid families: one state slot per lane unless told (the engine passes
        --max-concurrency + --device-state-slots); dense ones have none, except under a
        DFlash drafter, whose draft store (model/dflash.py) is per slot: `slots_hold_state`
        False then, the slots hold that store only (one per lane unless told)."""
        self.has_state = self.config.has_state
        self.has_slots = self.has_state  # steps carry state slots (set again for DFlash)
        self.slots_hold_state = self.has_state  # the engine's StateSlotPool(holds_state=)
        if not self.has_state:
            capacity = 0
        self.state_slot_capacity = self.max_batch if capacity is None else capacity
        self._family = steps.FAMILIES[self.config.architecture]

    def _cache_sizes(self) -> dict:
        """The keyword arguments of the family's init_caches / cache_shapes."""
        slots = self.state_slot_capacity + 1 if self.has_slots else 0  # + the dummy slot
        return dict(num_pages=self.num_pages, page_size=self.page_size, num_state_slots=slots,
                    **({"step_tokens": self.step_tokens} if self.config.has_sliding_rings
                       else {}),
                    **self._draft_sizes(),
                    dtype=self.dtype, kv_dtype=self.kv_dtype)

    def _draft_sizes(self) -> dict:
        if not self.num_drafts:
            return {}
        if self.dflash is None:
            return {"mtp_drafts": self.num_drafts}
        return {"dflash_drafts": self.num_drafts, "dflash_config": self.dflash}

    @property
    def kv(self):
        """The family's cache list (per layer the (k, v) pages, or a state dict); allocated
        (zeros) on first use, each device holding only its heads' part under a mesh."""
        if self._kv is None:
            init = functools.partial(self._family.init_caches, self.config,
                                     **self._cache_sizes())
            self._kv = (init() if self.mesh is None
                        else jax.jit(init, out_shardings=self._kv_shardings)())
        return self._kv

    @kv.setter
    def kv(self, value) -> None:
        self._kv = value

    def _placed(self, kv):
        """Caches from a host-tier copy back in the mesh's layout (the compiled step takes
        no other); unchanged on one device."""
        return kv if self.mesh is None else jax.device_put(kv, self._kv_shardings)

    # ------------------------------------------------------------------ tensor parallelism

    @property
    def tensor_parallel(self) -> int:
        return tp.num_groups(self.mesh)

    def mesh_description(self) -> dict:
        """The mesh for /metrics and the request log: axis size and device names."""
        devices = self.mesh.devices.tolist() if self.mesh is not None else jax.devices()[:1]
        return {"tensor_parallel": self.tensor_parallel, "axis": tp.AXIS,
                "expert_parallel": self.expert_parallel,
                "devices": [str(device) for device in devices]}

    def _donated(self) -> tuple[str, ...]:
        """The step's donated arguments: the caches and the penalty counts, updated in
        place; with stable buffers the previous output too."""
        lanes = ("kv", "counts", "policy")
        return (*lanes, "prev_out") if self.stable_buffers else lanes

    def _step_shardings(self) -> dict:
        """jit's out shardings of the step under a mesh: the sampled tokens and the penalty
        counts replicated, the caches as placed. (The inputs' shardings are those of the
        lowering's arguments: jit takes no in_shardings with keyword arguments.)"""
        if self.mesh is None:
            return {}
        replicated = NamedSharding(self.mesh, PartitionSpec())
        return {"out_shardings": (replicated, self._kv_shardings, replicated, replicated)}

    def _abstract(self, array):
        """A lowering argument: the array itself, or under a mesh its replicated shape."""
        if self.mesh is None:
            return array
        return jax.ShapeDtypeStruct(array.shape, array.dtype,
                                    sharding=NamedSharding(self.mesh, PartitionSpec()))

    def _replicated(self, array: np.ndarray):
        """A host array on the device, or on every device of the mesh."""
        if self.mesh is None:
            return jnp.asarray(array)
        return jax.device_put(array, NamedSharding(self.mesh, PartitionSpec()))

    # ------------------------------------------------------------------ shapes and compiling

    def step_shapes(self) -> list[tuple[int, int]]:
        """Every (chunk tokens, rows) shape the runner compiles: decode-only steps at every
        row bucket, chunk steps at the sparser chunk row buckets (only the essential ones
        with step_shapes="essential")."""
        if self.step_shape_set == "essential":
            return self.essential_shapes()
        shapes = [(0, rows) for rows in self.row_buckets]
        shapes += [(chunk, rows) for chunk in self.chunk_buckets for rows in self.chunk_rows]
        return shapes + self._segment_shapes(self.chunk_rows)

    def essential_shapes(self) -> list[tuple[int, int]]:
        """The shapes that can serve any step between them (by padding), compiled first.
        With chunk segments, steps of several chunks have (chunk tokens, rows, segments)
        shapes; the one with the most rows is essential."""
        largest = (self.chunk_buckets[-1], self.chunk_rows[-1])
        return list(dict.fromkeys([(0, self.row_buckets[0]), (0, self.row_buckets[-1]),
                                   largest, *self._segment_shapes(self.chunk_rows[-1:])]))

    @property
    def compiled_shapes(self) -> set[tuple[int, int]]:
        return set(self._executables)

    def greedy_shapes(self) -> list[tuple[int, int]]:
        """The shapes that also get a variant without the draws."""
        return ([shape for shape in self.step_shapes() if shape[0] == 0]
                if self.greedy_variants else [])

    def compile_progress(self) -> tuple[int, int]:
        """(executables ready, executables planned), for /health and the logs: every step
        shape plus the greedy variants and, with the host tier on, its copy shapes
        (use_host_tier); ready means compiled and run once (prime_one), so none of them
        would stall a request with its first-run set-up or a compile."""
        compiled = (len(self._executables) + len(self._greedy_executables)
                    + len(self._media_executables))
        shapes = self.step_shapes()
        return (compiled - len(self._unprimed) + self._copy_shapes - len(self._unwarmed_copies),
                len(shapes) + len(self.greedy_shapes()) + len(self._media_shapes(shapes))
                + self._copy_shapes)

    def warmup(self) -> None:
        """Compile the essential shapes (in parallel), run each once on padding inputs (they
        only write the dummy page: an executable's first run pays a one-time set-up, 0.3-0.4 s
        per shape on CPU, that would otherwise land on a request), then compile the rest:
        now, or in a background thread when `background_compile`."""
        started = time.perf_counter()
        essential = self.essential_shapes()
        # Decode shapes first: a decode step padded to a far larger row bucket costs the most.
        rest = [shape for shape in self.step_shapes() if shape not in essential]
        if not self.background_compile:
            essential, rest = essential + rest, []
        greedy = self.greedy_shapes()
        self._compile_all(essential)
        compiled = time.perf_counter()
        for shape in essential:
            self._run_padding(self._executables[shape], shape)
        for shape in self._media_shapes(essential):
            self._run_padding(self._media_executables[shape], shape, media=True)
        if self.vision is not None:  # "essential": the smallest encode bucket only
            self.vision.warm(every_bucket=self.step_shape_set == "all")
        self.kv = self._placed(self._page_store.warm(self.kv))  # the host tier's first copies
        if self.has_state:  # compiled now: the first prefix hit must not wait for it
            dummy = np.int32(DUMMY_STATE_SLOT)  # the argument types launch() passes
            self.kv = self._copy_slot(self.kv, dummy, dummy)
        # compiled now too: the first penalised request must not wait for it
        self.load_penalty_lane(sampling.DUMMY_PENALTY_LANE, ())
        jax.block_until_ready(self.kv)
        self._wait_pinned()
        for shape in essential:
            self._unprimed.pop((shape, "draws"), None)
            self._unprimed.pop((shape, "media"), None)
        self.is_warm = True
        log.info("compiled %d step shapes in %.1f s, first runs %.1f s%s", len(essential),
                 compiled - started, time.perf_counter() - compiled,
                 f"; {len(rest) + len(greedy)} more compile in the background"
                 if rest or greedy else "")
        if not rest and not greedy:
            self.compile_done.set()
            return
        threading.Thread(target=self._compile_rest, args=(rest, greedy), name="ninfer-compile",
                         daemon=True).start()

    def use_host_tier(self, num_slots: int = 0) -> None:
        """The engine's host tier is on, `num_slots` pages big: on a GPU its pinned host
        memory is taken on a thread beside warm-up (HostPageStore.reserve_pinned; warmup()
        waits for it); every save and load run length
        (and a state snapshot's copy) compiles on a thread of its own once the step shapes
        have, and runs once on the engine thread while it is idle (prime_one). (Compiled
        there, run 44's 8B server spent 27-31 s of its first idle time in them, a request
        that came then waiting up to a compile.) Under a mesh they compile in that first
        run instead."""
        self._wait_pinned()  # a runner serving a later engine: one reservation at a time
        nbytes = num_slots * self.page_bytes
        if self._page_store.pins_host and nbytes > 0:
            # Run 45's restart spent 4.4 s of its 20.05 s here, before warm-up's 2.9 s.
            self._pinning = threading.Thread(target=self._reserve_pinned, args=(nbytes,),
                                             name="ninfer-pin", daemon=True)
            self._pinning.start()
        self._unwarmed_copies = list(self._page_store.run_sizes[1:])  # warm-up: the first
        if self.has_state:
            self._unwarmed_copies.append("state")
        self._copy_shapes = len(self._unwarmed_copies)
        # (a runner serving a later engine compiled them already)
        pending = [item for item in self._unwarmed_copies
                   if not self._page_store.is_compiled(item)]
        if self.mesh is not None or not pending:
            self.copies_compiled.set()
        else:
            self.copies_compiled.clear()
            threading.Thread(target=self._compile_copies, args=(pending,),
                             name="ninfer-copy-compile", daemon=True).start()

    def _reserve_pinned(self, nbytes: int) -> None:
        try:
            seconds = self._page_store.reserve_pinned(nbytes)
        except Exception:  # noqa: BLE001 - the tier still serves; its saves grow the pool
            log.exception("host tier: taking pinned host memory failed")
            return
        log.info("host tier: %.2f GiB of pinned host memory taken in %.1f s (beside warm-up)",
                 nbytes / 2**30, seconds)

    def _wait_pinned(self) -> None:
        if self._pinning is not None:
            self._pinning.join()
            self._pinning = None

    def _compile_copies(self, items) -> None:
        self.compile_done.wait()  # the step shapes first: they serve requests
        started = time.perf_counter()
        try:
            for item in items:
                self._page_store.compile_run(self._kv_spec, item)
                if self.on_compiled is not None:
                    self.on_compiled()
        except Exception:  # noqa: BLE001 - the engine thread compiles what is left
            log.exception("host tier copy compile failed; the first runs compile instead")
            self._copy_compile_failed = True
            if self.on_compiled is not None:
                self.on_compiled()
            return
        finally:
            self.copies_compiled.set()
        log.info("host tier: %d copy shapes compiled in the background in %.1f s",
                 len(items), time.perf_counter() - started)

    def _warm_one_copy(self) -> bool:
        """Run the next host-tier copy shape once; with the compile thread on, only one it
        has compiled (False while it is still compiling: its on_compiled wakes the engine)."""
        ready = [item for item in self._unwarmed_copies
                 if self.mesh is not None or self._copy_compile_failed
                 or self._page_store.is_compiled(item)]
        if not ready:
            return False
        started = time.perf_counter()
        item = ready[0]
        self._unwarmed_copies.remove(item)
        if item == "state":
            self.kv = self._placed(self._page_store.warm_state(self.kv, DUMMY_STATE_SLOT))
        else:
            self.kv = self._placed(self._page_store.warm(self.kv, item))
        jax.block_until_ready(self.kv)
        self._copy_warm_seconds += time.perf_counter() - started
        if not self._unwarmed_copies:
            log.info("host tier: %d more copy shapes ready (run once while idle: %.1f s)",
                     self._copy_shapes, self._copy_warm_seconds)
        return True

    def prime_one(self) -> bool:
        """Run one executable that compiled in the background but never ran, on padding
        inputs (they write the dummy page only; the previous step's output is kept). Its
        first run pays a one-time set-up, on the GPU CUDA graph instantiation and module
        loading (run 12: 0.36-0.49 s stalls of every stream when a load level first used a
        shape), which would otherwise land on a request. Then, one at a time, the host tier's
        copy shapes (use_host_tier). Engine thread, no step in flight."""
        key = next(iter(self._unprimed), None)
        if key is None:
            return self._warm_one_copy()
        shape, variant = key
        self._unprimed.pop(key, None)
        self._run_padding(self._variant_executables(variant)[shape], shape,
                          media=variant == "media")
        jax.block_until_ready(self.kv)
        return True

    def _run_padding(self, executable, shape, media: bool = False) -> None:
        ints, floats = self._example_inputs(*shape)
        if self.stable_buffers:
            ints, floats = self._staged(shape, ints, floats)
        extra = (self.vision.example_rows(*shape),) if media else ()
        # The previous step's output is kept: a padding run's own rows are all padding
        # (on the dummy penalty lane, which they leave at zero).
        out, self.kv, self.penalty_counts, self.policy_table = executable(
            self.params, self.kv, self._prev_out, ints, floats, self.penalty_counts,
            self.policy_table, *extra)
        if self.stable_buffers:  # prev_out was donated: `out` is its buffer, same values
            self._prev_out = out

    def _prev_out_spec(self) -> jax.ShapeDtypeStruct:
        # Abstract: the engine thread may donate the real one while a compile thread traces.
        return self._abstract(jax.ShapeDtypeStruct((self._out_size,), jnp.int32))

    @property
    def _out_size(self) -> int:
        """A step's output: chunk_segments + max_batch samples, then K drafts after each
        (steps.py)."""
        return (self.chunk_segments + self.max_batch) * (1 + self.num_drafts)

    def _staged(self, shape, ints: np.ndarray, floats: np.ndarray):
        """The shape's staging buffers, now holding `ints` and `floats` (same addresses as
        at the previous launch of this shape)."""
        staged = self._staging.get(shape)
        if staged is None:
            staged = (jnp.zeros(ints.shape, ints.dtype), jnp.zeros(floats.shape, floats.dtype))
        staged = self._restage(*staged, ints, floats)
        self._staging[shape] = staged
        return staged

    def _compile_rest(self, shapes, greedy_shapes=()) -> None:
        """BACKGROUND_COMPILE_THREADS shapes at a time: with the pool allocated, the memory
        left over is sized for that many compiles' autotuning scratch. The greedy variants
        come last: until they exist, greedy steps run the shapes with draws (same tokens)."""
        started = time.perf_counter()
        try:
            failed = self._compile_all(
                shapes, greedy_shapes, keep_going=True,
                threads=min(BACKGROUND_COMPILE_THREADS, self.compile_threads))
            # Once more, alone: run 47's cold 8B server lost a shape for good to XLA's
            # autotuner finding its red zones written while another compile autotuned beside
            # it; the restart compiled the same shape without a fault.
            for job in failed:
                try:
                    self._compile(*job)
                except Exception:  # the essential shapes still serve every step
                    log.exception("step shape %s (%s) failed to compile twice; steps that "
                                  "need it run padded in a larger compiled shape", *job)
            log.info("background compile: %d more step shapes in %.1f s",
                     len(shapes) + len(greedy_shapes), time.perf_counter() - started)
        except Exception:  # the essential shapes still serve every step
            log.exception("background compile failed; steps keep using the compiled shapes")
        finally:
            self.compile_done.set()

    def compile_shapes(self, shapes, media_shapes=None) -> None:
        """Compile these (chunk, rows) shapes now, in parallel, with the greedy variants of
        the decode-only ones (where the runner has greedy variants, even for a shape the
        step-shape plan leaves out: a benchmark pinning a shape times what a served greedy
        step runs) and, with vision, the media variants of `media_shapes` (default: all of
        them) (benchmarks pin exact shapes)."""
        shapes = list(shapes)
        greedy = [shape for shape in shapes if shape[0] == 0] if self.greedy_variants else []
        self._compile_all(shapes, greedy, media_shapes=media_shapes)

    def _compile_all(self, shapes, greedy_shapes=(), threads: int | None = None,
                     media_shapes=None, keep_going: bool = False) -> list:
        """Compile the shapes, then the greedy variants of `greedy_shapes` and the media
        variants of `media_shapes` (default: `shapes`, with vision), `threads` at a time
        (default: compile_threads). The first failure raises, or with `keep_going` is
        logged and the rest still compile: the (shape, variant) jobs that failed."""
        media = self._media_shapes(shapes if media_shapes is None else media_shapes)
        jobs = ([(shape, "draws") for shape in shapes] + [(s, "greedy") for s in greedy_shapes]
                + [(s, "media") for s in media])
        threads = threads or self.compile_threads
        failed = []

        def outcome(job, run) -> None:
            try:
                run()
            except Exception as error:
                if not keep_going:
                    raise
                log.warning("step shape %s (%s) failed to compile: %s", *job,
                            str(error).splitlines()[0] if str(error) else type(error).__name__)
                failed.append(job)

        if len(jobs) <= 1 or threads <= 1:
            for job in jobs:
                outcome(job, functools.partial(self._compile, *job))
            return failed
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            futures = [(job, pool.submit(self._compile, *job)) for job in jobs]
            for job, future in futures:
                outcome(job, future.result)
        return failed

    def _fingerprint(self) -> dict:
        """What a stored executable depends on besides the traced source (executable_store)."""
        leaves = jax.tree_util.tree_flatten_with_path(self.params)[0]
        device = jax.devices()[0]
        return {"jax": jax.__version__, "backend": jax.default_backend(),
                "device": getattr(device, "device_kind", str(device)),
                "xla_flags": os.environ.get("XLA_FLAGS", ""), "kernels": use_kernels(),
                "config": self.config.to_dict(), "dtype": jnp.dtype(self.dtype).name,
                "params": [(jax.tree_util.keystr(path), leaf.shape, str(leaf.dtype))
                           for path, leaf in leaves],
                "kv": sorted({(s.shape, str(s.dtype))
                              for s in jax.tree_util.tree_leaves(self._kv_spec)}),
                "num_layers": len(self._kv_spec), "page_size": self.page_size,
                "width": self.width, "max_batch": self.max_batch,
                "chunk_segments": self.chunk_segments,
                "stable_buffers": self.stable_buffers, "tensor_parallel": self.tensor_parallel,
                "vision": self.vision.config.to_dict() if self.vision is not None else None,
                "expert_parallel": self.expert_parallel,
                **({"state_slots": self.state_slot_capacity,
                    "chained_rows": self.chained_rows, "mtp_drafts": self.num_drafts,
                    "dflash": self.dflash.to_dict() if self.dflash is not None else None,
                    "draft_head": "draft_head" in self.params}
                   if self.has_slots else {})}

    def _compile(self, shape: tuple[int, int], variant: str = "draws") -> None:
        """Compile one shape's executable: "draws" (the full sampler), "greedy" (no draws)
        or "media" (the full sampler plus MediaRows, --vision only)."""
        executables = self._variant_executables(variant)
        if shape in executables:
            return
        key = shape if variant == "draws" else (*shape, variant)
        stored = self._store.load(key) if self._store is not None else None
        if stored is not None:
            executables[shape] = stored
            self._unprimed[(shape, variant)] = None
            if self.on_compiled is not None:
                self.on_compiled()
            return
        example = self._example_inputs(*shape)
        jitted, extra = self._jitted, ()
        if variant == "media":  # MediaRows come last, after the lanes (packed_media_step)
            jitted, extra = self._media_jitted, (self.vision.example_rows(*shape),)
        with self._compile_lock:  # tracing holds the GIL anyway; XLA compiles in parallel
            # Abstract caches: the engine thread donates the real ones while this traces.
            lowered = jitted.lower(self.params, self._kv_spec, self._prev_out_spec(),
                                   *map(self._abstract, example), self._counts_spec(),
                                   self._policy_spec(), *map(self._abstract, extra),
                                   config=self.config, page_size=self.page_size,
                                   layout=self._layout(*shape), draws=variant != "greedy",
                                   mesh=self.mesh)
        compiled = lowered.compile()
        executables[shape] = compiled
        self._unprimed[(shape, variant)] = None
        if self._store is not None:
            self._store.save(key, compiled)
        if self.on_compiled is not None:
            self.on_compiled()

    def _shape_for(self, num_chunk: int, num_rows: int,
                   variant: str = "draws", num_chunks: int = 1) -> tuple[int, ...]:
        """The cheapest compiled shape holding the step (fewest padded tokens); a step of
        several chunks (`num_chunks`, each at most segment_tokens) takes a segment shape."""
        rows = fit_bucket(self.row_buckets, num_rows, "row count")
        executables = self._variant_executables(variant)
        if num_chunks > 1:
            if num_chunks > self.chunk_segments:
                raise ValueError(f"{num_chunks} chunks in a step (at most "
                                 f"{self.chunk_segments})")
            fitting = [s for s in list(executables) if len(s) == 3 and s[1] >= rows]
            if fitting:
                return min(fitting, key=lambda s: s[1])
            shape = self._segment_shapes([fit_bucket(self.chunk_rows, num_rows, "row count")])[0]
            log.warning("compiling step shape %s after warm-up", shape)
            self._compile(shape, variant)
            return shape
        chunk = 0 if num_chunk == 0 else fit_bucket(self.chunk_buckets, num_chunk,
                                                    "prefill chunk")
        if (chunk, rows) in executables:
            return chunk, rows
        fitting = [s for s in list(executables) if len(s) == 2 and s[0] >= chunk
                   and s[1] >= rows and (chunk == 0 or s[0] > 0)]
        if not fitting:
            if self.is_warm:
                log.warning("compiling %s step shape %s after warm-up", variant, (chunk, rows))
            shape = (chunk, rows) if num_chunk else (0, rows)
            self._compile(shape, variant)
            return shape
        return min(fitting, key=lambda s: (s[0] + s[1], s))

    def _layout(self, chunk: int, rows: int, segments: int = 1) -> packed_inputs.PackedLayout:
        return packed_inputs.PackedLayout(chunk=chunk, rows=rows, width=self.width,
                                          segments=segments, chunk_slots=self.chunk_segments,
                                          state_slots=self.has_slots,
                                          chained_rows=self.chained_rows,
                                          mtp_drafts=self.num_drafts * (self.dflash is None),
                                          dflash_drafts=self.num_drafts * (self.dflash
                                                                           is not None),
                                          dflash=self.dflash)

    def _example_inputs(self, chunk: int, rows: int, segments: int = 1):
        layout = self._layout(chunk, rows, segments)
        return np.zeros(layout.num_ints, np.int32), np.zeros(layout.num_floats, np.float32)

    def _counts_spec(self) -> jax.ShapeDtypeStruct:
        # Abstract, as the caches: the engine thread donates the real ones while this traces.
        return self._abstract(jax.ShapeDtypeStruct(self.penalty_counts.shape, jnp.int32))

    def _policy_spec(self) -> jax.ShapeDtypeStruct:
        return self._abstract(jax.ShapeDtypeStruct(self.policy_table.shape, jnp.int32))

    def load_penalty_lane(self, lane: int, output_ids, policy=None) -> None:
        """Set a lane to the counts of a committed output and to the token-policy automaton
        row `policy` (None: the identity), after every step launched so far (the device
        runs them in order)."""
        counts = sampling.output_counts(output_ids, self.config.vocab_size)
        row = (np.zeros(token_automaton.ROW_WIDTH, np.int32) if policy is None
               else np.asarray(policy, np.int32))
        self.penalty_counts, self.policy_table = self._load_lane(
            self.penalty_counts, self.policy_table, np.int32(lane), counts, row)

    # ------------------------------------------------------------------ steps

    def clear_host_pages(self) -> None:
        self._page_store.clear()

    def launch(self, plan: StepPlan) -> _Launched:
        rows = plan.rows
        if len(rows) > self.max_batch:
            raise ValueError(f"step of {len(rows)} rows (max {self.max_batch})")
        unit, units = plan.chunk, plan.chunks
        # Steps with media rows, or rows after a prompt with media (their MRoPE positions
        # are offset), run the media executables; text steps never pay for them.
        media = self.vision is not None and (
            (unit is not None and unit.media is not None) or any(r.rope_delta for r in rows))
        variant = "media" if media else "draws"
        if len(units) > 1 and any(len(u.tokens) > self.segment_tokens for u in units):
            raise ValueError(f"a step of {len(units)} chunks has one over "
                             f"{self.segment_tokens} tokens")
        shape = self._shape_for(len(unit.tokens) if unit is not None else 0, max(1, len(rows)),
                                variant, num_chunks=len(units))
        layout = self._layout(*shape)
        chunk_specs = [u.sample for u in units] or [None]
        chunk_specs += [None] * (layout.sampled - layout.rows - len(chunk_specs))
        specs = chunk_specs + [row.sample for row in rows]
        ints, floats = self._packer.pack(layout, self._host_batch(units, rows, *shape), specs)
        executable = self._variant_executables(variant)[shape]
        extra, encoded = (), (0, 0.0)
        if media:
            extra = (self.vision.step_rows(unit, rows, *shape),)
            encoded = self.vision.last_encode
        if not media and self.greedy_variants and all(
                s is None or s.params.is_greedy for s in specs):
            greedy = self._greedy_executables.get(shape)
            if greedy is not None:
                executable, variant = greedy, "greedy"
        if plan.page_copies:  # host tier saves and loads, in order, before the step
            self.kv = self._placed(self._page_store.apply(self.kv, plan.page_copies))
        for copy in plan.state_copies:  # in order, before the step (checkpoints, snapshots)
            if isinstance(copy, StateCopy):
                self.kv = self._placed(self._page_store.apply_state(self.kv, copy))
            else:
                self.kv = self._copy_slot(self.kv, np.int32(copy[0]), np.int32(copy[1]))
        for load in plan.penalty_loads:  # applied even if the step is not: see StepPlan
            self.load_penalty_lane(load.lane, load.output_ids, load.policy)
        failures = self._page_store.take_failures()
        if failures is not None:  # the scheduler drops what relied on them, then re-plans
            raise PageCopyError(*failures)
        self._unprimed.pop((shape, variant), None)  # this is its first run if it never ran
        if self.stable_buffers:
            ints, floats = self._staged(shape, ints, floats)
        out, self.kv, self.penalty_counts, self.policy_table = executable(
            self.params, self.kv, self._prev_out, ints, floats, self.penalty_counts,
            self.policy_table, *extra)
        self._prev_out = out
        # With stable buffers `out` is donated to the next step, so the host reads a copy.
        host_view = self._snapshot(out, self._zero) if self.stable_buffers else out
        # Start the sampled tokens' copy to the host now, behind this step only: collect()
        # runs after the next step is launched, and a read enqueued then could wait for it
        # (run 49, H200: program_post 3.9 ms a round at 256 rows, 0.9 at 64; not yet
        # measured with this).
        if self._readback_at_launch:
            host_view.copy_to_host_async()
        return _Launched(out=host_view, plan=plan, vision=encoded)

    def wait(self, launched: _Launched) -> None:
        launched.out.block_until_ready()

    def collect(self, launched: _Launched) -> StepResult:
        host = np.asarray(launched.out)
        plan = launched.plan
        num_rows, first_row = len(plan.rows), self.chunk_segments
        sampled = host[:first_row + num_rows]  # chunk k's sample at k, row i's at S + i
        flagged = sampled & token_automaton.FORCED_BIT != 0
        tokens = sampled & token_automaton.TOKEN_MASK
        chunk_tokens = [int(tokens[k]) if unit.sample is not None else None
                        for k, unit in enumerate(plan.chunks)] or [None]
        row_flags = flagged[first_row:]
        drafts = {}
        if self.num_drafts:  # chunk_segments is 1 with drafts
            after = host[first_row + self.max_batch:].reshape(first_row + self.max_batch,
                                                             self.num_drafts)
            drafts = dict(chunk_draft=after[0].astype(np.int32),
                          row_drafts=after[first_row:first_row + num_rows].astype(np.int32))
        return StepResult(chunk_token=chunk_tokens[0],
                          row_tokens=tokens[first_row:].astype(np.int32),
                          chunk_forced=bool(flagged[0]),
                          row_forced=row_flags if row_flags.any() else None,
                          vision_items=launched.vision[0], vision_seconds=launched.vision[1],
                          more_chunk_tokens=tuple(chunk_tokens[1:]),
                          more_chunk_forced=tuple(bool(f) for f in
                                                  flagged[1:len(plan.chunks)]),
                          **drafts)

    def _host_batch(self, units: Sequence[PrefillUnit], rows: Sequence[DecodeRow], chunk: int,
                    num_rows: int, segments: int = 1) -> dict:
        """The RaggedBatch fields of a step, as numpy arrays by field name: its chunks as
        `segments` segments of chunk / segments tokens (one chunk: the plain fields)."""
        unit = units[0] if units else None
        chunk_tokens = np.zeros(chunk, np.int32)
        chunk_table = np.full((segments, self.width), paged_attention.DUMMY_PAGE, np.int32)
        # a padding chunk (segment) writes and reads the dummy page only
        start, length = np.zeros(segments, np.int32), np.ones(segments, np.int32)
        span = chunk // segments
        for k, each in enumerate(units):
            num = len(each.tokens)
            if num < 1 or each.start + num > self.max_context:
                raise ValueError(f"prefill of {num} tokens at {each.start} exceeds the context")
            _check_covers(each.page_table, each.start + num, self.page_size)
            start[k], length[k] = each.start, num
            chunk_tokens[k * span:k * span + num] = each.tokens
            chunk_table[k, :len(each.page_table)] = each.page_table
        tokens, positions = np.zeros(num_rows, np.int32), np.zeros(num_rows, np.int32)
        sources = np.full(num_rows, -1, np.int32)
        # Padding rows: position 0 in an all-dummy page table, so they write the dummy page.
        tables = np.full((num_rows, self.width), paged_attention.DUMMY_PAGE, np.int32)
        if rows:  # whole columns at once: this runs for every row of every step
            num = len(rows)
            positions[:num] = [row.position for row in rows]
            if positions[:num].max() >= self.max_context:
                raise ValueError(f"decode position {positions[:num].max()} exceeds the context")
            for i, row in enumerate(rows):
                if len(row.page_table) * self.page_size <= row.position:
                    _check_covers(row.page_table, row.position + 1, self.page_size)
                tables[i, :len(row.page_table)] = row.page_table
            previous = [row.from_previous for row in rows]
            tokens[:num] = [row.token if p is None else 0 for row, p in zip(rows, previous)]
            # the previous step's output: chunk k's sample at k, row i's at S + i
            first_row = self.chunk_segments
            sources[:num] = [-1 if p is None else chunk_index(p) if p < 0 else first_row + p
                             for p in previous]
        fields = dict(chunk_tokens=chunk_tokens, chunk_start=start, chunk_len=length,
                      chunk_table=chunk_table, row_tokens=tokens, row_src=sources,
                      row_positions=positions, row_tables=tables)
        if self.has_slots:
            fields.update(_state_fields(unit, rows, num_rows, self.state_slot_capacity))
        if self.num_drafts and self.dflash is None:
            next_token = unit.next_token if unit is not None else None
            fields["chunk_next"] = -1 if next_token is None else next_token
        return fields

    # ------------------------------------------------------------------ one step, synchronously

    def prefill(self, unit: PrefillUnit) -> int | None:
        """One chunk alone, waited for (tests and tools); its sample when it asks for one."""
        return self.collect(self.launch(StepPlan(chunk=unit))).chunk_token

    def decode(self, rows: Sequence[DecodeRow]) -> np.ndarray:
        """One step of decode rows alone, waited for (tests and tools)."""
        if not 1 <= len(rows) <= self.max_batch:
            raise ValueError(f"decode batch of {len(rows)} rows (max {self.max_batch})")
        return self.collect(self.launch(StepPlan(chunk=None, rows=tuple(rows)))).row_tokens


def place_params(params, config, dtype, mesh=None, *, fuse: bool = True,
                 expert_parallel: bool = False):
    """The params on the device(s) in the compute dtype, q|k|v and gate|up fused (`fuse`).
    One device: fused on the host, one device_put (steps.cast_params), then int8 / fp8 codes
    transposed on the device when W8A8 runs at every row count (kernels/quant_matmul/w8a8.py;
    tensor parallelism splits the stored [K, N] leaves and keeps them). A mesh: split as
    model/tensor_parallel.py says (`expert_parallel`: the routed experts by expert index); a
    host (numpy) tree is fused and cast on the host and each device receives only its
    shards; a tree already on the mesh (restored into its shards by the artifact loader) is
    fused and cast there one layer at a time, each layer's parts donated so the device never
    holds both layouts of more than one layer."""
    if mesh is None:
        if fuse:
            params = fused_projections.fuse_projections(params, config)
        params = steps.cast_params(params, dtype)
        if quant_matmul.w8a8_transposes_at_load():  # int8 / fp8 codes as [N, K] for W8A8
            params = quant_w8a8.transpose_leaves(params)
        return params
    tp.check_plain(params)
    size = tp.num_groups(mesh)
    if config.num_experts:
        log.info("tensor parallel: the routed experts are %s", f"split by expert index, "
                 f"{config.num_experts // size} per device" if expert_parallel else
                 f"replicated on each of the {size} devices (--expert-parallel splits them)")
    cast = functools.partial(_cast_floats, dtype=dtype)

    def prepare(tree):  # a whole tree or one layer dict
        if fuse and config.architecture in fused_projections.DENSE_ARCHITECTURES:
            tree = (fused_projections.fuse_layer(tree, size) if "layers" not in tree
                    else fused_projections.fuse_projections(tree, config, size))
        if config.is_hybrid:  # GDN channels per shard
            tree = (tp.group_deltanet_layer(tree, config, size) if "layers" not in tree
                    else {**tree, "layers": [tp.group_deltanet_layer(layer, config, size)
                                             for layer in tree["layers"]]})
        if expert_parallel:
            tree = (tp.split_experts(tree) if "layers" not in tree
                    else {**tree, "layers": [tp.split_experts(layer)
                                             for layer in tree["layers"]]})
        return jax.tree.map(cast, tree)

    def target(tree):
        return tp.shardings(tp.param_specs(jax.eval_shape(prepare, tree), size), mesh)

    if not any(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(params)):
        return jax.device_put(prepare(params), target(params))
    layers = [jax.jit(prepare, out_shardings=target(layer), donate_argnums=0)(layer)
              for layer in params["layers"]]
    rest = {key: value for key, value in params.items() if key != "layers"}
    return {**jax.jit(prepare, out_shardings=target(rest))(rest), "layers": layers}


def _cast_floats(leaf, dtype):
    """A floating-point leaf in the compute dtype (host or device); others as stored."""
    if not jnp.issubdtype(leaf.dtype, jnp.floating) or leaf.dtype == dtype:
        return leaf
    return leaf.astype(dtype)


def _overwrite(ints_buffer, floats_buffer, ints, floats):
    """The staging buffers (donated) overwritten with this launch's packed inputs: the
    outputs alias the donated inputs, so the addresses stay."""
    return (jax.lax.dynamic_update_slice(ints_buffer, ints, (0,)),
            jax.lax.dynamic_update_slice(floats_buffer, floats, (0,)))


def _load_lane(counts, policy, lane, counts_row, policy_row):
    """The lanes' counts and automata with `lane` set to `counts_row` (int32 [V]) and
    `policy_row` (int32 [token_automaton.ROW_WIDTH])."""
    return counts.at[lane].set(counts_row), policy.at[lane].set(policy_row)


def _host_copy(out, zero):
    """A fresh copy of a step's output for the host (xor with a runtime zero: XLA cannot
    fold it into the input buffer)."""
    return out ^ zero


def copy_state_slot(kv, src, dst):
    """The caches with state slot `src` copied into `dst` in every state layer (the dict
    entries, slot-major: recurrent states, Gemma's sliding rings); paged layers untouched."""
    return [jax.tree.map(lambda state: state.at[dst].set(state[src]), layer)
            if isinstance(layer, dict) else layer for layer in kv]


def _state_fields(unit: PrefillUnit | None, rows: Sequence[DecodeRow], num_rows: int,
                  capacity: int) -> dict:
    """The state-slot fields of a hybrid step; padding (no chunk, padding rows) names
    DUMMY_STATE_SLOT. A real unit on the dummy slot would share state with padding, and
    the device clips an index past the pool, so both are refused here."""
    slots = [row.state_slot for row in rows] + ([unit.state_slot] if unit is not None else [])
    if any(not 0 < slot <= capacity for slot in slots):
        raise ValueError(f"state slots {slots} outside 1..{capacity}")
    row_slots = np.full(num_rows, DUMMY_STATE_SLOT, np.int32)
    row_slots[:len(rows)] = slots[:len(rows)]
    chunk_slot = unit.state_slot if unit is not None else DUMMY_STATE_SLOT
    return dict(chunk_state_slot=chunk_slot, row_state_slots=row_slots)


def _padded_row(page_table, width: int) -> np.ndarray:
    row = np.full(width, paged_attention.DUMMY_PAGE, np.int32)
    row[:len(page_table)] = page_table
    return row


def _check_covers(page_table, num_positions: int, page_size: int) -> None:
    if len(page_table) * page_size < num_positions:
        raise ValueError(f"page table of {len(page_table)} pages does not cover "
                         f"{num_positions} positions")
