"""benchmarks/multiturn_bench.py on the fake runner: the three modes see the same workload
and answers, the accounting adds up, and the host tier saves what the device pool evicts."""
from __future__ import annotations

import json

import pytest

import multiturn_bench


def test_three_modes_one_workload(capsys):
    records = multiturn_bench.main(["--fake", "--conversations", "4", "--turns", "4"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == records
    none, device, tiered, summary = records
    assert [r["mode"] for r in records[:3]] == ["no_prefix_reuse", "device_only", "device_host"]
    assert len({r["prompt_tokens"] for r in records[:3]}) == 1  # the same prompts each time
    assert none["cached_tokens"] == 0 and none["prefilled_tokens"] == none["prompt_tokens"]
    for record in records[:3]:
        assert record["requests"] == 16 and record["ttft_p50_ms"] <= record["ttft_p99_ms"]
        assert record["cached_tokens"] + record["prefilled_tokens"] == record["prompt_tokens"]
        assert record["hit_rate"] == round(record["cached_tokens"] / record["prompt_tokens"], 4)
    assert device["spilled_pages"] == 0 and tiered["loaded_pages"] > 0
    assert tiered["prefilled_tokens"] < device["prefilled_tokens"] < none["prefilled_tokens"]
    assert summary["outputs_match"] is True
    assert summary["prefill_ratio_device_over_host"] == round(
        device["prefilled_tokens"] / tiered["prefilled_tokens"], 2)


def test_a_workload_that_fits_the_pool_is_refused():
    with pytest.raises(SystemExit):
        multiturn_bench.main(["--fake", "--conversations", "1", "--turns", "1",
                              "--kv-capacity", "4096"])
