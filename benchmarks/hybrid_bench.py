"""Decode and prefill speed of a preset's shape through JaxRunner, weights made on the device.

Issue 11's H200 measurement of the hybrid Qwen3.5 / 3.6 shapes, and issue 19's of the other
families (GLM MoE, Gemma 4): random weights in the presets' shapes are generated in device
memory (a 27B or 35B bf16 artifact would not fit the device's disk), nothing is read or written.
`--layers N` keeps the first N layers of every preset, for shapes whose bf16 weights outgrow
one GPU (GLM-4.5-Air: ~200 GB); the fraction of the GEMV ceiling does not depend on the count.

    python benchmarks/hybrid_bench.py [--presets qwen3.5-27b,qwen3.6-35b-a3b]
        [--batches 1,8,64] [--context 1024] [--prompt 4096] [--steps 32]
        [--prefill-chunk 1024] [--min-rows N] [--layers N] [--images N --image-size PX]
        [--verify K,... [--mtp K] [--mtp-acceptance TOKENS]] [--no-gdn] [--profile DIR]
        [--json] [--smoke]

Per preset (one at a time; its params and runner are freed before the next): the params
pytree the artifact loader would produce (config.expected_shapes, norms and Gated DeltaNet
vectors float32, the rest in the preset's dtype, drawn as artifact/random_init.py draws them
but with jax.random on the device, each layer's projections joined as the runner joins them
as soon as it is drawn), a JaxRunner over it, then exactly the shapes measured
compiled (one decode shape per batch, one prefill chunk shape). Decode is pipelined as the
engine's step loop runs it (step n+1 launched before step n is collected, rows fed the token
the previous step sampled on the device, greedy), every row at `--context` tokens on its own
state slot; prefill is one `--prompt`-token sequence in `--prefill-chunk` chunks, waited for
chunk by chunk. For hybrid presets, `gdn_prefill` times one Gated DeltaNet layer alone on a
`--prompt`-token chunk (projections, conv, delta rule, gated norm) once per prefill path of
kernels/gated_delta (reference, the WY form, the Pallas kernel; `serving_path` is the one
served now) and its delta rule alone (the reference's chunk scan rolled and unrolled, the WY
form, the kernel at a few tiles); `gdn_decode` the layer alone on the smallest and largest
batch of decode rows, against its weights plus the rows' state (hybrid_gdn.py).
--images N (issue 17): the runner also gets the preset's vision tower (random, host-drawn as
vision_encode_bench.py draws it) and `prefill_images` times the same --prompt-token prefill
with N images of PX x PX pixels at its start (their placeholder spans cut by the chunks as
served): tok/s counts every prompt token, and the tower's own encode time is reported apart
(the runner's request-log timing: the steps before it finish first, then it is waited for).
--verify K,... (issue 12): verify steps of K drafts per sequence at every batch (B x (K + 1)
rows, each sequence's rows chained on one state slot) against a plain step of B rows, timed
synchronously as runner_bench times them; --mtp K gives the preset a random MTP head that
drafts K tokens inside every step, and --mtp-acceptance TOKENS runs one greedy stream through
the scheduler with --spec mtp (random weights: it proves the head runs, nothing more).
Each figure comes with what it must move or compute (hybrid_costs.py) and the same process's
ceilings (benchlib: bf16 GEMV bandwidth, copy bandwidth, bf16 matmul rate), measured first.
--json prints one JSON object per measurement, flushed as it comes, so a run cut short by a
time limit keeps what it measured. --smoke: CPU check with the tiny presets and sizes.

On the H200, one process per preset (each under its own cap, its memory gone with it; the
35B-A3B preset holds ~70 GB of params, the 27B ~54 GB plus ~15 GB of KV pages and state slots;
run as a script, XLA's allocator may take MEM_FRACTION of the card unless
XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise):
    export PYTHONPATH=.:benchmarks PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
    timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_moe.py \
        -k "gpu or lower" > $OUT/pytest-moe.log 2>&1  # the MoE kernels natively, first
    timeout 300 python3 -m pytest -q -rA -p no:cacheprovider tests/kernels/test_gated_delta.py \
        tests/kernels/test_gated_delta_chunked.py > $OUT/pytest-gdn.log 2>&1  # GDN natively
    timeout 500 python3 benchmarks/hybrid_bench.py --presets qwen3.5-27b,qwen3.6-35b-a3b \
        --layers 4 --batches 1 --json > $OUT/gdn.jsonl 2> $OUT/gdn.log  # GDN paths, A/B
    timeout 240 python3 benchmarks/hybrid_bench.py --presets qwen3.6-35b-a3b --json \
        > $OUT/hybrid-35b.jsonl 2> $OUT/hybrid-35b.log
    timeout 280 python3 benchmarks/hybrid_bench.py --presets qwen3.5-27b --json \
        > $OUT/hybrid-27b.jsonl 2> $OUT/hybrid-27b.log
    timeout 500 python3 benchmarks/hybrid_bench.py --presets qwen3.5-27b --batches 1 \
        --images 4 --image-size 448 --json > $OUT/vision-27b.jsonl 2> $OUT/vision-27b.log
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import gc
import json
import math
import os
import time
import types

import jax
import jax.numpy as jnp
import numpy as np

import benchlib
import hybrid_costs
import hybrid_gdn
import runner_bench
import vision_encode_bench
from ninfer_jax.artifact.components import MTP_PREFIX, mtp_expected_shapes
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.artifact.tensor_groups import is_norm, tensor_group
from ninfer_jax.engine import prompt_media
from ninfer_jax.engine.request import MediaInput, SamplingParams
from ninfer_jax.engine.runner import JaxRunner, fit_bucket
from ninfer_jax.engine.runner_api import PrefillUnit, SampleSpec
from ninfer_jax.model import fused_projections
from ninfer_jax.model.vision import grid

GREEDY = SampleSpec(SamplingParams(temperature=0.0), 0)
# XLA's GPU allocator stops at 75% of the card unless told, preallocating or not: 59.7 GiB of
# an 80 GB H100, less than the 35B-A3B's weights and than the 31B's plus one compile's
# autotuning copy of its LM head (runs 38 and 39: 2.64 GiB asked), or the 27B's plus its 14 GiB
# of pages and state slots. The bench is the card's only user; the rest is left to the CUDA
# context and libraries.
MEM_FRACTION = "0.95"
MEM_FRACTION_VARS = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")
DEFAULT_PRESETS = "qwen3.5-27b,qwen3.6-35b-a3b"
SMOKE = dict(presets="qwen3.5-tiny,qwen3.6-tiny-moe", batches="1,2", context=40, prompt=48,
             steps=4, prefill_chunk=32)


# ---------------------------------------------------------------------------- params

# Elements drawn at once: threefry's temporaries take 16 bytes an element on XLA CPU, 8.6 GB
# for one of the 35B-A3B's 1.07 GB expert leaves, drawn when nearly all of its weights are
# made. Larger leaves are drawn in blocks of first-axis rows, each from its own key.
BLOCK_ELEMENTS = 1 << 24


@functools.partial(jax.jit, static_argnames=("shape", "dtype", "log_uniform"))
def _random_leaf(key, std, mean, *, shape, dtype, log_uniform=False):
    def draw(key, shape):
        if log_uniform:  # A_log ~ log U(1, 16)
            return jnp.log(jax.random.uniform(key, shape, jnp.float32, 1.0, 16.0)).astype(dtype)
        return (jax.random.normal(key, shape, dtype) * std + mean).astype(dtype)

    if math.prod(shape) <= BLOCK_ELEMENTS:
        return draw(key, shape)
    rows = _block_rows(shape)

    def block(index, out):  # written in place into the loop's buffer, the leaf itself
        return jax.lax.dynamic_update_slice_in_dim(
            out, draw(jax.random.fold_in(key, index), (rows, *shape[1:])), index * rows, 0)
    return jax.lax.fori_loop(0, shape[0] // rows, block, jnp.zeros(shape, dtype))


def _block_rows(shape) -> int:
    """The most first-axis rows of `shape` that divide it and hold at most BLOCK_ELEMENTS
    (at least one row)."""
    limit = max(1, BLOCK_ELEMENTS // math.prod(shape[1:]))
    return max(rows for rows in range(1, min(limit, shape[0]) + 1) if shape[0] % rows == 0)


def _leaf_law(config, name: str, shape) -> tuple[float, float, bool]:
    """(std, mean, log_uniform) of a tensor, as artifact/random_init._draw has them."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "A_log":
        return 0.0, 0.0, True
    if leaf == "dt_bias":
        return 0.1, 0.0, False
    if is_norm(name):
        centred = config.is_hybrid and leaf != "gdn_norm"  # applied as 1 + w
        return 0.1, 0.0 if centred else 1.0, False
    if name == "embed":
        return 1.0, 0.0, False
    if name == "lm_head":
        return 2.0 / math.sqrt(shape[0]), 0.0, False
    fan_in = shape[-2] if len(shape) == 3 else shape[0]  # stacked experts: [E, in, out]
    if leaf == "conv":
        fan_in = shape[0]
    return 1.0 / math.sqrt(fan_in), 0.0, False


