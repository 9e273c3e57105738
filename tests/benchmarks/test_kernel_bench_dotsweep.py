"""benchmarks/kernel_bench.py's `dotsweep` section at a tiny size on the CPU (Pallas interpret
mode), so the device run does not die on a typo: the 4-bit formats are timed in both layouts,
every record carries a plausible error, and the layout switch is left as it was."""
from __future__ import annotations

import kernel_bench
from ninfer_jax.kernels.quant_matmul import kernel


def test_dotsweep_times_both_layouts_of_the_4bit_formats(records, monkeypatch):
    monkeypatch.setattr(kernel, "PACKED_LAYOUT", "interleave")  # not the default
    kernel_bench.dot_sweep_section(k=256, n=64, copies=1, fmts=("int4",), rows_list=(1, 8),
                                   configs=[(32, 128, 4, 3)], interpret=True, iters=1)
    assert all("error" not in row for row in records), [r for r in records if "error" in r]
    seen = {(row["fmt"], row["rows"], row["layout"], "use_dot=True" in row["tuning"])
            for row in records}
    for rows in (1, 8):
        assert {("int4", rows, layout, True)
                for layout in ("interleave", "halves", "halves+ptx")} <= seen
    assert ("int4", 1, "interleave", False) in seen  # the one-row FMA kernel beside them
    assert any("block_n=32" in row["tuning"] for row in records)  # the swept tile
    for row in records:
        assert row["us"] > 0 and row["err"] < 1e-2, row
    assert kernel.PACKED_LAYOUT == "interleave"  # the sweep puts the switches back
    assert kernel.NIBBLE_DECODE == "jnp"
