"""benchmarks/kernel_bench.py's `splits` section at a tiny size on the CPU (Pallas interpret
mode), so the device run does not die on a typo: the default and each distinct tuning of the
grid (splits over the table or following the rows) are timed once, every one matches the
reference, and more programs mean more splits."""
from __future__ import annotations

import re

import kernel_bench


def test_splits_section_times_each_distinct_tuning_once(records):
    kernel_bench.splits_sweep_section(shapes=((2, 48),), table_context=256, targets=(16, 64, 256),
                                      min_splits=(16, 32), blocks=(16,), warps=(2,),
                                      follow=(False, True), interpret=True, iters=1)
    assert all("error" not in row for row in records), [r for r in records if "error" in r]
    assert [row["tag"] for row in records][0] == "splits-default"
    swept = [row for row in records if row["tag"] == "splits"]
    tunings = [row["tuning"] for row in swept]
    assert len(tunings) == len(set(tunings)) >= 3
    for row in records:
        assert row["us"] > 0 and row["err"] < 1e-2, row
        assert (row["batch"], row["context"], row["table_context"]) == (2, 48, 256)
    splits = {int(re.search(r"num_splits=(\d+)", t).group(1)) for t in tunings}
    assert max(splits) > min(splits)
    assert {"follow_length=True" in t for t in tunings} == {True, False}