def device_params(config, storage_dtype, seed: int = 0, mtp: bool = False,
                  fuse: bool = False) -> dict:
    """The params tree load_artifact(weights=True, mtp=mtp) would return, made on the default
    device leaf by leaf: norms and per-head vectors float32, the rest storage_dtype. `fuse`:
    each layer's projections joined as JaxRunner joins them (fused_projections, which then
    keeps them) as soon as the layer is drawn. The runner joins device leaves on the device
    while its caller still holds the parts, so given them unjoined both layouts would live at
    once: 33 of the 27B's 54 GB twice (run 39's H100 ran out there)."""
    params: dict = {"layers": [{} for _ in range(config.num_layers)]}
    shapes = dict(config.expected_shapes())
    if mtp:
        shapes.update(mtp_expected_shapes(config))
        params["mtp"] = {"layers": [{} for _ in range(config.mtp_num_layers)]}
    groups = fused_projections.fused_leaves(config) if fuse else None
    undrawn = collections.Counter(name.split(".")[1] for name in shapes
                                  if name.startswith("layers."))  # leaves left, by layer
    key = jax.random.PRNGKey(seed)
    for index, (name, shape) in enumerate(shapes.items()):
        tree, local = ((params["mtp"], name[len(MTP_PREFIX):]) if name.startswith(MTP_PREFIX)
                       else (params, name))
        std, mean, log_uniform = _leaf_law(config, local, shape)
        dtype = jnp.float32 if tensor_group(name) == "norms" else storage_dtype
        leaf = _random_leaf(jax.random.fold_in(key, index), std, mean, shape=tuple(shape),
                            dtype=jnp.dtype(dtype), log_uniform=log_uniform)
        if local.startswith("layers."):
            _, layer, leaf_name = local.split(".", 2)
            tree["layers"][int(layer)][leaf_name] = leaf
        else:
            tree[local] = leaf
        del leaf  # a joined layer's parts must have no reference left
        if name.startswith("layers."):
            undrawn[layer] -= 1
            if groups is not None and not undrawn[layer]:
                params["layers"][int(layer)] = fused_projections.fuse_layer(
                    params["layers"][int(layer)], 1, groups)
    return params


