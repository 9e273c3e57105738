"""The benchmark scripts are not a package: their folder goes on sys.path for these tests."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
