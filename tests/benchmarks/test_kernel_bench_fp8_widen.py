"""benchmarks/kernel_bench.py's `kvsweep` and `gemvsweep` sections at tiny sizes on the CPU
(Pallas interpret mode), so the device run does not die on a typo: every variant, fp8 with each
widening included, gives a timed record tagged with its widening and a plausible error, and
the kernels' switches are left as they were."""
from __future__ import annotations

import kernel_bench
from ninfer_jax.kernels.paged_attention import kernel as attn_kernel
from ninfer_jax.kernels.quant_matmul import gemv


FP8_RECORDS = {("float8_e4m3fn", widen) for widen in attn_kernel.FP8_WIDEN_CHOICES}


def check_kv_records(records):
    assert all("error" not in row for row in records), [r for r in records if "error" in r]
    for row in records:
        assert row["us"] > 0 and row["path"] == "pallas"
        # against the reference over the same pages (bf16 queries); one e4m3 term rounds the
        # query and the probabilities to 4 significant bits
        assert row["err"] < (6e-2 if row.get("widen") == "e4m3" else 2e-2), row
    return {(row["kv_dtype"], row.get("widen")) for row in records}


def test_kvsweep_times_fp8_pages_with_each_widening(records, monkeypatch):
    monkeypatch.setattr(attn_kernel, "FP8_WIDEN", "bfloat16")  # not the last one swept
    kernel_bench.kv_sweep_section(batch=1, context=64, configs=[(64, 2, 1)], interpret=True,
                                  iters=1)
    assert check_kv_records(records) == {("bfloat16", None), ("int8", None), *FP8_RECORDS}
    assert attn_kernel.FP8_WIDEN == "bfloat16"  # the sweep puts the switch back


def test_kv8_times_fp8_pages_with_each_widening(records, monkeypatch):
    monkeypatch.setattr(attn_kernel, "FP8_WIDEN", "bfloat16")
    kernel_bench.kv8_section(shapes=[(2, 48, 64)], interpret=True, iters=1)
    assert check_kv_records(records) == {("bfloat16", None), ("int8", None), *FP8_RECORDS}
    assert attn_kernel.FP8_WIDEN == "bfloat16"


def test_gemvsweep_times_fp8_codes_widened_both_ways(records, monkeypatch):
    monkeypatch.setattr(gemv, "FP8_WIDEN", "float32")  # not the last one swept
    kernel_bench.gemv_sweep_section(k=256, n=256, copies=1, interpret=True, iters=1)
    assert all("error" not in row for row in records), [r for r in records if "error" in r]
    pallas = {(row["fmt"], row.get("widen")) for row in records if row["path"] == "pallas"}
    assert pallas == {("bf16", None), ("int8", None), ("fp8", "float32"), ("fp8", "float16")}
    for row in records:
        assert row["us"] > 0
        if row["path"] == "pallas":
            assert row["err"] < 1e-2, row  # the kernel against the f32 product of its codes
    assert gemv.FP8_WIDEN == "float32"  # the sweep puts the switch back