# ---------------------------------------------------------------------------- timing

def time_decode(runner, batch: int, context: int, steps: int,
                trace_dir: str | None = None) -> tuple[float, str]:
    """(seconds per pipelined decode step of `batch` rows at positions context, context + 1,
    ..., a digest of the tokens sampled): runner_bench's loop, each row on its own state
    slot; with `trace_dir`, the same steps once more under jax.profiler."""
    rate, _, digest = runner_bench.time_decode(runner, batch, context, steps, pipelined=True,
                                               trace_dir=trace_dir)
    return batch / rate, digest


def time_prefill(runner, prompt_len: int, chunk: int, repeats: int = 2) -> float:
    """Seconds to prefill one prompt from position 0, chunk by chunk, on state slot 1."""
    tokens = np.arange(prompt_len, dtype=np.int32) % 1000 + 100
    table = np.arange(1, 1 + math.ceil(prompt_len / runner.page_size), dtype=np.int32)

    def run():
        for start in range(0, prompt_len, chunk):
            piece = tokens[start:start + chunk]
            end = start + len(piece)
            runner.prefill(PrefillUnit(0, piece, start,
                                       table[:math.ceil(end / runner.page_size)],
                                       GREEDY if end == prompt_len else None, state_slot=1))
    run()
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - started) / repeats


