"""A minimal reader of .safetensors files into numpy (bf16 via ml_dtypes), memory-mapped.

The format is an 8-byte little-endian header length, a JSON header mapping tensor names to
{dtype, shape, data_offsets}, then the raw little-endian data. Reading it directly keeps the
`safetensors` package out of the runtime dependencies.
"""
from __future__ import annotations

import json
import pathlib
import struct

import numpy as np

from ninfer_jax.errors import ArtifactError

_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
           "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
           "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _numpy_dtype(name: str) -> np.dtype:
    if name not in _DTYPES:
        raise ValueError(f"unsupported safetensors dtype {name}")
    try:
        return np.dtype(_DTYPES[name])
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _DTYPES[name]))


class SafetensorsFile:
    def __init__(self, path: pathlib.Path):
        self.path = pathlib.Path(path)
        try:
            with open(self.path, "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(header_len))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ArtifactError(self.path, f"not a readable safetensors file ({exc})") from None
        header.pop("__metadata__", None)
        self._header = header
        self._data_start = 8 + header_len
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")

    def names(self) -> list[str]:
        return list(self._header)

    def get(self, name: str) -> np.ndarray:
        entry = self._header[name]
        start, end = entry["data_offsets"]
        raw = self._map[self._data_start + start:self._data_start + end]
        try:
            dtype = _numpy_dtype(entry["dtype"])
        except ValueError as exc:
            raise ArtifactError(self.path, f"tensor {name}: {exc}") from None
        return raw.view(dtype).reshape(entry["shape"])


def write_safetensors(path: pathlib.Path, tensors: dict[str, np.ndarray]) -> None:
    """Write numpy arrays as a .safetensors file (used by tests and tools)."""
    reverse = {v: k for k, v in _DTYPES.items()}
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": reverse[str(array.dtype)], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    encoded = json.dumps(header).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for blob in blobs:
            f.write(blob)
