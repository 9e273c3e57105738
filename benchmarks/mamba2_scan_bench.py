"""Mamba-2's chunked SSD scan on the GPU: the Pallas kernel (kernels/mamba2/kernel.py) against
the XLA reference, both for one sequence's prefill chunk of T tokens in Nemotron-H-8B's Mamba
shape (128 heads of 64, 8 groups of state 128, 64-token SSD blocks), with their largest
difference; then (unless --scan-only) the nemotron-h-tiny model's prefill logits with the
kernel and with NINFER_FORCE_REFERENCE's path (its Mamba dims tile: the kernel runs inside the
forward once kernels/mamba2/__init__.py dispatches to it).
Prints one JSON line per measurement (timing: benchlib.time_op)."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

import benchlib
from ninfer_jax.kernels.mamba2 import kernel, reference


def scan_inputs(T: int, Hm=128, P=64, G=8, N=128, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, Hm, P))
    dt = np.log1p(np.exp(rng.standard_normal((T, Hm)) - 2.0))
    A = -np.exp(rng.uniform(0.0, np.log(16.0), Hm))
    B, C = (rng.standard_normal((T, G, N)) / np.sqrt(N) for _ in range(2))
    D = np.ones(Hm)
    state = rng.standard_normal((Hm, P, N)) * 0.1
    return [jnp.asarray(v, jnp.float32) for v in (x, dt, A, B, C, D, state)]


def bench_scan(T: int) -> dict:
    x, dt, A, B, C, D, state = scan_inputs(T)
    real = jnp.int32(T - 3)  # a ragged chunk: the last tokens are padding

    def ours(x):
        return kernel.chunk_ssd(x, dt, A, B, C, D, state, real)

    def xla(x):
        return reference.chunk_ssd(x, dt, A, B, C, D, state, real)

    got, want = jax.jit(ours)(x), jax.jit(xla)(x)
    diff = max(float(jnp.max(jnp.abs(got[0][:T - 3] - want[0][:T - 3]))),
               float(jnp.max(jnp.abs(got[1] - want[1]))))
    scale = float(jnp.max(jnp.abs(want[0][:T - 3])))
    return {"what": "chunk_ssd", "tokens": T, "kernel_ms": 1e3 * benchlib.time_op(ours, x),
            "xla_ms": 1e3 * benchlib.time_op(xla, x), "max_abs_diff": diff, "max_abs": scale}


def model_logits(force_reference: bool, T: int = 200) -> np.ndarray:
    import os

    from ninfer_jax.artifact.presets import PRESETS
    from ninfer_jax.artifact.random_init import random_params
    from ninfer_jax.model import nemotron_h

    os.environ["NINFER_FORCE_REFERENCE"] = "1" if force_reference else "0"
    config = dataclasses.replace(PRESETS["nemotron-h-tiny"].config, vocab_size=256)
    params = jax.tree.map(jnp.asarray, random_params(config, seed=1, dtype="f32"))
    kv = nemotron_h.init_caches(config, num_pages=65, page_size=4, num_state_slots=2,
                                dtype=jnp.float32, kv_dtype=jnp.float32)
    tokens = np.random.default_rng(2).integers(0, 256, T).astype(np.int32)
    step = jax.jit(functools.partial(nemotron_h.prefill, config=config, page_size=4))
    logits, _ = step(params, kv, tokens, np.int32(0), np.int32(T),
                     np.arange(1, 65, dtype=np.int32), np.int32(1))
    return np.asarray(logits)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--scan-only", action="store_true", help="skip the model check")
    args = parser.parse_args()
    print(json.dumps({"what": "environment", **benchlib.environment()}))
    with jax.default_matmul_precision("highest"):
        for T in args.tokens:
            print(json.dumps(bench_scan(T)), flush=True)
        if not args.scan_only:
            ours, theirs = model_logits(False), model_logits(True)
            print(json.dumps({"what": "nemotron-h-tiny prefill logits, kernel vs reference",
                              "max_abs_diff": float(np.abs(ours - theirs).max()),
                              "max_abs": float(np.abs(theirs).max())}))


if __name__ == "__main__":
    main()