def image_prompt(vision, prompt_len: int, num_images: int, size: int, seed: int = 0):
    """(tokens int32 [prompt_len], MediaInput items): num_images size x size images at the
    start, each <vision_start> pads <vision_end>, then text."""
    side = size // vision.patch_size
    grid_thw = (1, side, side)
    per_image = grid.num_tokens(grid_thw, vision)
    rng = np.random.default_rng(seed)
    tokens, items = [], []
    for index in range(num_images):
        tokens.append(vision.vision_start_token_id)
        spans = ((len(tokens), per_image),)
        tokens += [vision.image_token_id] * per_image + [vision.vision_end_token_id]
        pixels = rng.standard_normal((grid.num_patches([grid_thw]), vision.patch_dim),
                                     dtype=np.float32)
        items.append(MediaInput("image", f"bench-{index}", grid_thw, spans, pixels))
    if len(tokens) >= prompt_len:
        raise ValueError(f"{num_images} images of {size} px take {len(tokens)} tokens, not "
                         f"fewer than --prompt {prompt_len}")
    tokens += [100 + i % 1000 for i in range(prompt_len - len(tokens))]
    return np.asarray(tokens, np.int32), tuple(items)


def time_prefill_images(runner, tokens, items, chunk: int, repeats: int = 2):
    """(seconds per prefill, encode seconds per prefill) of one prompt with media."""
    media = prompt_media.build(items, len(tokens), tokens)
    table = np.arange(1, 1 + math.ceil(len(tokens) / runner.page_size), dtype=np.int32)

    def run():
        encode = 0.0
        for start in range(0, len(tokens), chunk):
            piece = tokens[start:start + chunk]
            end = start + len(piece)
            runner.prefill(PrefillUnit(0, piece, start, table[:math.ceil(end / runner.page_size)],
                                       GREEDY if end == len(tokens) else None, state_slot=1,
                                       media=media))
            encode += runner.vision.last_encode[1]
        return encode
    run()  # the encode bucket and the chunk gathers compile here
    started = time.perf_counter()
    encode = sum(run() for _ in range(repeats))
    return (time.perf_counter() - started) / repeats, encode / repeats


# ---------------------------------------------------------------------------- one preset

def ceilings(smoke: bool) -> dict:
    """The same process's bf16 GEMV bandwidth, copy bandwidth and matmul rate (benchlib).
    The GEMV ceiling is the better of one and two rows: a lone decode row runs padded to two
    on the GPU, where XLA's two-row product is the faster one."""
    # CPU smoke: sizes that take a second, not minutes
    gemv = dict(copies=2, k=512, n=2048) if smoke else {}
    by_rows = {rows: benchlib.gemv_bandwidth(rows=rows, **gemv) for rows in (1, 2)}
    return {"gemv_bytes_per_s": max(by_rows.values()), "gemv_1row_bytes_per_s": by_rows[1],
            "gemv_2row_bytes_per_s": by_rows[2],
            "copy_bytes_per_s": benchlib.copy_bandwidth(1 << 24 if smoke else 2 << 30),
            "matmul_flops_per_s": benchlib.matmul_rate(256 if smoke else 8192)}


