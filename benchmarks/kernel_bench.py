"""Kernel microbenchmarks on the GPU: paged decode/prefill attention and quantized matmuls,
each next to the copy bandwidth and bf16 matmul rate measured in the same run.

    PYTHONPATH=. python3 benchmarks/kernel_bench.py [ceilings] [decode] [sweep] [rows] [splits] [kv8] [kv4]
        [kvsweep] [prefill] [quant] [qsweep] [qquick] [gemvsweep] [w8a8] [w8a8-qkv] [w8a8-o]
        [w8a8-gate_up] [w8a8-down] [moe]

Every figure is printed as one JSON line (and appended to $OUT/kernel_bench.jsonl); bandwidth
counts the fewest bytes the op must move (each valid KV entry or stored weight byte read once).
Each checked config is also compared with the XLA reference on the same inputs ("err").
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchlib import (Recorder, copy_bandwidth, environment, gemv_bandwidth, matmul_rate,
                      time_op)
from ninfer_jax.kernels import paged_attention
from ninfer_jax.kernels.paged_attention import kernel as attn_kernel
from ninfer_jax.kernels.paged_attention import prefill as attn_prefill
from ninfer_jax.kernels.paged_attention import reference as attn_reference
from ninfer_jax.kernels.paged_attention.tuning import decode_tuning
from ninfer_jax.kernels.moe import kernel as moe_kernel
from ninfer_jax.kernels.moe import reference as moe_reference
from ninfer_jax.kernels.moe import tuning as moe_tuning
from ninfer_jax.kernels.quant_matmul import kernel as qm_kernel
from ninfer_jax.kernels.quant_matmul import reference as qm_reference
from ninfer_jax.kernels.quant_matmul import w8a8 as qm_w8a8
from ninfer_jax.kernels.quant_matmul.formats import stored_bytes
from ninfer_jax.kernels.skinny_matmul import kernel as skinny_kernel
from ninfer_jax.kernels.quant_matmul import gemv as qm_gemv
from ninfer_jax.kernels.quant_matmul.tuning import (GEMV_TARGET_PROGRAMS, MatmulTuning,
                                                    matmul_tuning)

rec = Recorder("kernel_bench")


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


# ------------------------------------------------------------------------------ attention


def paged_inputs(batch, context, heads=32, kv_heads=8, head_dim=128, page_size=16, seed=0,
                 table_context=None):
    """bf16 caches holding `batch` rows of `context` tokens on shuffled pages; the page table
    is `table_context` tokens wide (a server's max context), its tail the dummy page."""
    width = -(-context // page_size)
    num_pages = batch * width + 1
    rng = np.random.default_rng(seed)
    table = (rng.permutation(num_pages - 1) + 1).astype(np.int32).reshape(batch, width)
    table_width = -(-(table_context or context) // page_size)
    table = np.pad(table, ((0, 0), (0, table_width - width)))  # page 0 is the dummy page
    key = jax.random.PRNGKey(seed)
    shape = (num_pages, kv_heads, page_size, head_dim)
    k = jax.random.normal(key, shape, jnp.bfloat16)
    v = jax.random.normal(jax.random.fold_in(key, 1), shape, jnp.bfloat16)
    q = jax.random.normal(jax.random.fold_in(key, 2), (batch, heads, head_dim), jnp.bfloat16)
    lengths = jnp.full((batch,), context, jnp.int32)
    return q, k, v, jnp.asarray(table), lengths


def scaled_pages(cache, kv_dtype, part=0):
    """bf16 pages [P, K, S, D] rewritten by write_kv, token by token, as the `part` (0 keys,
    1 values) pages of `kv_dtype` (8-bit ScaledPages, or a KVFormat's 8- or 4-bit pages)."""
    P, K, S, D = cache.shape
    specs = attn_reference.cache_specs(P, S, K, D, kv_dtype)
    empty = [jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype), s) for s in specs]
    tokens = jnp.moveaxis(cache, 2, 1).reshape(P * S, K, D)
    pages = jax.jit(attn_reference.write_kv)(*empty, tokens, tokens, jnp.arange(P * S))
    return pages[part]


@contextlib.contextmanager
def fp8_widening(module, value):
    """module.FP8_WIDEN (a kernel's trace-time switch) set to `value` (None: as it is) while
    the block traces and times; every jit inside is a fresh trace, so it reads the value."""
    saved = module.FP8_WIDEN
    module.FP8_WIDEN = value or saved
    try:
        yield module.FP8_WIDEN
    finally:
        module.FP8_WIDEN = saved


def bench_decode(batch, context, *, tuning=None, reference=False, page_size=16, tag="",
                 table_context=None, kv_dtype=None, widen=None, interpret=False, iters=20):
    """The Pallas decode kernel over bf16 (kv_dtype None) or kv_dtype pages (a pair it does
    not read through the dispatch, which runs the XLA reference; `path` says which). fp8
    pages are widened as `widen` says (attn_kernel.FP8_WIDEN; None: its default), recorded
    as "widen". `interpret` and `iters` are for the CPU smoke test."""
    with fp8_widening(attn_kernel, widen) as widening:
        _bench_decode(batch, context, tuning=tuning, reference=reference, page_size=page_size,
                      tag=tag, table_context=table_context, kv_dtype=kv_dtype,
                      widen=widening, interpret=interpret, iters=iters)


def _bench_decode(batch, context, *, tuning, reference, page_size, tag, table_context,
                  kv_dtype, widen, interpret, iters):
    q, k, v, table, lengths = paged_inputs(batch, context, page_size=page_size,
                                           table_context=table_context)
    k_bf16, v_bf16 = k, v
    if kv_dtype is not None:
        k, v = scaled_pages(k, kv_dtype, 0), scaled_pages(v, kv_dtype, 1)
    scale = 128 ** -0.5
    ref_fn = jax.jit(functools.partial(attn_reference.paged_decode_attention, scale=scale))
    if attn_kernel.supports(k, v):
        path = "pallas"
        fn = functools.partial(attn_kernel.paged_decode_attention, scale=scale, tuning=tuning,
                               interpret=interpret)
    else:
        path = "xla_reference"
        fn = functools.partial(paged_attention.paged_decode_attention, scale=scale)
    out = jax.jit(fn)(q, k, v, table, lengths)
    err = rel_err(out, ref_fn(q, k, v, table, lengths))
    err_bf16 = rel_err(out, ref_fn(q, k_bf16, v_bf16, table, lengths))
    seconds = time_op(fn, q, k, v, table, lengths, iters=iters)
    # every valid token's codes and scales read once
    moved = batch * context * attn_reference.cache_bytes_per_token(
        8, 128, jnp.bfloat16 if kv_dtype is None else kv_dtype)
    name = "bfloat16" if kv_dtype is None else attn_reference.kv_format(kv_dtype).name
    row = dict(op="decode_attention", batch=batch, context=context, page_size=page_size,
               table_context=table_context or context, kv_dtype=name, path=path,
               tuning=str(tuning) if tuning else "default", us=seconds * 1e6,
               tbps=moved / seconds / 1e12, err=err, err_vs_bf16_pages=err_bf16, tag=tag)
    if name == "float8_e4m3fn" and path == "pallas":
        row["widen"] = widen
    if reference:
        row["xla_reference_us"] = time_op(ref_fn, q, k, v, table, lengths, iters=3) * 1e6
    rec.add(**row)


def decode_section():
    for batch, context in [(8, 32768), (8, 4096), (1, 1024), (8, 1024), (32, 8192),
                           (64, 1024), (1, 32768)]:
        bench_decode(batch, context, reference=(batch, context) == (8, 32768))


def sweep_section():
    """Split/block/warps/stages for a long batch (8 x 32k) and a short single row (1 x 1k)."""
    for block, warps, stages, target in itertools.product((32, 64), (2, 4), (1, 2, 3),
                                                          (528, 1056, 2112)):
        _sweep_one(8, 32768, block_tokens=block, num_warps=warps, num_stages=stages,
                   target_programs=target)
    for block, min_split, target in itertools.product((16, 32, 64), (64, 256), (264, 1056)):
        _sweep_one(1, 1024, block_tokens=block, min_split_tokens=min_split,
                   target_programs=target)


def kv8_section(shapes=None, interpret=False, iters=20):
    """The decode kernel over bf16, fp8 (each widening) and int8 pages (issue 14: fp8 KV at
    32k x 8 >= 1.7x bf16's tok/s), and the short-row shapes of the 8B server. `shapes`
    (batch, context, table_context), `interpret` and `iters` are for the CPU smoke test."""
    for batch, context, table_context in shapes or [(8, 32768, None), (256, 384, 1024),
                                                    (64, 384, 1024), (1, 4096, None)]:
        for kv_dtype, widen in ((None, None), *KV8_VARIANTS):
            bench_decode(batch, context, table_context=table_context, kv_dtype=kv_dtype,
                         widen=widen, tag="kv8", interpret=interpret, iters=iters)


# Each 8-bit page dtype a sweep times, with the fp8 widenings (attn_kernel.FP8_WIDEN) it tries:
# widened to bfloat16 or float16, or kept for e4m3 dots (one or two terms of the query and
# the probabilities; e4m3qk: e4m3 scores, float16 values).
KV8_VARIANTS = (*((jnp.float8_e4m3fn, widen) for widen in attn_kernel.FP8_WIDEN_CHOICES),
                (jnp.int8, None))


def kv4_section():
    """The decode kernel over bf16, fp8 (each widening), int8, k8v4 and nvfp4 pages at 32k x
    8 and 4k x 1 (issue 14: fp8 KV at 32k x 8 >= 1.7x bf16's tok/s; the 4-bit formats widen
    their codes in registers, `err_vs_bf16_pages` is each format's quantization error)."""
    for batch, context in [(8, 32768), (1, 4096)]:
        for kv_dtype, widen in ((None, None), *KV8_VARIANTS, (attn_reference.K8V4, None),
                                (attn_reference.NVFP4, None)):
            bench_decode(batch, context, kv_dtype=kv_dtype, widen=widen, tag="kv4")


def kv_sweep_section(batch=8, context=32768, configs=None, interpret=False, iters=20,
                     variants=KV8_VARIANTS):
    """Block/warps/stages of the decode kernel over 8-bit pages at 8 x 32k (issue 14: fp8 KV
    >= 1.7x bf16 there; run 40 on an H100: int8 1.44x, fp8 1.24x with bf16's defaults), fp8
    with each widening (bfloat16 through float16 per code; float16 in one instruction per
    pair; e4m3 dots widen none). The defaults were swept for bf16 pages: 64 tokens a loop
    iteration move 16 KiB of bf16 keys but 8 KiB of 8-bit ones, so an 8-bit block may want
    twice the tokens to keep as many bytes in flight. `variants` (a subset of KV8_VARIANTS)
    shortens a device call; `configs`, `interpret` and `iters` are for the CPU smoke test."""
    bench_decode(batch, context, tag="kvsweep-bf16-default", interpret=interpret, iters=iters)
    configs = configs or list(itertools.product((64, 128, 256), (2, 4), (1, 2)))
    for kv_dtype, widen in variants:
        for block, warps, stages in configs:
            _sweep_one(batch, context, kv_dtype=kv_dtype, tag="kvsweep", block_tokens=block,
                       num_warps=warps, num_stages=stages, widen=widen, interpret=interpret,
                       iters=iters)


def rows_sweep_section():
    """Block/warps/stages for many short rows (64 and 256 rows x 384 tokens, a 1k table), where
    paged decode is a fifth (64 rows) to two fifths (256 rows) of the 8B step (run 21)."""
    for batch in (64, 256):
        bench_decode(batch, 384, table_context=1024, tag="rows-default")
        for block, warps, stages in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3)):
            _sweep_one(batch, 384, table_context=1024, block_tokens=block, num_warps=warps,
                       num_stages=stages)


