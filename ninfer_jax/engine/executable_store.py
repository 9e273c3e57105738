"""ExecutableStore: compiled step executables kept on disk, loaded without tracing.

JAX's persistent compilation cache skips XLA's compile on a restart but not the tracing that
computes its key: for an 8B model each step shape still costs seconds of Python before the
cache is even consulted (run 7: 9.7 s for the three shapes a GPU server needs to be ready).
This store serialises each compiled executable (jax.experimental.serialize_executable) under
a key that names everything the executable depends on, so a restart deserialises it
directly. Anything unreadable or stale is ignored and compiled again.

The key covers: the JAX/jaxlib versions, the backend and device kind, the model config, the
params tree (names, shapes, dtypes), the KV cache shapes, every static argument and the
step's shape, a hash of the source of the code that is traced into the step (model/,
kernels/, this package's runner), so editing the model never loads an old executable, and the
environment switches read while tracing (TRACE_ENV), so an A/B run under an override never
loads the executable traced without it.
Files live under $JAX_COMPILATION_CACHE_DIR/ninfer-executables (no directory: no store).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pathlib
import pickle
import tempfile

log = logging.getLogger(__name__)

PACKAGE = pathlib.Path(__file__).resolve().parents[1]
TRACED_SOURCES = ("model", "kernels", "engine/runner.py")
# Read by kernels/ at trace time: each changes the traced step (kernels/dispatch.py,
# kernels/gated_delta, kernels/quant_matmul). Run 36 lost its A/B to their absence here.
TRACE_ENV = ("NINFER_FORCE_REFERENCE", "NINFER_GDN_PREFILL", "NINFER_GDN_ROWS_KERNEL",
             "NINFER_GDN_FUSED_ROWS", "NINFER_MOE_ROUTER_KERNEL", "NINFER_MOE_GEMV_DOT",
             "NINFER_W8A8", "NINFER_DECODE_MERGE_VECTOR", "NINFER_GDN_FUSED_GATES",
             "NINFER_ADD_NORM_KERNEL", "NINFER_ATTENTION_PROLOGUE", "NINFER_SKINNY_MATMUL",
             "NINFER_MOE_FUSED_MLP", "NINFER_DECODE_FOLLOW_LENGTH",
             "NINFER_DECODE_DIRECT_OUTPUT")


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 of every source file whose code is traced into a step."""
    digest = hashlib.sha256()
    for part in TRACED_SOURCES:
        path = PACKAGE / part
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(PACKAGE)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


class ExecutableStore:
    def __init__(self, directory: str | os.PathLike, fingerprint: dict):
        self.directory = pathlib.Path(directory)
        fingerprint = dict(fingerprint, source=source_hash(),
                           env={name: os.environ.get(name) for name in TRACE_ENV})
        self._base = hashlib.sha256(
            json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()

    @classmethod
    def from_environment(cls, fingerprint: dict) -> "ExecutableStore | None":
        cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
        return cls(pathlib.Path(cache) / "ninfer-executables", fingerprint) if cache else None

    def _path(self, shape) -> pathlib.Path:
        key = hashlib.sha256(f"{self._base}:{shape}".encode()).hexdigest()
        return self.directory / f"{key}.exe"

    def load(self, shape):
        """The stored executable for `shape`, or None."""
        path = self._path(shape)
        if not path.exists():
            return None
        from jax.experimental import serialize_executable

        try:
            payload, in_tree, out_tree = pickle.loads(path.read_bytes())
            return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        except Exception as exc:  # stale or damaged: compile again (and overwrite)
            log.warning("stored step executable %s unusable (%s); compiling", path.name, exc)
            return None

    def save(self, shape, compiled) -> None:
        from jax.experimental import serialize_executable

        try:
            blob = pickle.dumps(serialize_executable.serialize(compiled))
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.directory, delete=False) as handle:
                handle.write(blob)
            os.replace(handle.name, self._path(shape))  # atomic: readers see whole files
        except Exception as exc:  # the store is an optimisation: never fail a compile
            log.warning("could not store the step executable for %s: %s", shape, exc)