def truncated(config, layers: int):
    """The first `layers` layers of a config (its per-layer lists cut to match)."""
    cut = {"num_layers": layers}
    if config.layer_types:
        cut["layer_types"] = tuple(config.layer_types[:layers])
    return dataclasses.replace(config, **cut)


def build_runner(config, params, args, batches, vision=None):
    """A runner over `params`; with `vision` (a VisionConfig) also a random tower of it."""
    acceptance = 64 + args.mtp_acceptance + args.mtp + 1 if args.mtp_acceptance else 0
    max_context = 2 ** math.ceil(math.log2(max(args.context + args.steps + 2, args.prompt,
                                               acceptance)))
    page = 16
    pages = (max(batches) * math.ceil((args.context + args.steps + 2) / page)
             + math.ceil(max(args.prompt, acceptance) / page) + 1)
    drafts = max(args.verify + [args.mtp])  # a verify step: every sequence's K + 1 rows
    if vision is not None:
        params = {**params, "vision": vision_encode_bench.random_tower(
            vision, jnp.dtype(params["embed"].dtype))}
    artifact = types.SimpleNamespace(config=config, params=params, vision_config=vision)
    runner = JaxRunner(artifact, num_pages=pages,
                       page_size=page, max_batch=max(batches) * (1 + drafts),
                       max_context=max_context,
                       prefill_chunk=args.prefill_chunk, min_rows=args.min_rows,
                       background_compile=False,
                       state_slot_capacity=max(batches) if config.has_state else 0,
                       vision=vision is not None, speculative=drafts > 0,
                       mtp_drafts=args.mtp)
    return runner, max_context


def bench_preset(name: str, args, limits: dict, emit) -> None:
    """Every measurement of one preset, emitted as it comes; its memory freed at the end."""
    preset = PRESETS[name]
    config = preset.config
    if args.layers and args.layers < config.num_layers:
        config = truncated(config, args.layers)
    batches = [int(b) for b in args.batches.split(",")]
    started = time.perf_counter()
    params = jax.block_until_ready(
        device_params(config, jnp.bfloat16 if preset.dtype == "bf16" else jnp.float32,
                      mtp=args.mtp > 0, fuse=True))
    made = time.perf_counter()
    runner, max_context = build_runner(config, params, args, batches,
                                       preset.vision if args.images else None)
    del params  # the runner holds the (cast) tree
    row_counts = {b * (1 + k) for b in batches for k in [0, *args.verify]}
    if args.mtp_acceptance:  # the scheduler's rounds: 1 + K rows, fewer near the end
        row_counts |= set(range(1, 2 + args.mtp))
    shapes = sorted({(0, fit_bucket(runner.row_buckets, n, "rows")) for n in row_counts})
    shapes.append((runner.chunk_buckets[-1], runner.row_buckets[0]))
    runner.compile_shapes(shapes, media_shapes=shapes[-1:])  # images: the chunk step only
    header = {"preset": name, "dtype": jnp.dtype(runner.dtype).name, "max_context": max_context,
              "num_layers": config.num_layers}
    emit({**header, "op": "setup", "param_bytes": hybrid_costs.tree_bytes(runner.params),
          "params_s": made - started, "compile_s": time.perf_counter() - made,
          "shapes": [list(s) for s in shapes], **limits})
    for position, batch in enumerate(sorted(batches, key=lambda b: b != 1)):  # batch 1 first
        trace_dir = f"{args.profile}/{name}/batch{batch}" if args.profile else None
        emit({**header, **_decode_record(runner, config, batch, args, limits, trace_dir)})
        if trace_dir:
            from trace_summary import annotate, sources_or_none, summarize

            sources = sources_or_none(runner_bench.decode_hlo(runner, batch))
            for summary in summarize(trace_dir, args.steps, top=80):
                emit({**header, "op": "profile", "batch": batch, **annotate(summary, sources)})
        if position == 0:
            emit({**header, **_prefill_record(runner, config, args, limits)})
            if args.images:
                emit({**header, **_image_prefill_record(runner, preset.vision, args)})
    for record in _verify_records(runner, batches, args):
        emit({**header, **record})
    if args.mtp_acceptance:
        emit({**header, **runner_bench.mtp_acceptance(runner, args.mtp_acceptance, args.mtp)})
    if "linear_attention" in (config.layer_types or ()) and not args.no_gdn:
        for record in _gdn_records(runner, config, batches, args, limits):
            emit({**header, **record})
    # Executables take no params (they are arguments), so dropping the references frees
    # the device memory; jit caches stay (the next preset reuses the leaf generators).
    del runner
    gc.collect()


