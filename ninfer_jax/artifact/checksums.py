"""SHA-256 checksums of an artifact's data files, kept in metadata.json under `checksums`.

`save_artifact` records one digest per file of weights/ (and mtp/), tokenizer.json and
chat_template.jinja after writing them; `load_artifact(..., verify=True)` recomputes them
when it reads the weights, so a damaged or half-copied file is an ArtifactError naming the
file instead of a server that talks garbage. Hashing reads every byte once (about 1 s per
GB); huge artifacts can skip it (`ninfer serve --no-verify-checksums`). Artifacts written
before checksums existed have none and load unverified.
"""
from __future__ import annotations

import hashlib
import pathlib

from ninfer_jax.errors import ArtifactError

ALGORITHM = "sha256"


def data_files(directory: pathlib.Path, names: tuple[str, ...]) -> list[str]:
    """Relative paths (POSIX) of every file under `names` in `directory`, sorted."""
    found = []
    for name in names:
        path = directory / name
        if path.is_file():
            found.append(name)
        elif path.is_dir():
            found.extend(sorted(p.relative_to(directory).as_posix()
                                for p in path.rglob("*") if p.is_file()))
    return found


def digest(path: pathlib.Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, ALGORITHM).hexdigest()


def compute(directory: pathlib.Path, names: tuple[str, ...]) -> dict:
    """The `checksums` member of metadata.json for these files."""
    return {ALGORITHM: {rel: digest(directory / rel) for rel in data_files(directory, names)}}


def verify(directory: pathlib.Path, checksums: dict | None, display: pathlib.Path) -> None:
    """ArtifactError for the first listed file that is missing or differs."""
    if not checksums:
        return
    recorded = checksums.get(ALGORITHM)
    if not isinstance(recorded, dict):
        raise ArtifactError(display / "metadata.json", f"checksums must hold {ALGORITHM!r}")
    for rel, expected in recorded.items():
        path = directory / rel
        if not path.is_file():
            raise ArtifactError(display / rel, "missing (listed in checksums)")
        if digest(path) != expected:
            raise ArtifactError(display / rel, "checksum mismatch: the file is damaged or was "
                                "changed after conversion (copy or convert it again)")
