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


def test_decode_digest_repeats_with_the_tokens_and_changes_with_them(float_artifact):
    """time_decode's digest of the sampled tokens: the same steps again give the same one (so
    A/B arms that only reschedule the arithmetic, XLA flags such as PDL, can be checked by
    it); other tokens give another."""
    from ninfer_jax.engine.runner import JaxRunner

    runner = JaxRunner(runner_bench.load(float_artifact, None), num_pages=16, max_batch=2,
                       max_context=64, prefill_chunk=16)
    runs = [runner_bench.time_decode(runner, 2, 20, 6, pipelined=True)[2] for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 16
    assert runner_bench.time_decode(runner, 2, 20, 7, pipelined=True)[2] != runs[0]
    # the synchronous loop feeds every step the same token instead of the last sample
    assert runner_bench.time_decode(runner, 2, 20, 6, pipelined=False)[2] != runs[0]
