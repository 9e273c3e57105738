"""Time one DFlash / DFlash2 drafting pass alone (model/dflash.py): the context K/V write of a
step's rows and the block pass over [anchor, MASK x K] for R sequences with C context tokens
each, plus the proposal head (the full lm_head, or a --lm-head-draft vocabulary subset), at a
preset's full shapes with random drafter weights (bf16 on the GPU). The target's own step is
not run: its cost is runner_bench's / hybrid_bench's; this is what --spec dflash adds.

    python benchmarks/dflash_bench.py --preset qwen3.5-27b --variant dflash \
        --rows 1,8 --drafts 7,15 --context 4096 [--head-vocab 32768]

Prints one JSON line per (rows, drafts): milliseconds per pass (median of --iters).
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.artifact.drafters import preset_dflash_config, random_dflash
from ninfer_jax.artifact.presets import PRESETS
from ninfer_jax.kernels import paged_attention
from ninfer_jax.model import dflash, ragged_batch

PAGE = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3.5-27b", choices=sorted(PRESETS))
    parser.add_argument("--variant", default="dflash", choices=dflash.VARIANTS)
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--drafts", default="7,15")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--head-vocab", type=int, default=0, help="proposal head subset")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    target = PRESETS[args.preset].config
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    config = preset_dflash_config(target, args.variant, tiny=False)
    tree = jax.tree.map(lambda a: jnp.asarray(a, dtype),
                        random_dflash(config, seed=0, dtype="f32"))
    rng = np.random.default_rng(0)
    H, V = target.hidden_size, target.vocab_size
    params = {args.variant: tree,
              "embed": jnp.asarray(rng.standard_normal((V, H), np.float32) * 0.02, dtype),
              "lm_head": jnp.asarray(rng.standard_normal((H, V), np.float32) * 0.02, dtype)}
    head = None
    if args.head_vocab:
        head = {"weight": params["lm_head"][:, :args.head_vocab],
                "token_ids": jnp.arange(args.head_vocab, dtype=jnp.int32)}
    for rows in map(int, args.rows.split(",")):
        pages_per_row = -(-(args.context + 64) // PAGE)
        num_pages = 1 + rows * pages_per_row
        caches = [tuple(jnp.zeros(s.shape, s.dtype) for s in pair) for pair in
                  dflash.cache_shapes(config, num_pages=num_pages, page_size=PAGE,
                                      kv_dtype=dtype)]
        tables = jnp.asarray(1 + np.arange(rows * pages_per_row).reshape(rows, -1), jnp.int32)
        positions = jnp.full(rows, args.context, jnp.int32)
        for drafts in map(int, args.drafts.split(",")):
            step = jax.jit(lambda p, c, tokens: _pass(p, c, tokens, positions, tables, config,
                                                      target, drafts, head))
            tokens = jnp.asarray(rng.integers(0, V, rows), jnp.int32)
            out, caches = step(params, caches, tokens)
            out.block_until_ready()
            times = []
            for _ in range(args.iters):
                start = time.perf_counter()
                out, caches = step(params, caches, tokens)
                out.block_until_ready()
                times.append(time.perf_counter() - start)
            print(json.dumps({"preset": args.preset, "variant": args.variant, "rows": rows,
                              "drafts": drafts, "context": args.context,
                              "head_vocab": args.head_vocab or V,
                              "ms": round(1000 * float(np.median(times)), 3),
                              "device": jax.devices()[0].device_kind}))


def _pass(params, caches, tokens, positions, tables, config, target, drafts, head):
    """One step's drafter work for `rows` decode rows: their context K/V, then the block."""
    variant = params[config.variant]
    batch = ragged_batch.rows_only(tokens, positions - 1, tables)
    taps = jnp.zeros((tokens.shape[0], len(config.target_layer_ids) * config.hidden_size),
                     params["embed"].dtype)
    caches = dflash.write_context(variant, caches, batch, taps, config=config, page_size=PAGE)
    hidden = dflash.block_hidden(variant, params["embed"], caches, tokens, positions, tables,
                                 config=config, num_drafts=drafts)
    logits = dflash.head_logits(params, hidden, config, model_config=target, draft_head=head)
    return jnp.argmax(logits, axis=-1), caches


if __name__ == "__main__":
    main()
