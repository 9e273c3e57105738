"""Engine-level decode and prefill speed of the model's own forward steps on random weights.

    PYTHONPATH=.:benchmarks python3 benchmarks/engine_bench.py --model llama3-8b \
        --weights bf16 --decode 1x1024,8x1024 --prefill 512,4096 [--reference]

Builds a random-weight model of the named shape directly on the device (nothing is loaded),
jits `model.llama.decode` / `prefill` (+ argmax) with the KV caches donated, as the runner does,
and times steps after a warm-up. Each figure is printed with the bytes the step must move
(every weight byte once, every valid KV entry once) and the implied bandwidth, next to the copy
bandwidth and bf16 matmul rate measured in the same process. --reference forces the pure-jnp
attention and matmul references (NINFER_FORCE_REFERENCE) for comparison. NINFER_W8A8 (a row
count, kernels/quant_matmul) runs int8 / fp8 projections as W8A8; at 1 their codes are stored
[N, K] first, as the runner's load does.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchlib import Recorder, copy_bandwidth, environment, gemv_bandwidth, matmul_rate
from kernel_bench import random_leaf
from ninfer_jax.kernels import paged_attention, quant_matmul
from ninfer_jax.kernels.quant_matmul import kernel as qm_kernel
from ninfer_jax.kernels.quant_matmul import tuning as qm_tuning
from ninfer_jax.kernels.quant_matmul import w8a8
from ninfer_jax.kernels.quant_matmul.formats import stored_bytes
from ninfer_jax.model import llama
from ninfer_jax.model.config import ModelConfig

SHAPES = {
    "llama3-8b": dict(architecture="llama", vocab_size=128256, hidden_size=4096,
                      intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                      head_dim=128, rope_theta=500000.0, max_position_embeddings=131072),
    "qwen3-8b": dict(architecture="qwen3", vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_layers=36, num_heads=32, num_kv_heads=8,
                     head_dim=128, rope_theta=1000000.0, qk_norm=True, rms_norm_eps=1e-6,
                     max_position_embeddings=40960),
    # A few-MB model for checking this script on a CPU.
    "tiny": dict(architecture="qwen3", vocab_size=512, hidden_size=256, intermediate_size=512,
                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, qk_norm=True),
}
PAGE_SIZE = 16
PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
rec = Recorder("engine_bench")


def random_params(config: ModelConfig, weights: str, seed: int = 0):
    """bf16 params of the model's shape; projections in `weights` format (lm_head stays bf16)."""
    key = jax.random.PRNGKey(seed)
    H, F, V, D = config.hidden_size, config.intermediate_size, config.vocab_size, config.head_dim
    shapes = {"wq": (H, config.num_heads * D), "wk": (H, config.num_kv_heads * D),
              "wv": (H, config.num_kv_heads * D), "wo": (config.num_heads * D, H),
              "w_gate": (H, F), "w_up": (H, F), "w_down": (F, H)}
    normal = lambda k, s: jax.random.normal(k, s, jnp.bfloat16) * 0.02  # noqa: E731
    layer_list = []
    for i in range(config.num_layers):
        keys = jax.random.split(jax.random.fold_in(key, i), len(shapes))
        layer = {name: random_leaf(k, *shapes[name], weights) for k, name in zip(keys, shapes)}
        layer["attn_norm"] = jnp.ones((H,), jnp.bfloat16)
        layer["mlp_norm"] = jnp.ones((H,), jnp.bfloat16)
        if config.qk_norm:
            layer["q_norm"] = jnp.ones((D,), jnp.bfloat16)
            layer["k_norm"] = jnp.ones((D,), jnp.bfloat16)
        layer_list.append(layer)
    return {"embed": normal(jax.random.fold_in(key, 10_001), (V, H)),
            "final_norm": jnp.ones((H,), jnp.bfloat16),
            "lm_head": normal(jax.random.fold_in(key, 10_002), (H, V)), "layers": layer_list}


def weight_bytes(params) -> int:
    """Bytes a decode step reads from the weights (projections + lm_head; embed rows ~0)."""
    per_layer = sum(stored_bytes(layer[name]) for layer in params["layers"] for name in PROJECTIONS)
    return per_layer + stored_bytes(params["lm_head"])


def empty_kv(config: ModelConfig, num_pages: int):
    shape = paged_attention.get_kv_cache_shape(num_pages, PAGE_SIZE, config.num_kv_heads,
                                               config.head_dim)
    return [(jnp.zeros(shape, jnp.bfloat16), jnp.zeros(shape, jnp.bfloat16))
            for _ in range(config.num_layers)]


def time_steps(step, params, kv, args, *, steps: int):
    """Median-of-3 seconds per step of `step(params, kv, *args) -> (tokens, kv)`."""
    tokens, kv = step(params, kv, *args)  # compile + warm up
    jax.block_until_ready(tokens)
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(steps):
            tokens, kv = step(params, kv, *args)
        jax.block_until_ready(tokens)
        samples.append((time.perf_counter() - start) / steps)
    return statistics.median(samples), kv


