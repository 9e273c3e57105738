"""SHA-256 checksums of an artifact's data files, kept in metadata.json under `checksums`.

`save_artifact` records one digest per file of weights/ (and mtp/), tokenizer.json and
chat_template.jinja after writing them; `load_artifact(..., verify=True)` recomputes them
while it reads the weights, so a damaged or half-copied file is an ArtifactError naming the
file instead of a server that talks garbage. Hashing reads every byte once (about 1 s per
GB a core); the files are hashed in parallel and beside the weights' restore
(`verify_in_background`), so on a machine with cores to spare verifying adds little to
start-up. Huge artifacts can skip it (`ninfer serve --no-verify-checksums`). Artifacts written
before checksums existed have none and load unverified.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import pathlib
from typing import Callable

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


def verify_in_background(directory: pathlib.Path, checksums: dict | None,
                         display: pathlib.Path) -> Callable[[], None]:
    """Start hashing every listed file (a thread per file, up to the cores; hashlib drops
    the GIL while it hashes) and return the wait: it raises an ArtifactError for the first
    listed file that is missing or differs."""
    if not checksums:
        return lambda: None
    recorded = checksums.get(ALGORITHM)
    if not isinstance(recorded, dict):
        raise ArtifactError(display / "metadata.json", f"checksums must hold {ALGORITHM!r}")
    workers = max(1, min(len(recorded), os.cpu_count() or 1, 16))
    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="ninfer-sha")
    digests = {rel: pool.submit(_digest_if_file, directory / rel) for rel in recorded}
    pool.shutdown(wait=False)

    def wait() -> None:
        for rel, expected in recorded.items():  # listed order: the first bad file is named
            found = digests[rel].result()
            if found is None:
                raise ArtifactError(display / rel, "missing (listed in checksums)")
            if found != expected:
                raise ArtifactError(display / rel, "checksum mismatch: the file is damaged or "
                                    "was changed after conversion (copy or convert it again)")
    return wait


def _digest_if_file(path: pathlib.Path) -> str | None:
    return digest(path) if path.is_file() else None
