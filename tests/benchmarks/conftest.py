"""The benchmark scripts are not a package: their folder goes on sys.path for these tests."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.fixture
def records(tmp_path, monkeypatch):
    """kernel_bench's records of one test, written under tmp_path instead of the results file."""
    import kernel_bench

    monkeypatch.setattr(kernel_bench.rec, "path", str(tmp_path / "kernel_bench.jsonl"))
    monkeypatch.setattr(kernel_bench.rec, "rows", [])
    return kernel_bench.rec.rows
