"""benchmarks/runner_bench.py loads a float artifact quantized, as `ninfer serve --weights`."""
import pathlib
import sys

import numpy as np
import pytest

import runner_bench
from ninfer_jax.artifact.format import save_artifact
from ninfer_jax.kernels.quant_matmul.formats import format_of

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "artifact"))

from tiny_artifacts import tiny_config, tiny_contents  # noqa: E402


@pytest.fixture(scope="module")
def float_artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("runner_bench") / "tiny.ninfer"
    return save_artifact(path, tiny_contents(tiny_config(num_layers=2)))


def test_weights_quantize_the_projections_at_load(float_artifact):
    plain = runner_bench.load(float_artifact, None)
    quantized = runner_bench.load(float_artifact, "int8")
    layer, stored = quantized.params["layers"][0], plain.params["layers"][0]
    assert not isinstance(stored["wo"], dict)
    assert format_of(layer["wo"]) in ("int8", "int8_nk")  # W8A8 transposes at load on a GPU
    codes = np.asarray(layer["wo"][format_of(layer["wo"])])
    assert codes.dtype == np.int8 and np.abs(codes).max() == 127  # per-channel scale
    # the norms stay float
    assert np.asarray(layer["attn_norm"]).dtype == np.asarray(stored["attn_norm"]).dtype


def test_weights_refuse_an_artifact_already_quantized(float_artifact, tmp_path):
    from ninfer_jax.artifact import convert_common

    path = save_artifact(tmp_path / "int8.ninfer", convert_common.apply_quantization(
        tiny_contents(tiny_config(num_layers=2)), "int8"))
    with pytest.raises(SystemExit, match="already int8"):
        runner_bench.load(path, "fp8")
