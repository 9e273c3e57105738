"""benchmarks/kernel_bench.py's `skinny` section at a tiny size on the CPU (Pallas interpret
mode), so the device run does not die on a typo: every shape, row count and tiling gives a
record with a time and an error against XLA's product; a tiling that fits nothing is
skipped; the real section's tilings all fit the 8B's projections."""
from __future__ import annotations

import kernel_bench
from ninfer_jax.kernels.skinny_matmul.kernel import skinny_tiles


def test_skinny_section_records_every_shape_rows_and_tiling(records):
    kernel_bench.skinny_section(shapes={"small": (128, 64)}, rows_list=(1, 3), copies=2,
                                configs=[(32, 32, 4, 1, 4), (64, 32, 4, 1, 2)],
                                interpret=True, iters=1)
    assert all("error" not in row for row in records), [r for r in records if "error" in r]
    seen = {(row["rows"], row["tuning"]) for row in records}
    assert len(seen) == len(records) and {r for r, _ in seen} == {1, 3}
    assert len({t for _, t in seen}) == 3  # the default tiles and the two given
    for row in records:
        assert row["us"] > 0 and row["tbps"] > 0 and row["err"] < 1e-2, row


def test_every_skinny_tiling_fits_the_8b_projections():
    for k, n in kernel_bench.SKINNY_SHAPES.values():
        for bk, bn, warps, stages, target in kernel_bench.SKINNY_TILES:
            assert skinny_tiles(k=k, n=n, block_k=bk, block_n=bn, num_warps=warps,
                                num_stages=stages, target_programs=target) is not None