def bench_decode(config, params, batch: int, context: int, base: dict):
    width = -(-context // PAGE_SIZE)
    kv = empty_kv(config, batch * width + 1)
    tables = jnp.asarray(np.arange(1, batch * width + 1, dtype=np.int32).reshape(batch, width))
    positions = jnp.full((batch,), context - 1, jnp.int32)
    tokens = jnp.arange(batch, dtype=jnp.int32)

    def step(params, kv, tokens, positions, tables):
        logits, kv = llama.decode(params, kv, tokens, positions, tables, config=config,
                                  page_size=PAGE_SIZE)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), kv

    jitted = jax.jit(step, donate_argnums=(1,))
    seconds, kv = time_steps(jitted, params, kv, (tokens, positions, tables), steps=20)
    kv_bytes = batch * context * config.num_layers * config.num_kv_heads * config.head_dim * 4
    moved = weight_bytes(params) + kv_bytes
    rec.add(**base, op="decode", batch=batch, context=context, ms_per_step=seconds * 1e3,
            tok_per_s=batch / seconds, bytes_per_step=moved, tbps=moved / seconds / 1e12)
    del kv


def bench_prefill(config, params, prompt: int, base: dict):
    width = -(-prompt // PAGE_SIZE)
    kv = empty_kv(config, width + 1)
    table = jnp.arange(1, width + 1, dtype=jnp.int32)
    tokens = jnp.arange(prompt, dtype=jnp.int32) % config.vocab_size

    def step(params, kv, tokens, table):
        logits, kv = llama.prefill(params, kv, tokens, jnp.int32(0), jnp.int32(prompt), table,
                                   config=config, page_size=PAGE_SIZE)
        return jnp.argmax(logits).astype(jnp.int32), kv

    jitted = jax.jit(step, donate_argnums=(1,))
    seconds, kv = time_steps(jitted, params, kv, (tokens, table), steps=3)
    H, F, L = config.hidden_size, config.intermediate_size, config.num_layers
    D, NH, NK = config.head_dim, config.num_heads, config.num_kv_heads
    matmul_params = L * (H * NH * D * 2 + H * NK * D * 2 + 3 * H * F)
    flops = 2 * prompt * matmul_params + L * 4 * NH * D * prompt * (prompt + 1) / 2
    rec.add(**base, op="prefill", prompt=prompt, ms=seconds * 1e3, tok_per_s=prompt / seconds,
            tflops=flops / seconds / 1e12)
    del kv


def parse_pairs(text: str):
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--weights", default="bf16")
    parser.add_argument("--decode", default="1x1024,8x1024")
    parser.add_argument("--prefill", default="")
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--no-ceilings", action="store_true")
    parser.add_argument("--packed-layout", choices=qm_kernel.PACKED_LAYOUT_CHOICES,
                        default=qm_kernel.PACKED_LAYOUT,
                        help="how the tensor-core kernel reads 4-bit codes (A/B runs)")
    parser.add_argument("--one-row-dot", default=",".join(sorted(qm_tuning.ONE_ROW_DOT_FORMATS)),
                        metavar="FMT,...",
                        help="formats whose one row takes the tensor-core kernel (A/B runs)")
    parser.add_argument("--nibble-decode", choices=qm_kernel.NIBBLE_DECODE_CHOICES,
                        default=qm_kernel.NIBBLE_DECODE,
                        help="how the half-tile kernel decodes 4-bit codes (A/B runs)")
    args = parser.parse_args()
    if args.reference:
        os.environ["NINFER_FORCE_REFERENCE"] = "1"
    qm_kernel.PACKED_LAYOUT = args.packed_layout  # all read while tracing, before any jit
    qm_kernel.NIBBLE_DECODE = args.nibble_decode
    qm_tuning.ONE_ROW_DOT_FORMATS = frozenset(f for f in args.one_row_dot.split(",") if f)
    config = ModelConfig(**SHAPES[args.model])
    base = dict(model=args.model, weights=args.weights, attention="reference" if args.reference
                else "kernels", w8a8_min_rows=quant_matmul.w8a8_min_rows(),
                packed_layout=qm_kernel.PACKED_LAYOUT, nibble_decode=qm_kernel.NIBBLE_DECODE,
                one_row_dot=sorted(qm_tuning.ONE_ROW_DOT_FORMATS))
    if not args.no_ceilings:
        rec.add(op="ceilings", copy_tbps=copy_bandwidth() / 1e12,
                bf16_matmul_tflops=matmul_rate() / 1e12, gemv_tbps=gemv_bandwidth() / 1e12,
                **environment())
    params = random_params(config, args.weights)
    if quant_matmul.w8a8_transposes_at_load():  # as runner.place_params does (NINFER_W8A8=1)
        params = w8a8.transpose_leaves(params)
    rec.add(**base, op="params", weight_bytes=weight_bytes(params))
    for batch, context in parse_pairs(args.decode):
        bench_decode(config, params, batch, context, base)
    for prompt in [int(p) for p in args.prefill.split(",") if p]:
        bench_prefill(config, params, prompt, base)


if __name__ == "__main__":
    main()