def _decode_record(runner, config, batch: int, args, limits: dict,
                   trace_dir: str | None = None) -> dict:
    step_s, digest = time_decode(runner, batch, args.context, args.steps, trace_dir)
    rows = fit_bucket(runner.row_buckets, batch, "rows")
    sizes = dict(context=args.context + args.steps // 2, kv_itemsize=runner.kv_dtype.itemsize,
                 state_itemsize=jnp.dtype(runner.dtype).itemsize)
    need = hybrid_costs.decode_bytes(config, runner.params, rows=batch, **sizes)
    padded = hybrid_costs.decode_bytes(config, runner.params, rows=rows, **sizes)
    gemv = limits["gemv_bytes_per_s"]
    return {"op": "decode", "batch": batch, "padded_rows": rows, "context": args.context,
            "tok_per_s": batch / step_s, "ms_per_step": 1e3 * step_s, **need,
            "bytes_with_padding_rows": padded["bytes"],
            "bandwidth_bytes_per_s": need["bytes"] / step_s,
            "fraction_of_gemv_ceiling": need["bytes"] / step_s / gemv, "gemv_bytes_per_s": gemv,
            "expert_estimate": "uniform routing, expected distinct", "tokens_digest": digest}


def _prefill_record(runner, config, args, limits: dict) -> dict:
    seconds = time_prefill(runner, args.prompt, args.prefill_chunk)
    flops = hybrid_costs.prefill_flops(config, runner.params, args.prompt,
                                       math.ceil(args.prompt / args.prefill_chunk))
    rate = limits["matmul_flops_per_s"]
    return {"op": "prefill", "prompt": args.prompt, "chunk": args.prefill_chunk,
            "tok_per_s": args.prompt / seconds, "ms": 1e3 * seconds, **flops,
            "flops_per_s": flops["flops"] / seconds,
            "fraction_of_matmul_rate": flops["flops"] / seconds / rate,
            "matmul_flops_per_s": rate}


def _image_prefill_record(runner, vision, args) -> dict:
    tokens, items = image_prompt(vision, args.prompt, args.images, args.image_size)
    seconds, encode = time_prefill_images(runner, tokens, items, args.prefill_chunk)
    image_tokens = sum(item.num_tokens for item in items)
    return {"op": "prefill_images", "prompt": args.prompt, "chunk": args.prefill_chunk,
            "images": args.images, "image_size": args.image_size,
            "image_tokens": image_tokens, "patches": image_tokens * vision.merge_unit,
            "tok_per_s": args.prompt / seconds, "ms": 1e3 * seconds,
            "encode_ms": 1e3 * encode, "text_model_ms": 1e3 * (seconds - encode)}


def _verify_records(runner, batches, args):
    """A verify step of K drafts per sequence (B x (K + 1) rows, each sequence's rows on one
    state slot, chained) against a plain step of the same B, synchronous (runner_bench's)."""
    if not args.verify:
        return
    for batch in batches:
        plain = runner_bench.time_verify(runner, batch, 0, args.context, args.steps)
        for drafts in args.verify:
            seconds = runner_bench.time_verify(runner, batch, drafts, args.context, args.steps)
            yield {"op": "verify", "batch": batch, "draft_tokens": drafts,
                   "mtp_drafts": args.mtp, "rows": batch * (drafts + 1),
                   "ms_per_step": 1e3 * seconds, "plain_ms_per_step": 1e3 * plain,
                   "relative": seconds / plain}


