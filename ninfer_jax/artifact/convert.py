"""`ninfer convert`: pick the converter for a source (GGUF file or Hugging Face directory)
and write the artifact atomically."""
from __future__ import annotations

import os
import pathlib

from ninfer_jax.artifact import convert_common as common
from ninfer_jax.artifact.format import ArtifactContents, save_artifact
from ninfer_jax.errors import ArtifactError


def read_source(src: str | os.PathLike, *, name: str | None = None, dtype: str | None = None,
                weights: str | None = None,
                progress: common.ProgressFn | None = None) -> ArtifactContents:
    """Contents of SRC: floats stored as `dtype`, projections quantized to `weights` if given."""
    if weights == common.GGUF_STORED:
        src = pathlib.Path(src)
        if not src.is_file():
            raise ArtifactError(src, "--weights gguf keeps a GGUF file's block formats; "
                                     "this is not a .gguf file")
        from ninfer_jax.artifact.gguf_convert import convert_gguf

        return convert_gguf(src, name=name, dtype=dtype or "f32", progress=progress,
                            keep_blocks=True)
    dtype, quantized = common.resolve_formats(dtype, weights)
    contents = _read_float_source(pathlib.Path(src), name, dtype, progress)
    return common.apply_quantization(contents, quantized, progress)


def _read_float_source(src: pathlib.Path, name: str | None, dtype: str,
                       progress: common.ProgressFn | None) -> ArtifactContents:
    if src.is_file():
        from ninfer_jax.artifact.gguf_convert import convert_gguf

        return convert_gguf(src, name=name, dtype=dtype, progress=progress)
    if src.is_dir():
        from ninfer_jax.artifact.hf_convert import convert_hf

        return convert_hf(src, name=name, dtype=dtype, progress=progress)
    raise ArtifactError(src, "no such file or directory (expected a .gguf file or a Hugging "
                             "Face checkpoint directory)")


def convert(src: str | os.PathLike, out: str | os.PathLike, *, name: str | None = None,
            dtype: str | None = None, weights: str | None = None, overwrite: bool = False,
            progress: common.ProgressFn | None = None, dflash: tuple = (),
            draft_head_vocab: int = 0) -> pathlib.Path:
    """Convert SRC into the artifact directory OUT; returns OUT's absolute path. SRC may also
    be a .ninfer artifact, read back whole, to add drafter components to it: `dflash`, public
    DFlash / DFlash2 checkpoint directories (artifact/drafters.py), and `draft_head_vocab`
    > 0, the reduced proposal head over token ids 0..N-1."""
    from ninfer_jax.artifact import drafters
    from ninfer_jax.artifact.format import METADATA_FILE, load_whole_artifact

    out = pathlib.Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --force to replace it)")
    if (pathlib.Path(src) / METADATA_FILE).is_file():
        if weights is not None:
            raise ArtifactError(src, "an artifact source only takes drafter components "
                                     "(--dflash DIR, --lm-head-draft-vocab N), not --weights")
        if not (dflash or draft_head_vocab):
            raise ArtifactError(src, "already an artifact: nothing to convert; give "
                                     "--dflash DIR or --lm-head-draft-vocab N to add a "
                                     "drafter component")
        contents = load_whole_artifact(src)
        if name:
            contents.name = name
        float_dtype = dtype or contents.weight_formats["embed"]
    else:
        contents = read_source(src, name=name, dtype=dtype, weights=weights, progress=progress)
        float_dtype = common.resolve_formats(dtype, weights)[0] if weights != \
            common.GGUF_STORED else dtype or "f32"
    for directory in dflash:
        config, tree = drafters.read_dflash(directory, float_dtype)
        drafters.add_drafter(contents, config, tree, float_dtype)
    if draft_head_vocab:
        drafters.add_draft_head(contents, draft_head_vocab)
    return save_artifact(out, contents, overwrite=overwrite)
