"""benchmarks/kernel_bench.py's `w8a8` section at tiny sizes on the CPU, so the device run does
not die on a typo: every variant produces a timed record (no error rows) with a plausible
error against the bf16 product."""
from __future__ import annotations

import kernel_bench


def test_w8a8_section_records_every_variant(records):
    kernel_bench.w8a8_section(shapes=[(256, 128)], rows=(1, 3, 65), copies=2)
    assert all("error" not in row for row in records), [r for r in records if "error" in r]
    names = {(r["rows"], r["variant"], r["fmt"], r["layout"]) for r in records}
    for rows in (1, 3, 65):
        assert (rows, "xla_bf16", "bf16", "kn") in names
        for fmt in ("fp8", "int8"):
            assert {(rows, "w8a8", fmt, "nk"), (rows, "w8a8", fmt, "kn"),
                    (rows, "gemm_only", fmt, "nk")} <= names
            assert ((rows, "pallas_weight_only", fmt, "kn") in names) == (rows <= 64)
        assert (rows, "w8a8_bf16_sums", "fp8", "nk") in names
    for row in records:
        assert row["us"] > 0 and row["weight_tbps"] > 0
        # 8-bit rounding of weights and activations: e4m3 keeps 3 mantissa bits (each value
        # within 2^-4 of itself), int8 steps of max / 127; gemm_only has no scales applied
        if row["variant"] != "gemm_only":
            assert row["err"] < (0.06 if row["fmt"] == "fp8" else 0.02), row
        if row["fmt"] != "bf16":
            assert isinstance(row["custom_calls"], list) and "weight_relayout" in row
    assert len(open(kernel_bench.rec.path).read().splitlines()) == len(records)


def test_w8a8_sections_are_registered():
    assert kernel_bench.SECTIONS["w8a8"] is kernel_bench.w8a8_section
    for name, shape in kernel_bench.W8A8_SHAPES.items():
        assert kernel_bench.SECTIONS[f"w8a8-{name}"].keywords == {"shapes": [shape]}