def _gdn_records(runner, config, batches, args, limits: dict):
    """The first Gated DeltaNet layer alone: a --prompt chunk, and the extreme batches."""
    layer = hybrid_gdn.gdn_leaves(runner.params["layers"][config.layer_types.index(
        "linear_attention")])
    dtype = jnp.dtype(runner.dtype)
    rate, gemv = limits["matmul_flops_per_s"], limits["gemv_bytes_per_s"]
    timing = dict(iters=1, reps=1) if args.smoke else dict(iters=5, reps=3)
    gdn = hybrid_gdn.prefill(config, layer, args.prompt, dtype, **timing)
    def fractions(part: str) -> dict:  # by path / variant
        return {name: gdn[f"{part}_flops"] / ms * 1e3 / rate
                for name, ms in gdn[f"{part}_ms"].items()}

    yield {"op": "gdn_prefill", **gdn, "layer_fraction_of_matmul_rate": fractions("layer"),
           "kernel_fraction_of_matmul_rate": fractions("kernel"),
           "num_gdn_layers": config.layer_types.count("linear_attention"),
           "matmul_flops_per_s": rate}
    for rows in sorted({min(batches), max(batches)}):
        gdn = hybrid_gdn.decode(config, layer, rows, dtype, **timing)
        yield {"op": "gdn_decode", **gdn, "gemv_bytes_per_s": gemv,
               "fraction_of_gemv_ceiling": gdn["bandwidth_bytes_per_s"] / gemv}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options = [("presets", str, DEFAULT_PRESETS, None), ("batches", str, "1,8,64", None),
               ("context", int, 1024, None), ("prompt", int, 4096, None),
               ("steps", int, 32, None),
               ("prefill_chunk", int, 1024, "the runner's largest chunk (serving: 1024)")]
    for field, kind, default, help_text in options:
        smoke = f", with --smoke {SMOKE[field]}" if field in SMOKE else ""
        parser.add_argument("--" + field.replace("_", "-"), type=kind, default=None,
                            help=f"{help_text + '; ' if help_text else ''}default {default}{smoke}")
    parser.add_argument("--min-rows", type=int, default=None,
                        help="the runner's smallest row bucket (default: its own choice, 2 "
                             "on the GPU: a lone row runs padded with a dummy row)")
    parser.add_argument("--layers", type=int, default=None,
                        help="keep each preset's first N layers (shapes too big for one GPU)")
    parser.add_argument("--images", type=int, default=0,
                        help="also time the --prompt prefill with N images at its start "
                             "(the preset's vision tower, random); default 0")
    parser.add_argument("--image-size", type=int, default=448,
                        help="pixels per side of each image (default 448: 196 tokens)")
    parser.add_argument("--verify", default="", metavar="K,...",
                        help="also time verify steps of K drafts per sequence at every batch "
                             "against a plain step (issue 12)")
    parser.add_argument("--mtp", type=int, default=0, metavar="K",
                        help="give the preset a random MTP head drafting K tokens inside every "
                             "step (the verify and decode figures then include it)")
    parser.add_argument("--mtp-acceptance", type=int, default=0, metavar="TOKENS",
                        help="one greedy stream of TOKENS through the scheduler with --spec mtp "
                             "(random weights: proves the head runs, acceptance meaningless)")
    parser.add_argument("--no-gdn", action="store_true",
                        help="skip the Gated DeltaNet layer-alone records")
    parser.add_argument("--profile", metavar="DIR",
                        help="also trace each batch's decode steps under jax.profiler into DIR "
                             "and emit where the device's time went (trace_summary.py: the "
                             "top 80 kernels by name, per step, each with the source lines "
                             "its HLO came from)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU check: the tiny presets at tiny sizes")
    args = parser.parse_args(argv)
    for field, _, default, _ in options:  # given options win over --smoke's sizes
        if getattr(args, field) is None:
            setattr(args, field, SMOKE[field] if args.smoke else default)
    args.verify = [int(k) for k in args.verify.split(",") if k]
    if args.mtp and not args.verify:
        parser.error("--mtp times verify steps: give --verify K,... too")
    return args


