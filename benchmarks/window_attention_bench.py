"""Sliding-window attention of decode rows: the windowed gather every backend runs
(kernels/ragged_attention/windowed.py) against the reference's block walk, on any backend.

    PYTHONPATH=. python3 benchmarks/window_attention_bench.py [--shape gemma4-31b|small]
        [--batches 1,8] [--contexts 1024,4096]

`gemma4-31b`: one of its 50 sliding layers (32 query / 16 kv heads of 256, window 1024, bf16
pages of 16); `small` (the CPU default): 8 / 4 heads of 128, window 512. Each row sits at the
end of a `context`-token table. One JSON line per case (also under $OUT): ms per call of each
path and the bytes of the keys and values in the rows' windows per second of the gather.
"""
from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchlib import Recorder, environment, time_op
from ninfer_jax.kernels.ragged_attention import reference, windowed

SHAPES = {"gemma4-31b": dict(heads=32, kv_heads=16, head_dim=256, window=1024),
          "small": dict(heads=8, kv_heads=4, head_dim=128, window=512)}
PAGE = 16


def case(rec, batch, context, *, heads, kv_heads, head_dim, window, shape):
    rng = np.random.default_rng(0)
    width = -(-context // PAGE)
    num_pages = batch * width + 1
    table = jnp.asarray(rng.permutation(np.arange(1, num_pages)).reshape(batch, width), jnp.int32)
    k = jnp.asarray(rng.standard_normal((num_pages, kv_heads, PAGE, head_dim)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((num_pages, kv_heads, PAGE, head_dim)), jnp.bfloat16)
    q = jnp.asarray(rng.standard_normal((batch, heads, head_dim)), jnp.bfloat16)
    lengths = jnp.full((batch,), context, jnp.int32)
    args = dict(chunk_table=table[0], chunk_start=jnp.int32(0), row_tables=table,
                row_lengths=lengths, scale=head_dim ** -0.5, num_chunk_tokens=0, window=window)
    row = dict(shape=shape, batch=batch, context=context, window=window, **environment())
    for name, module in (("windowed", windowed), ("reference", reference)):
        fn = functools.partial(module.ragged_paged_attention, **args)
        row[f"{name}_ms"] = time_op(lambda q, k, v: fn(q, k, v), q, k, v, iters=5, reps=3) * 1e3
    seen = min(context, window)
    row["window_bytes_per_s"] = (2 * batch * seen * kv_heads * head_dim * 2
                                 / (row["windowed_ms"] / 1e3))
    row["speedup"] = row["reference_ms"] / row["windowed_ms"]
    rec.add(**row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default=None,
                        help="default: gemma4-31b on a GPU, small elsewhere")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--contexts", default="1024,4096")
    args = parser.parse_args()
    shape = args.shape or ("gemma4-31b" if jax.default_backend() == "gpu" else "small")
    rec = Recorder("window_attention_bench")
    for batch in (int(b) for b in args.batches.split(",")):
        for context in (int(c) for c in args.contexts.split(",")):
            case(rec, batch, context, shape=shape, **SHAPES[shape])


if __name__ == "__main__":
    main()
