"""The child process of test_tensor_parallel.py: XLA's host platform split into 4 devices
(XLA_FLAGS must be set before JAX is imported, so this runs apart from the suite).

For each tiny random model and each tensor-parallel size it drives the real JaxRunner: two
prompts prefilled, then decode steps of both rows, greedy; then the logits of one more
decode step of the family's forward over the runner's own params and caches. A size written
"2ep" is TP 2 with the routed experts split by expert index (--expert-parallel). Prints one
JSON object: per model and size the tokens, the logits, and the shardings seen.
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4").strip()

import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ninfer_jax.artifact.presets import PRESETS, tiny_config  # noqa: E402
from ninfer_jax.artifact.random_init import random_params  # noqa: E402
from ninfer_jax.engine.request import SamplingParams  # noqa: E402
from ninfer_jax.engine.runner import JaxRunner  # noqa: E402
from ninfer_jax.engine.runner_api import DecodeRow, PrefillUnit, SampleSpec  # noqa: E402
from ninfer_jax.model import steps  # noqa: E402
from ninfer_jax.model import tensor_parallel as tp  # noqa: E402

PAGE_SIZE = 8
DECODE_STEPS = 4
PROMPTS = ([5, 17, 300, 42, 9, 1000, 77, 3, 12, 600, 8, 250, 31], [900, 4, 4, 61, 7, 2000])


def model(name: str):
    """(config, numpy params) of a tiny model with heads 8 / kv heads 4 (TP 4 divides).
    moe and glm: the qwen3.6-tiny-moe and glm4.5-tiny presets (8 experts, top 2, a shared
    expert; glm's first layer dense), same head counts."""
    preset = {"llama": "llama3-8b", "qwen3": "qwen3-8b", "hybrid": "qwen3.5-27b",
              "moe": "qwen3.6-tiny-moe", "glm": "glm4.5-tiny"}[name]
    config = dataclasses.replace(tiny_config(PRESETS[preset].config), num_heads=8,
                                 num_kv_heads=4, head_dim=8, mtp_num_layers=0,
                                 vocab_size=4096, mrope_section=())  # text only
    if name == "qwen3":  # qk-norm, tied: the head is the vocabulary-parallel table
        config = dataclasses.replace(config, tie_word_embeddings=True)
    if name == "llama":  # an odd vocabulary: embed and lm_head replicated
        config = dataclasses.replace(config, vocab_size=4001)
    if name in ("hybrid", "moe"):  # an odd vocabulary too: embed (and head) replicated
        config = dataclasses.replace(config, vocab_size=4001, linear_num_key_heads=4,
                                     linear_num_value_heads=8)
    params = random_params(config, seed=3, dtype="f32")
    if config.tie_word_embeddings:  # a unit-variance table as the head saturates the logits
        params["embed"] = params["embed"] * np.float32(0.05)
    return config, params


class Loaded:
    def __init__(self, config, params):
        self.config, self.params = config, params


def run(config, params, size: str) -> dict:
    runner = JaxRunner(Loaded(config, params), num_pages=12, page_size=PAGE_SIZE, max_batch=2,
                       max_context=64, prefill_chunk=16, step_shapes="essential",
                       tensor_parallel=int(size.removesuffix("ep")),
                       expert_parallel=size.endswith("ep"))
    runner.compile_shapes([(16, 2)])  # one executable serves the prefills and the decodes
    greedy = SamplingParams(temperature=0.0)
    tables = [np.array([1, 2, 3, 4], np.int32), np.array([5, 6, 7, 8], np.int32)]
    slots = [1, 2] if config.is_hybrid else [0, 0]
    tokens = [[], []]
    for i, prompt in enumerate(PROMPTS):
        unit = PrefillUnit(seq_id=i, tokens=np.array(prompt, np.int32) % config.vocab_size,
                           start=0,
                           page_table=tables[i], sample=SampleSpec(greedy, 0),
                           state_slot=slots[i])
        tokens[i].append(runner.prefill(unit))
    for step in range(DECODE_STEPS):
        rows = [DecodeRow(seq_id=i, token=tokens[i][-1],
                          position=len(PROMPTS[i]) + step, page_table=tables[i],
                          sample=SampleSpec(greedy, step + 1), state_slot=slots[i])
                for i in range(2)]
        for i, token in enumerate(runner.decode(rows)):
            tokens[i].append(int(token))
    logits = next_logits(runner, config, tokens, tables, slots)
    leaves = jax.tree.leaves(runner.kv)
    kv_leaf = leaves[0]
    hlo = runner._executables[(16, 2)].as_text()
    experts = [leaf for layer in runner.params["layers"] for name, leaf in layer.items()
               if name in tp.EXPERT_LEAVES or name in tp.EXPERT_LEAVES.values()]
    # The routed experts' bytes, whole and on the first device. One device folds a gated
    # shared expert in as expert E (model/fused_projections.py): it is not counted.
    def routed(leaf, nbytes):
        return nbytes * config.num_experts // leaf.shape[0]

    return {"tokens": tokens, "logits": np.asarray(logits).tolist(),
            "expert_bytes": [sum(routed(leaf, leaf.nbytes) for leaf in experts),
                             sum(routed(leaf, leaf.addressable_shards[0].data.nbytes)
                                 for leaf in experts)],
            "expert_shapes": [list(leaf.shape) for leaf in experts],
            "gathered_shapes": [gathered_shape(line) for line in hlo.splitlines()
                                if " all-gather(" in line],
            "cache_shapes": [[list(leaf.shape), list(leaf.addressable_shards[0].data.shape)]
                             for leaf in leaves],
            "devices": len(kv_leaf.sharding.device_set),
            "collectives": {op: hlo.count(f" {op}(") for op in
                            ("all-reduce", "all-gather", "all-to-all", "collective-permute")}}


def gathered_shape(line: str) -> list[int]:
    """The result dims of an HLO all-gather line (`%x = f32[64,4096]{1,0} all-gather(...`)."""
    dims = line.split("= ", 1)[1].split("[", 1)[1].split("]", 1)[0]
    return [int(d) for d in dims.split(",") if d]


def next_logits(runner, config, tokens, tables, slots):
    """The f32 logits [2, V] of one more decode step of both rows: the family's forward
    (the one inside the runner's step) over the runner's params and caches, same mesh."""
    family = steps.FAMILIES[config.architecture]
    positions = np.array([len(p) + DECODE_STEPS for p in PROMPTS], np.int32)
    extra = (jnp.array(slots, jnp.int32),) if config.is_hybrid else ()
    forward = jax.jit(family.decode, static_argnames=("config", "page_size", "mesh"))
    logits, _ = forward(runner.params, runner.kv, jnp.array([t[-1] for t in tokens]),
                        positions, jnp.stack(tables), *extra, config=config,
                        page_size=PAGE_SIZE, mesh=runner.mesh)
    return logits


def restore(config, params, size: int, expert_parallel: bool = False) -> dict:
    """The params saved as an orbax checkpoint and restored straight into their shards
    (weights_io.restore_weights with the target shardings `serve --tensor-parallel` loads
    with), then placed by the runner's place_params as the runner does."""
    import functools
    import tempfile

    from ninfer_jax.artifact import weights_io
    from ninfer_jax.engine.runner import place_params
    from ninfer_jax.serve.engine_setup import _weight_shardings

    mesh = tp.make_mesh(size)
    with tempfile.TemporaryDirectory() as folder:
        directory = os.path.join(folder, "weights")
        weights_io.save_weights(directory, params)
        restored = weights_io.restore_weights(directory, shardings=functools.partial(
            _weight_shardings, mesh=mesh, expert_parallel=expert_parallel))

    def shapes(leaf):
        return [list(leaf.shape), list(leaf.addressable_shards[0].data.shape)]

    found = {"is_device_array": all(isinstance(leaf, jax.Array)
                                    for leaf in jax.tree.leaves(restored)),
             "equal": all(np.array_equal(np.asarray(a), b) for a, b in
                          zip(jax.tree.leaves(restored), jax.tree.leaves(params))),
             "wq": shapes(restored["layers"][0]["wq"])}
    if expert_parallel:  # place_params donates the restored layers: shapes first
        found["experts"] = shapes(restored["layers"][-1]["experts_down"])
        placed = place_params(restored, config, jnp.float32, mesh, expert_parallel=True)
        found["placed_experts"] = shapes(placed["layers"][-1]["experts_down_ep"])
    return found


def main(plan: list[str]) -> None:
    """plan: NAME=SIZE,SIZE,... per model, e.g. llama=1,2,4 qwen3=1,2ep (SIZE "2ep": TP 2
    with --expert-parallel); restore=SIZE checks a sharded restore of the qwen3 model's
    weights, restore_ep=SIZE one of the glm model's with its experts split by index"""
    results = {}
    for entry in plan:
        name, sizes = entry.split("=")
        if name in ("restore", "restore_ep"):
            results[name] = restore(*model("qwen3" if name == "restore" else "glm"),
                                    int(sizes), expert_parallel=name == "restore_ep")
            continue
        config, params = model(name)
        results[name] = {size: run(config, params, size) for size in sizes.split(",")}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