def _print_text(record: dict) -> None:
    op = record["op"]
    if op == "setup":
        print(f"{record['preset']}: {record['param_bytes'] / 1e9:.1f} GB of params in "
              f"{record['params_s']:.1f} s, compile {record['compile_s']:.1f} s; GEMV "
              f"{record['gemv_bytes_per_s'] / 1e9:.0f} GB/s, matmul "
              f"{record['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s", flush=True)
    elif op == "decode":
        print(f"  decode batch {record['batch']}: {record['tok_per_s']:.1f} tok/s "
              f"({record['ms_per_step']:.2f} ms/step), {record['bytes'] / 1e9:.2f} GB -> "
              f"{record['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s = "
              f"{record['fraction_of_gemv_ceiling']:.0%} of GEMV", flush=True)
    elif op == "prefill":
        print(f"  prefill {record['prompt']}: {record['tok_per_s']:.0f} tok/s, "
              f"{record['fraction_of_matmul_rate']:.0%} of the matmul rate", flush=True)
    elif op == "prefill_images":
        print(f"  prefill {record['prompt']} with {record['images']} images of "
              f"{record['image_size']} px: {record['tok_per_s']:.0f} tok/s, encode "
              f"{record['encode_ms']:.1f} ms of {record['ms']:.1f} ms", flush=True)
    elif op == "verify":
        print(f"  verify batch {record['batch']}, K {record['draft_tokens']} "
              f"({record['rows']} rows{', MTP drafting' if record['mtp_drafts'] else ''}): "
              f"{record['ms_per_step']:.2f} ms/step, {record['relative']:.2f}x the plain step",
              flush=True)
    elif op == "mtp_acceptance":
        print(f"  mtp K {record['draft_tokens']}: {record['accepted']}/{record['drafted']} "
              f"drafts accepted in {record['rounds']} rounds", flush=True)
    elif op == "gdn_prefill":
        layer_rate, rule_rate = (record[f"{part}_fraction_of_matmul_rate"]
                                 for part in ("layer", "kernel"))
        layer = ", ".join(f"{path} {ms:.2f} ms ({layer_rate[path]:.0%})"
                          for path, ms in record["layer_ms"].items())
        rule = ", ".join(f"{name} {ms:.3f} ms ({rule_rate[name]:.0%})"
                         for name, ms in record["kernel_ms"].items())
        print(f"  GDN layer at {record['tokens']} tokens (of the matmul rate; serving "
              f"{record['serving_path']}): {layer}\n  its delta rule alone: {rule}", flush=True)
    else:
        print(f"  GDN layer, {record['rows']} decode rows: {record['ms']:.3f} ms, "
              f"{record['bytes'] / 1e6:.0f} MB -> {record['fraction_of_gemv_ceiling']:.0%} "
              f"of GEMV", flush=True)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    records: list[dict] = []

    def emit(record):
        records.append(record)
        if args.json:
            print(json.dumps(record), flush=True)
        else:
            _print_text(record)

    limits = {**ceilings(args.smoke), **benchlib.environment()}
    for name in args.presets.split(","):
        bench_preset(name, args, limits, emit)
    return records


if __name__ == "__main__":
    if not any(os.environ.get(name) for name in MEM_FRACTION_VARS):  # read as JAX's backend
        os.environ[MEM_FRACTION_VARS[0]] = MEM_FRACTION  # starts, in ceilings()
    main()