def splits_sweep_section(shapes=((64, 384), (256, 384), (2, 1024), (64, 1024), (256, 1024)),
                         table_context=4096, targets=(2048, 8192, 16384), min_splits=(128,),
                         blocks=(32, 64), warps=(2, 4), follow=(False, True),
                         interpret=False, iters=20):
    """The context split at the server's shapes: many rows of short contexts in its 4k page
    table (and the one real row of 1,024 tokens a GPU pads to two). The split count follows
    the table, not the rows (TARGET_PROGRAMS programs over batch x kv heads), so at 64 rows
    a 4k table makes 4 splits of 1,024 tokens, of which a 384-token row fills one: 512
    programs of 6 serial blocks each, where run 22 (a 1k table) measured 2.5 TB/s. More
    splits give more, shorter programs at the price of empty ones and a merge; splits that
    follow each row's length (DecodeTuning.follow_length) leave none empty. Each distinct
    tuning once; `interpret` and `iters` are for the CPU smoke test."""
    for batch, context in shapes:
        bench_decode(batch, context, table_context=table_context, tag="splits-default",
                     interpret=interpret, iters=iters)
        seen = set()
        for follow_length, target, min_split, block, nw in itertools.product(
                follow, targets, min_splits, blocks, warps):
            knobs = dict(block_tokens=block, target_programs=target,
                         min_split_tokens=min_split, num_warps=nw, follow_length=follow_length)
            tuning = decode_tuning(batch=batch, num_kv_heads=8, page_size=16,
                                   table_width=table_context // 16, **knobs)
            if tuning in seen:
                continue
            seen.add(tuning)
            _sweep_one(batch, context, table_context=table_context, tag="splits",
                       interpret=interpret, iters=iters, **knobs)


def _sweep_one(batch, context, table_context=None, kv_dtype=None, tag="sweep", widen=None,
               interpret=False, iters=20, **knobs):
    tuning = decode_tuning(batch=batch, num_kv_heads=8, page_size=16,
                           table_width=(table_context or context) // 16, **knobs)
    try:
        bench_decode(batch, context, tuning=tuning, table_context=table_context,
                     kv_dtype=kv_dtype, tag=tag, widen=widen, interpret=interpret,
                     iters=iters)
    except Exception as err:  # noqa: BLE001 - a config the compiler rejects is a result
        rec.add(op="decode_attention", tag=tag, tuning=str(tuning), widen=widen,
                error=repr(err)[:300])


def prefill_section():
    for chunk, start in [(4096, 0), (2048, 2048), (512, 0), (8192, 0)]:
        q, k, v, table, _ = paged_inputs(1, start + chunk)
        q = jax.random.normal(jax.random.PRNGKey(5), (chunk, 32, 128), jnp.bfloat16)
        scale = 128 ** -0.5
        args = (q, k, v, table[0], jnp.int32(start))
        fn = functools.partial(attn_prefill.paged_prefill_attention, scale=scale)
        ref_fn = functools.partial(attn_reference.paged_prefill_attention, scale=scale)
        err = rel_err(jax.jit(fn)(*args), jax.jit(ref_fn)(*args))
        flops = 4 * 32 * 128 * (chunk * (chunk + 1) / 2 + chunk * start)
        seconds = time_op(fn, *args, iters=10)
        ref_seconds = time_op(ref_fn, *args, iters=3)
        rec.add(op="prefill_attention", chunk=chunk, start=start, us=seconds * 1e6,
                tflops=flops / seconds / 1e12, xla_reference_us=ref_seconds * 1e6, err=err)


# ------------------------------------------------------------------------- quantized matmul


def random_leaf(key, k, n, fmt):
    """A weight leaf of the given format with random codes (values do not affect speed)."""
    k1, k2 = jax.random.split(key)
    if fmt == "bf16":
        return jax.random.normal(k1, (k, n), jnp.bfloat16) * 0.02
    if fmt == "int8":
        return {"int8": jax.random.randint(k1, (k, n), -127, 128).astype(jnp.int8),
                "scale": jax.random.uniform(k2, (n,), jnp.float32, 1e-4, 1e-3)}
    if fmt == "fp8":
        return {"fp8": jax.random.normal(k1, (k, n)).astype(jnp.float8_e4m3fn),
                "scale": jax.random.uniform(k2, (n,), jnp.float32, 1e-3, 1e-2)}
    codes = jax.random.bits(k1, (k, n // 2), jnp.uint8)
    if fmt == "int4":
        return {"int4": codes,
                "scale": jax.random.uniform(k2, (k // 128, n), jnp.float32, 1e-3, 1e-2)
                .astype(jnp.float16)}
    return {"nvfp4": codes,
            "scale": jax.random.uniform(k2, (k // 16, n), jnp.float32, 1.0, 448.0)
            .astype(jnp.float8_e4m3fn),
            "global_scale": jnp.float32(1e-5)}


def bench_matmul(fmt, rows, k, n, *, tuning=None, copies=8, tag=""):
    """`copies` distinct weights (together far larger than L2) multiplied in turn."""
    keys = jax.random.split(jax.random.PRNGKey(rows + k), copies)
    weights = [random_leaf(key, k, n, fmt) for key in keys]
    x = jax.random.normal(jax.random.PRNGKey(9), (rows, k), jnp.bfloat16)

    def kernel_all(x, ws):
        return [qm_kernel.matmul(x, w, tuning=tuning) for w in ws]

    def xla_all(x, ws):
        return [qm_reference.matmul(x, w) for w in ws]

    row = dict(op="matmul", fmt=fmt, rows=rows, k=k, n=n, tag=tag,
               tuning=str(tuning) if tuning else str(matmul_tuning(rows=rows, k=k, n=n, fmt=fmt)
                                                      if fmt != "bf16" else "xla"))
    moved = sum(stored_bytes(w) for w in weights)
    xla_s = time_op(xla_all, x, weights, iters=5)
    row.update(xla_us=xla_s / copies * 1e6, xla_tbps=moved / xla_s / 1e12)
    if fmt != "bf16":
        out = jax.jit(kernel_all)(x, weights[:1])[0]
        row["err"] = rel_err(out, jax.jit(xla_all)(x, weights[:1])[0])
        seconds = time_op(kernel_all, x, weights, iters=5)
        row.update(us=seconds / copies * 1e6, tbps=moved / seconds / 1e12)
    rec.add(**row)


def quant_section():
    for fmt in ("bf16", "int8", "fp8", "int4", "nvfp4"):
        for rows, k, n in [(1, 4096, 14336), (1, 14336, 4096), (1, 4096, 1024),
                           (8, 4096, 14336)]:
            _matmul_guarded(fmt, rows, k, n)


def quant_quick_section():
    """The batch-1 shape only: every format on 4096 x 14336."""
    for fmt in ("bf16", "int8", "fp8", "int4", "nvfp4"):
        _matmul_guarded(fmt, 1, 4096, 14336)


def quant_sweep_section():
    """Warps x pipeline stages of the one-row kernel (default tiles) on 4096 x 14336."""
    for fmt in ("int8", "int4", "nvfp4", "fp8"):
        for warps, stages in itertools.product((4, 8), (1, 2, 3)):
            tuning = matmul_tuning(rows=1, k=4096, n=14336, fmt=fmt, num_warps=warps,
                                   num_stages=stages)
            _matmul_guarded(fmt, 1, 4096, 14336, tuning=tuning, tag="sweep")


def gemv_sweep_section(k=4096, n=14336, copies=8, interpret=False, iters=5):
    """Issue 10's batch 1 (>= 240 tok/s in bf16 needs ~3.6 TB/s of weight streaming; XLA's
    one-row dot gives 2.7-3.35) and issue 14's (the one-row kernel reads int8 codes at 1.78
    TB/s, fp8 at 0.97x XLA's bf16 in run 40): the one-row kernel (gemv.py) over plain bf16
    tiles, int8 codes and fp8 codes widened both ways (qm_gemv.FP8_WIDEN, recorded as
    "widen"), tiles x warps x stages, against XLA's bf16 dot at 1 and 2 rows in the same run.
    If bf16 tiles stream no faster than int8 codes, the loop, not the widening, sets the pace.
    `interpret` (one config) and `iters` are for the CPU smoke test."""
    keys = jax.random.split(jax.random.PRNGKey(11), copies)
    x = jax.random.normal(jax.random.PRNGKey(12), (1, k), jnp.bfloat16)
    plain = [random_leaf(key, k, n, "bf16") for key in keys]
    for rows in (1, 2):
        xr = jnp.tile(x, (rows, 1))
        seconds = time_op(lambda xr, ws: [xr @ w for w in ws], xr, plain, iters=iters)
        rec.add(op="gemv", fmt="bf16", path="xla", rows=rows, k=k, n=n, tag="gemvsweep",
                us=seconds / copies * 1e6, tbps=copies * k * n * 2 / seconds / 1e12)
    leaves = {"bf16": [{"bf16": w, "scale": jnp.ones((n,), jnp.float32)} for w in plain],
              "int8": [random_leaf(key, k, n, "int8") for key in keys],
              "fp8": [random_leaf(key, k, n, "fp8") for key in keys]}
    variants = [("bf16", None), ("int8", None), ("fp8", "float32"), ("fp8", "float16")]
    configs = [(64, 128, 4, 1)] if interpret else itertools.product(
        (32, 64, 128), (128, 256, 512), (4, 8), (1, 3))
    for block_k, block_n, warps, stages in configs:
        for fmt, widen in variants:
            tuning = MatmulTuning(block_n=block_n, block_k=block_k, num_splits=0,
                                  num_warps=warps, num_stages=stages, use_dot=False)
            blocks = k // block_k
            wanted = max(1, -(-GEMV_TARGET_PROGRAMS // (n // block_n)))
            splits = max(d for d in range(1, min(wanted, blocks) + 1) if blocks % d == 0)
            tuning = dataclasses.replace(tuning, num_splits=splits)
            tags = dict(op="gemv", fmt=fmt, path="pallas", rows=1, k=k, n=n, tag="gemvsweep",
                        tuning=str(tuning), **({"widen": widen} if widen else {}))
            with fp8_widening(qm_gemv, widen):
                _gemv_one(x, leaves[fmt], fmt, n=n, tuning=tuning, interpret=interpret,
                          iters=iters, tags=tags)


def _gemv_one(x, ws, fmt, *, n, tuning, interpret, iters, tags):
    """One gemvsweep record: the one-row kernel over `copies` weights in turn (fresh jits, so
    they trace under the caller's FP8_WIDEN)."""
    k, copies = x.shape[1], len(ws)
    try:
        def run(x, ws):
            return [qm_gemv.gemv(x[0], w, fmt, n=n, tuning=tuning, interpret=interpret)
                    for w in ws]
        out = jax.jit(run)(x, ws[:1])[0]
        want = (x.astype(jnp.float32) @ (ws[0][fmt].astype(jnp.float32)
                                         * ws[0]["scale"][None, :]))[0]
        seconds = time_op(run, x, ws, iters=iters)
        moved = sum(stored_bytes(w) if fmt != "bf16" else k * n * 2 for w in ws)
        rec.add(**tags, us=seconds / copies * 1e6, tbps=moved / seconds / 1e12,
                err=rel_err(out, want))
    except Exception as err:  # noqa: BLE001 - a config the compiler rejects is a result
        rec.add(**tags, error=repr(err)[:300])


# (block_n, block_k, warps, stages) of the tensor-core kernel tried by dotsweep
DOT_SWEEP_TILES = [(bn, bk, warps, stages) for bn in (64, 128, 256) for bk in (128, 256)
                   for warps, stages in ((4, 3), (4, 4), (8, 3))]


def dot_sweep_section(k=4096, n=14336, copies=8, fmts=("int4", "nvfp4", "fp8", "int8"),
                      rows_list=(1, 8, 64), configs=None, interpret=False, iters=5):
    """Issue 14's 4-bit formats at >= 2.5x bf16 (run 3-4: 0.63-0.75 TB/s, compute bound): the
    tensor-core kernel (kernel.py) with 4-bit codes as one interleaved tile or as two half
    tiles (qm_kernel.PACKED_LAYOUT, recorded as "layout"; "halves+ptx" decodes the half tiles
    with qm_kernel.NIBBLE_DECODE "ptx"), at one row (x padded to 16 rows,
    against the one-row FMA kernel) and at 8 and 64 rows, tiles x warps x stages swept where
    it matters (rows 1 and 8), against XLA's bf16 dot at the same rows. `configs`,
    `interpret` and `iters` are for the CPU smoke test."""
    keys = jax.random.split(jax.random.PRNGKey(13), copies)
    if not interpret:
        plain = [random_leaf(key, k, n, "bf16") for key in keys]
        for rows in rows_list:
            x = jax.random.normal(jax.random.PRNGKey(14), (rows, k), jnp.bfloat16)
            seconds = time_op(lambda x, ws: [x @ w for w in ws], x, plain, iters=iters)
            rec.add(op="dot", fmt="bf16", path="xla", rows=rows, k=k, n=n, tag="dotsweep",
                    us=seconds / copies * 1e6, tbps=copies * k * n * 2 / seconds / 1e12)
        del plain
    configs = DOT_SWEEP_TILES if configs is None else configs
    for fmt in fmts:
        leaves = [random_leaf(key, k, n, fmt) for key in keys]
        layouts = qm_kernel.PACKED_LAYOUT_CHOICES if fmt in qm_kernel.PACKED_FORMATS else (
            qm_kernel.PACKED_LAYOUT,)
        for rows in rows_list:
            x = jax.random.normal(jax.random.PRNGKey(14), (rows, k), jnp.bfloat16)
            runs = [(qm_kernel.PACKED_LAYOUT, matmul_tuning(rows=rows, k=k, n=n, fmt=fmt))]
            if rows == 1:  # the one-row FMA kernel, whatever the default
                runs.append((qm_kernel.PACKED_LAYOUT,
                             matmul_tuning(rows=1, k=k, n=n, fmt=fmt, use_dot=False)))
            for layout in layouts + (("halves+ptx",) if "halves" in layouts else ()):
                runs.append((layout, matmul_tuning(rows=rows, k=k, n=n, fmt=fmt, use_dot=True)))
                if rows <= 8 and (layout.startswith("halves") or len(layouts) == 1):
                    runs += [(layout, matmul_tuning(rows=rows, k=k, n=n, fmt=fmt, use_dot=True,
                                                    block_n=bn, block_k=bk, num_warps=warps,
                                                    num_stages=stages))
                             for bn, bk, warps, stages in configs]
            seen = set()
            for layout, tuning in runs:
                if tuning is None or (layout, tuning) in seen:
                    continue
                seen.add((layout, tuning))
                tags = dict(op="dot", fmt=fmt, path="pallas", rows=rows, k=k, n=n,
                            tag="dotsweep", layout=layout, tuning=str(tuning))
                with packed_layout(layout):
                    _dot_one(x, leaves, tuning=tuning, interpret=interpret, iters=iters,
                             tags=tags)


@contextlib.contextmanager
def packed_layout(layout):
    """qm_kernel.PACKED_LAYOUT (and NIBBLE_DECODE, "halves+ptx") set while the caller jits
    (both are read while tracing)."""
    before = qm_kernel.PACKED_LAYOUT, qm_kernel.NIBBLE_DECODE
    qm_kernel.PACKED_LAYOUT, _, decode = layout.partition("+")
    qm_kernel.NIBBLE_DECODE = decode or "jnp"
    try:
        yield
    finally:
        qm_kernel.PACKED_LAYOUT, qm_kernel.NIBBLE_DECODE = before


def _dot_one(x, ws, *, tuning, interpret, iters, tags):
    """One dotsweep record: the kernel over `copies` weights in turn, its error against the
    reference on the first."""
    try:
        def run(x, ws):
            return [qm_kernel.matmul(x, w, tuning=tuning, interpret=interpret) for w in ws]
        out = jax.jit(run)(x, ws[:1])[0]
        want = jax.jit(qm_reference.matmul)(x.astype(jnp.float32), ws[0])
        seconds = time_op(run, x, ws, iters=iters)
        moved = sum(stored_bytes(w) for w in ws)
        rec.add(**tags, us=seconds / len(ws) * 1e6, tbps=moved / seconds / 1e12,
                err=rel_err(out, want))
    except Exception as err:  # noqa: BLE001 - a config the compiler rejects is a result
        rec.add(**tags, error=repr(err)[:300])


def _matmul_guarded(fmt, rows, k, n, **kw):
    try:
        bench_matmul(fmt, rows, k, n, **kw)
    except Exception as err:  # noqa: BLE001 - a config the compiler rejects is a result
        rec.add(op="matmul", fmt=fmt, rows=rows, k=k, n=n, tag=kw.get("tag", ""),
                tuning=str(kw.get("tuning")), error=repr(err)[:300])


# ------------------------------------------------------------------------------------ W8A8

# The 8B model's projections (K -> N): q|k|v fused, o, gate|up fused, down.
W8A8_SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672),
               "down": (14336, 4096)}
W8A8_ROWS = (1, 4096, 64, 8, 2, 512)  # issue 14's targets (batch 1, 4k prefill) first
HLO_DTYPE = {"fp8": "f8e4m3fn", "int8": "s8"}


def quantize_on_device(w, fmt):
    """A bf16 [K, N] weight as the int8 / fp8 per-channel leaf (formats.py's quantizer in jnp,
    so the 8B-sized weights never visit the host)."""
    top = qm_reference.ACTIVATION_MAX[fmt]
    w = w.astype(jnp.float32)
    scale = jnp.maximum(jnp.abs(w).max(axis=0), 1e-12) / top
    scaled = jnp.clip(w / scale, -top, top)
    codes = (jnp.round(scaled) if fmt == "int8" else scaled).astype(
        qm_reference.ACTIVATION_DTYPE[fmt])
    return {fmt: codes, "scale": scale}


def hlo_summary(compiled, w, fmt) -> dict:
    """What XLA compiled one product into: its custom-call targets, whether a Triton GEMM
    fusion is among them, and whether the weight's codes were copied into the other layout
    (an [N, K] array from a [K, N] leaf, or a [K, N] one stored column-major, or the reverse)."""
    text = compiled.as_text() or ""
    targets = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))
    dt = HLO_DTYPE[fmt]
    stored = tuple(next(a for a in w.values() if a.ndim == 2).shape)
    other = (stored[1], stored[0])
    relayout = (f"{dt}[{other[0]},{other[1]}]" in text
                or f"{dt}[{stored[0]},{stored[1]}]{{0,1}}" in text)
    return dict(custom_calls=targets, triton_gemm="triton_gemm" in text or "__triton" in text,
                weight_relayout=relayout)


def w8a8_variants(rows, fmts=("fp8", "int8")):
    """(name, fmt, layout, fn(x, w)) for one row count: the Pallas weight-only kernel (few
    rows), W8A8 on [N, K] and [K, N] leaves, the bare 8-bit GEMM on [N, K] (x already
    quantized, no epilogue) that says how much the quantization and scaling fusions cost, and
    (fp8) W8A8 with bf16 GEMM output."""
    out = []
    for fmt in fmts:
        if rows <= 64:
            interpret = jax.default_backend() != "gpu"
            out.append(("pallas_weight_only", fmt, "kn",
                        functools.partial(qm_kernel.matmul, interpret=interpret)))
        out.append(("w8a8", fmt, "nk", qm_w8a8.matmul))
        out.append(("w8a8", fmt, "kn", qm_w8a8.matmul))
        out.append(("gemm_only", fmt, "nk", functools.partial(_gemm_only, fmt=fmt)))
        if fmt == "fp8":
            out.append(("w8a8_bf16_sums", fmt, "nk", _w8a8_bf16_sums))
    return out


def _w8a8_bf16_sums(x, w):
    """w8a8.matmul with the fp8 GEMM writing bf16 sums instead of f32 (cuBLASLt still
    accumulates in f32): the scaling fusion after a GEMM XLA cannot fold it into reads and
    writes 4 bytes per output instead of 10, which matters at prefill sizes."""
    x_codes, x_scale = qm_reference.quantize_rows(x, "fp8")
    sums = jax.lax.dot_general(x_codes, w["fp8_nk"], (((1,), (1,)), ((), ())),
                               preferred_element_type=jnp.bfloat16)
    scale = x_scale[:, None] * w["scale"][None, :]
    return (sums.astype(jnp.float32) * scale).astype(x.dtype)


def _gemm_only(x_codes, w, *, fmt):
    codes = w[f"{fmt}_nk"]
    return jax.lax.dot_general(x_codes, codes, (((1,), (1,)), ((), ())),
                               preferred_element_type=qm_w8a8.ACCUMULATOR[fmt])


def bench_w8a8_shape(rows, k, n, *, copies=None, fmts=("fp8", "int8"), tag=""):
    """bf16 XLA dot and every w8a8_variant on x [rows, k] @ `copies` distinct [k, n] weights
    (several while the product is memory-bound, so they outgrow L2); one row each."""
    copies = copies or (8 if rows <= 64 else 2)
    keys = jax.random.split(jax.random.PRNGKey(rows + k + n), copies)
    dense = [jax.random.normal(key, (k, n), jnp.bfloat16) * 0.02 for key in keys]
    x = jax.random.normal(jax.random.PRNGKey(9), (rows, k), jnp.bfloat16)
    exact = jnp.matmul(x.astype(jnp.float32), dense[0].astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST)
    flops = 2 * rows * k * n
    base = dict(op="w8a8_matmul", rows=rows, k=k, n=n, copies=copies, tag=tag)

    def record(name, fmt, layout, fn, weights, arg=x):
        def all_copies(x, ws):
            return [fn(x, w) for w in ws]
        try:
            compiled = jax.jit(fn).lower(arg, weights[0]).compile()
            out = compiled(arg, weights[0])
            if out is None:
                raise ValueError("no tiling for this shape")
            err = rel_err(out, exact) if name != "gemm_only" else None
            seconds = time_op(all_copies, arg, weights, iters=5) / copies
            moved = stored_bytes(weights[0])
            row = dict(base, variant=name, fmt=fmt, layout=layout, us=seconds * 1e6,
                       weight_tbps=moved / seconds / 1e12, tflops=flops / seconds / 1e12,
                       err=err)
            if fmt != "bf16":
                row.update(hlo_summary(compiled, weights[0], fmt))
            rec.add(**row)
        except Exception as error:  # noqa: BLE001 - a config that fails is a result
            rec.add(**base, variant=name, fmt=fmt, layout=layout, error=repr(error)[:300])

    record("xla_bf16", "bf16", "kn", jnp.matmul, dense)
    for fmt in fmts:
        kn = [quantize_on_device(w, fmt) for w in dense]
        nk = [qm_w8a8.transposed(w) for w in kn]
        x_codes = qm_reference.quantize_rows(x, fmt)[0]
        for name, vfmt, layout, fn in w8a8_variants(rows, (fmt,)):
            arg = x_codes if name == "gemm_only" else x
            record(name, vfmt, layout, fn, nk if layout == "nk" else kn, arg)
        del kn, nk


def w8a8_section(shapes=None, rows=W8A8_ROWS, **kw):
    """Issue 14: W8A8 (activations quantized per token, one 8-bit GEMM) against bf16 and the
    weight-only kernel on the 8B shapes, both weight layouts, at decode and prefill sizes."""
    for K, N in (shapes or W8A8_SHAPES.values()):
        for M in rows:
            bench_w8a8_shape(M, K, N, **kw)


# ------------------------------------------------------------------------------ MoE experts

# Qwen3.6-35B-A3B's routed experts: hidden 2048, 256 experts of width 512, 8 per token
MOE_SHAPE = dict(hidden=2048, width=512, experts=256, top_k=8)


def moe_routings(rng, rows, *, experts, top_k, count):
    """`count` routings of `rows` tokens: the first row picks top_k distinct experts, the
    rest are padding rows as model/moe_mlp.py makes them (the first row's experts, weight 0),
    the engine's lone decode row padded to `rows`."""
    ids, weights = [], []
    for _ in range(count):
        first = rng.choice(experts, top_k, replace=False)
        ids.append(jnp.asarray(np.tile(first, (rows, 1)), jnp.int32))
        w = np.zeros((rows, top_k), np.float32)
        w[0] = rng.uniform(0.1, 1.0, top_k)
        weights.append(jnp.asarray(w))
    return ids, weights


def moe_section(shape=None, rows_list=(1, 2), sweep_rows=(2,), routings=8, interpret=False,
                iters=10, up_configs=None, down_configs=None):
    """Issue 11's 35B-A3B batch-1 step (>= 300 tok/s): the routed experts' decode path
    (kernels/moe/kernel.py gathered_experts) for one live row alone and padded to `rows`,
    each call over `routings` different routings in turn (their experts' weights, 48 MB a
    routing at the 35B shape, together past L2), in a loop of one traced call (_moe_time).
    Whole path with the activation between the GEMVs in an XLA fusion or in the down GEMV
    (ACTIVATION_AT), then each GEMV alone over
    tiles (rows in `sweep_rows`; the tuning's tile only at the others): block_k x block_n x
    warps at the tuning's split count, and the tuning's tile at other split counts
    (`up_configs` / `down_configs`: GemvTiles lists instead, for the CPU test). Bandwidth
    counts the live row's expert weights read once."""
    shape = shape or MOE_SHAPE
    H, I, E, k = shape["hidden"], shape["width"], shape["experts"], shape["top_k"]
    print(f"moe: {shape}, rows {rows_list}", file=sys.stderr, flush=True)
    key = jax.random.PRNGKey(21)
    gate_up = jax.random.normal(key, (E, H, 2 * I), jnp.bfloat16) * H ** -0.5
    down = jax.random.normal(jax.random.fold_in(key, 1), (E, I, H), jnp.bfloat16) * I ** -0.5
    moved = routings * k * 3 * H * I * 2  # bytes of the live row's experts, every routing
    rng = np.random.default_rng(22)
    for rows in rows_list:
        ids, weights = moe_routings(rng, rows, experts=E, top_k=k, count=routings)
        x = jax.random.normal(jax.random.fold_in(key, 2), (rows, H), jnp.bfloat16)
        want = moe_reference.gathered_experts(x[:1], ids[0][:1], weights[0][:1], gate_up, down)
        A = rows * k
        base = dict(op="moe", rows=rows, hidden=H, width=I, experts=E, top_k=k, tag="moe")
        ids, weights = jnp.stack(ids), jnp.stack(weights)
        for activation_at in ("fusion", "down"):
            def whole(x, ids, weights, gate_up, down):
                return moe_kernel.gathered_experts(x, ids, weights, gate_up, down,
                                                   interpret=interpret)
            _moe_record(whole, (x, ids, weights), (gate_up, down), moved, iters, routings,
                        dict(base, part="experts", activation_at=activation_at),
                        check=lambda out: rel_err(out[:1], want), module_value=activation_at)
        act = jax.random.normal(jax.random.fold_in(key, 3), (A, I), jnp.bfloat16)
        flat = ids.reshape(routings, A)
        used = (weights.reshape(routings, A) != 0).astype(jnp.int32)
        parts = (("gate_up", x, gate_up, k, k * H * 2 * I * 2, up_configs),
                 ("down", act, down, 1, k * I * H * 2, down_configs))
        for part, inputs, w, per_input, part_bytes, configs in parts:
            K, n = w.shape[1], w.shape[2]
            tuned = moe_tuning.gemv_tiles(assignments=A, k=K, n=n)
            if rows not in sweep_rows:
                configs = [tuned]
            for tiles in configs or _moe_gemv_configs(tuned, A, K, n):
                def gemv(inputs, flat, used, w, tiles=tiles, per_input=per_input):
                    return moe_kernel._expert_gemv(inputs, flat, used, w,
                                                   rows_per_input=per_input, tiles=tiles,
                                                   interpret=interpret)
                _moe_record(gemv, (inputs, flat, used), (w,), routings * part_bytes, iters,
                            routings,
                            dict(base, part=part, tuning=str(tiles), tuned=tiles == tuned))


def _moe_gemv_configs(tuned, assignments, k, n):
    """The tuning's tile, block_k x block_n at their tuned split count, and the tuning's tile
    at every other split count that divides its blocks, with 8 warps, with 2 stages; then the
    tensor-core form (use_dot) at the tuning's tile with 1-3 stages and 4 / 8 warps, and at
    wider tiles with 3 stages (a dot's operands pipeline where the FMA loop's did not)."""
    configs = [tuned]
    for tile in itertools.product((32, 64, 128), (64, 128, 256)):
        tiles = moe_tuning.gemv_tiles(assignments=assignments, k=k, n=n, tile=tile)
        if tiles is not None:
            configs.append(tiles)
    blocks = k // tuned.block_k
    configs += [dataclasses.replace(tuned, num_splits=s) for s in (1, 2, 4, 8, 16, 32)
                if blocks % s == 0 and s != tuned.num_splits]
    configs += [dataclasses.replace(tuned, num_stages=2), dataclasses.replace(tuned, num_warps=8)]
    dot = dataclasses.replace(tuned, use_dot=True)
    configs += [dataclasses.replace(dot, num_stages=stages, num_warps=warps)
                for stages in (1, 2, 3) for warps in (4, 8)]
    for tile in ((128, 128), (128, 64), (64, 256), (256, 64)):
        tiles = moe_tuning.gemv_tiles(assignments=assignments, k=k, n=n, tile=tile)
        if tiles is not None:
            configs.append(dataclasses.replace(tiles, use_dot=True, num_stages=3))
    return list(dict.fromkeys(configs))


def _moe_time(fn, first, stacked, weights, *, calls: int, reps: int = 5) -> float:
    """Median seconds per call of fn(first, *routing r of each stacked input, *weights),
    `calls` calls cycling through the routings in one fori_loop, so the kernels are traced,
    and compiled, once (unrolled, each Pallas call compiles on its own). The loop's own
    per-iteration cost inflates every figure by several us (run 52d on an H100: the down GEMV
    15.2 us here, 8.9 us in the step's profile): compare records of one run, not with
    profiles. The weights are arguments: closed over, they would be constants of the
    executable (run 52c spent its time compressing 1.5 GB of them into the compilation
    cache)."""
    routings = stacked[0].shape[0]

    def looped(zero, first, stacked, weights):
        def body(i, carry):
            out = fn(carry, *(a[i % routings] for a in stacked), *weights)
            bump = sum(jnp.ravel(leaf)[0].astype(jnp.float32) for leaf in jax.tree.leaves(out))
            return carry + (bump * zero).astype(carry.dtype)
        return lax.fori_loop(0, calls, body, first)

    run = jax.jit(looped)
    zero = jnp.float32(0.0)
    jax.block_until_ready(run(zero, first, stacked, weights))  # compile + warm up
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(run(zero, first, stacked, weights))
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def _moe_record(fn, args, weights, moved, iters, routings, tags, check=None,
                module_value=None):
    """One `moe` record: fn over `iters` rounds of the `routings` stacked in args[1:] (then
    the `weights`); `moved` is the bytes of one round."""
    previous = moe_kernel.ACTIVATION_AT
    try:
        if module_value is not None:
            moe_kernel.ACTIVATION_AT = module_value
        extra = {}
        print(f"moe: {tags}", file=sys.stderr, flush=True)
        if check:  # traced under the value above
            extra["err"] = check(jax.jit(fn)(args[0], *(a[0] for a in args[1:]), *weights))
            print("moe: checked", file=sys.stderr, flush=True)
        seconds = _moe_time(fn, args[0], args[1:], weights, calls=iters * routings)
        rec.add(**tags, us=seconds * 1e6, tbps=moved / routings / seconds / 1e12, **extra)
    except Exception as err:  # noqa: BLE001 - a config the compiler rejects is a result
        rec.add(**tags, error=repr(err)[:300])
    finally:
        moe_kernel.ACTIVATION_AT = previous


# The 8B's projections (K, N) as the runner joins them: q|k|v, o, gate|up, down.
SKINNY_SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672),
                 "down": (14336, 4096)}
# (block_k, block_n, warps, stages, target programs) tried besides the default tiles
SKINNY_TILES = [(128, 64, 4, 4, 264), (256, 64, 4, 4, 264), (64, 128, 4, 4, 264),
                (128, 128, 8, 3, 264), (256, 128, 4, 3, 264), (128, 128, 4, 4, 528),
                (128, 128, 4, 4, 132)]


def skinny_section(shapes=None, rows_list=(1, 2, 8), copies=8, configs=None, interpret=False,
                   iters=10):
    """Issue 10's batch 1 (>= 240 tok/s needs the 8B's 15 GB of projections faster than
    XLA's 3.4-4.2 TB/s of run 20): kernels/skinny_matmul (split-K on the tensor cores, rows
    padded by a masked load, weight tiles pipelined) against XLA's bf16 dot on the 8B's four
    projections at 1 / 2 / 8 rows, `copies` weights in turn (past L2), the default tiles and
    SKINNY_TILES. `shapes`, `configs`, `interpret` and `iters` are for the CPU smoke test."""
    shapes = shapes or SKINNY_SHAPES
    configs = SKINNY_TILES if configs is None else configs
    for name, (k, n) in shapes.items():
        keys = jax.random.split(jax.random.PRNGKey(17), copies)
        weights = [jax.random.normal(key, (k, n), jnp.bfloat16) * 0.02 for key in keys]
        moved = copies * k * n * 2
        for rows in rows_list:
            x = jax.random.normal(jax.random.PRNGKey(18), (rows, k), jnp.bfloat16)
            base = dict(op="skinny", shape=name, k=k, n=n, rows=rows, tag="skinny")
            if not interpret:
                seconds = time_op(lambda x, ws: [x @ w for w in ws], x, weights, iters=iters)
                rec.add(**base, path="xla", us=seconds / copies * 1e6,
                        tbps=moved / seconds / 1e12)
            tilings = [skinny_kernel.skinny_tiles(k=k, n=n)] + [
                skinny_kernel.skinny_tiles(k=k, n=n, block_k=bk, block_n=bn, num_warps=warps,
                                           num_stages=stages, target_programs=target)
                for bk, bn, warps, stages, target in configs]
            for tiles in dict.fromkeys(t for t in tilings if t is not None):
                _skinny_one(x, weights, tiles, moved, base, interpret, iters)


def _skinny_one(x, weights, tiles, moved, base, interpret, iters):
    try:
        def run(x, ws):
            return [skinny_kernel.skinny_matmul(x, w, tiles=tiles, interpret=interpret)
                    for w in ws]
        err = rel_err(jax.jit(run)(x, weights[:1])[0],
                      jnp.dot(x, weights[0], preferred_element_type=jnp.float32))
        seconds = time_op(run, x, weights, iters=iters)
        rec.add(**base, path="pallas", tuning=str(tiles), us=seconds / len(weights) * 1e6,
                tbps=moved / seconds / 1e12, err=err)
    except Exception as err:  # noqa: BLE001 - a config the compiler rejects is a result
        rec.add(**base, path="pallas", tuning=str(tiles), error=repr(err)[:300])


def ceilings_section():
    rec.add(op="ceilings", copy_tbps=copy_bandwidth() / 1e12,
            bf16_matmul_tflops=matmul_rate() / 1e12, gemv_tbps=gemv_bandwidth() / 1e12,
            **environment())


SECTIONS = {"ceilings": ceilings_section, "decode": decode_section, "sweep": sweep_section,
            "rows": rows_sweep_section, "splits": splits_sweep_section, "kv8": kv8_section, "kv4": kv4_section,
            "kvsweep": kv_sweep_section, "gemvsweep": gemv_sweep_section,
            "prefill": prefill_section, "quant": quant_section, "qsweep": quant_sweep_section,
            "qquick": quant_quick_section, "w8a8": w8a8_section, "dotsweep": dot_sweep_section,
            "moe": moe_section, "skinny": skinny_section,
            # one 8B projection each (a device command has 10 minutes)
            **{f"w8a8-{name}": functools.partial(w8a8_section, shapes=[shape])
               for name, shape in W8A8_SHAPES.items()}}

if __name__ == "__main__":
    for name in sys.argv[1:] or list(SECTIONS):
        try:
            SECTIONS[name]()
        except Exception as err:  # noqa: BLE001 - keep the other sections' figures
            rec.add(section=name, error=repr(err)[:1000])
