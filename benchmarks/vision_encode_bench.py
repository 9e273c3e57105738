"""Vision encode time per image through the JAX tower (issue 17's H200 figure), random weights
in the published Qwen3.5 tower shape (27 blocks of 1152, patch 16, merge 2) feeding the
qwen3.5-27b text width. One image per call at each size, the tower's bucket = its own patch
count; seconds are the median of --repeats timed calls after one compile-and-warm call.

    python3 benchmarks/vision_encode_bench.py --sizes 448 1344 --out $OUT      # on the H200
    .venv/bin/python benchmarks/vision_encode_bench.py --sizes 64 --dtype float32   # CPU check
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.artifact import presets
from ninfer_jax.artifact.components import VISION_PREFIX, add_vision_tensor, vision_expected_shapes
from ninfer_jax.model.vision import grid, tower


def random_tower(config, dtype, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    tree: dict = {}
    for name, shape in vision_expected_shapes(config).items():
        scale = 1.0 if "norm" in name else 0.02
        value = rng.standard_normal(shape, dtype=np.float32) * scale
        add_vision_tensor(tree, name[len(VISION_PREFIX):], jnp.asarray(value, dtype))
    return tree


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[448, 1344])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    config = presets.PRESETS["qwen3.5-27b"].vision
    params = random_tower(config, jnp.dtype(args.dtype))
    encode = jax.jit(tower.encode, static_argnames="config")
    rows = []
    for size in args.sizes:
        side = size // config.patch_size
        grids = [(1, side, side)]
        pixels = np.random.default_rng(1).standard_normal(
            (grid.num_patches(grids), config.patch_dim), dtype=np.float32)
        inputs = grid.vision_inputs(pixels, grids, config)
        jax.block_until_ready(encode(params, inputs, config=config))
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            jax.block_until_ready(encode(params, inputs, config=config))
            times.append(time.perf_counter() - started)
        row = {"bench": "vision_encode", "size": size, "patches": grid.num_patches(grids),
               "tokens": grid.num_tokens(grids[0], config), "dtype": args.dtype,
               "seconds": round(statistics.median(times), 5),
               "device": str(jax.devices()[0].device_kind),
               "command": "python3 benchmarks/vision_encode_bench.py " + " ".join(argv or sys.argv[1:])}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        with open(f"{args.out}/vision_encode.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
