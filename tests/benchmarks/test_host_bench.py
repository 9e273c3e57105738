"""benchmarks/host_bench.py keeps up with JaxRunner's host half (it calls its _host_batch)."""
import host_bench


def test_a_few_rounds_run_and_report_the_host_time():
    result = host_bench.run(8, prompt=16, steps=5, profile=False)
    assert result["rows"] == 8 and result["host_ms_per_step"] > 0
