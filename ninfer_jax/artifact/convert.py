"""`ninfer convert`: pick the converter for a source (GGUF file or Hugging Face directory)
and write the artifact atomically."""
from __future__ import annotations

import os
import pathlib

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact.format import ArtifactContents, save_artifact
from ninfer_jax.errors import ArtifactError


def read_source(src: str | os.PathLike, *, name: str | None = None, dtype: str = "f32",
                progress: common.ProgressFn | None = None) -> ArtifactContents:
    if dtype not in common.DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {common.DTYPES}")
    src = pathlib.Path(src)
    if src.is_file():
        from ninfer_jax.artifact.gguf_convert import convert_gguf

        return convert_gguf(src, name=name, dtype=dtype, progress=progress)
    if src.is_dir():
        from ninfer_jax.artifact.hf_convert import convert_hf

        return convert_hf(src, name=name, dtype=dtype, progress=progress)
    raise ArtifactError(src, "no such file or directory (expected a .gguf file or a Hugging "
                             "Face checkpoint directory)")


def convert(src: str | os.PathLike, out: str | os.PathLike, *, name: str | None = None,
            dtype: str = "f32", overwrite: bool = False,
            progress: common.ProgressFn | None = None) -> pathlib.Path:
    """Convert SRC into the artifact directory OUT; returns OUT's absolute path."""
    out = pathlib.Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --force to replace it)")
    contents = read_source(src, name=name, dtype=dtype, progress=progress)
    return save_artifact(out, contents, overwrite=overwrite)
