"""benchmarks/kernel_bench.py's `moe` section at a tiny size on the CPU (Pallas interpret
mode), so the device run does not die on a typo: both places of the activation and both
GEMVs are timed for a lone row and a padded one, the whole path matches the reference, and
the module's switch is left as it was."""
from __future__ import annotations

import kernel_bench
from ninfer_jax.kernels.moe import kernel
from ninfer_jax.kernels.moe.tuning import GemvTiles


def test_moe_section_times_both_activation_places_and_each_gemv(records, monkeypatch):
    monkeypatch.setattr(kernel, "ACTIVATION_AT", "down")  # not the default
    tiles = [GemvTiles(block_k=32, block_n=32, num_splits=2),
             GemvTiles(block_k=32, block_n=32, num_splits=2, use_dot=True)]
    kernel_bench.moe_section(shape=dict(hidden=64, width=32, experts=8, top_k=2),
                             rows_list=(1, 2), sweep_rows=(2,), routings=2, interpret=True,
                             iters=1, up_configs=tiles, down_configs=tiles)
    assert all("error" not in row for row in records), [r for r in records if "error" in r]
    seen = {(row["rows"], row["part"], row.get("activation_at")) for row in records}
    for rows in (1, 2):
        assert {(rows, "experts", "fusion"), (rows, "experts", "down"),
                (rows, "gate_up", None), (rows, "down", None)} <= seen
    for row in records:
        assert row["us"] > 0 and row["tbps"] > 0, row
        if row["part"] == "experts":
            assert row["err"] < 1e-2, row
    assert kernel.ACTIVATION_AT == "down"  # the section puts the switch back


def test_moe_gemv_configs_keep_the_tuned_tile_first_and_vary_splits():
    tuned = GemvTiles(block_k=64, block_n=128, num_splits=8)
    configs = kernel_bench._moe_gemv_configs(tuned, 16, 2048, 1024)
    assert configs[0] == tuned and len(set(configs)) == len(configs)
    assert {c.num_splits for c in configs if (c.block_k, c.block_n) == (64, 128)} >= {1, 2, 4, 8,
                                                                                      16, 32}
    assert all(2048 % c.block_k == 0 and 1024 % c.block_n == 0 for c in configs)
    dots = [c for c in configs if c.use_dot]
    assert {(c.num_stages, c.num_warps) for c in dots} >= {(s, w) for s in (1, 2, 3)
                                                            for w in (4, 8)}
    assert all(c.use_dot is None for c in configs if not c.use_dot)  # the rest follow the switch
