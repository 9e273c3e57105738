"""What `ninfer inspect-artifact` reports: metadata, components and the tensor inventory read
from the checkpoint's metadata (no array data is loaded)."""
from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from ninfer_jax.artifact import weights_io
from ninfer_jax.artifact.format import (WEIGHTS_DIR, load_artifact, tensor_group)
from ninfer_jax.errors import ArtifactError


def describe_artifact(path: str | pathlib.Path) -> dict[str, Any]:
    """A JSON-ready report: metadata, tensors (name, shape, dtype, format, bytes), totals."""
    artifact = load_artifact(path, weights=False)
    try:
        tensors = weights_io.inventory(artifact.path / WEIGHTS_DIR)
    except Exception as exc:
        raise ArtifactError(artifact.path / WEIGHTS_DIR,
                            f"corrupt checkpoint (metadata unreadable: {exc})") from None
    formats = artifact.weight_formats
    rows = [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype,
             "format": formats.get(_weight_name_group(t.name, artifact), "f32"),
             "bytes": t.num_bytes} for t in tensors]
    parameters = sum(int(np.prod(s)) for s in artifact.config.expected_shapes().values())
    return {"path": str(artifact.path), "metadata": artifact.metadata, "tensors": rows,
            "totals": {"tensors": len(rows), "parameters": parameters,
                       "bytes": sum(r["bytes"] for r in rows)}}


def _weight_name_group(name: str, artifact) -> str:
    # A quantized weight's arrays are named `<weight>.<part>`: group by the weight's name.
    for weight in (name, name.rsplit(".", 1)[0]):
        if weight in artifact.config.expected_shapes():
            return tensor_group(weight)
    return tensor_group(name)


def format_report(report: dict[str, Any]) -> str:
    """The readable form: a metadata header, then one aligned row per stored array."""
    metadata, totals = report["metadata"], report["totals"]
    config = metadata["config"]
    lines = [
        f"artifact      {report['path']}",
        f"name          {metadata.get('name')}",
        f"architecture  {metadata['architecture']} (format v{metadata['format_version']})",
        "config        " + ", ".join(f"{k}={v}" for k, v in config.items() if k != "architecture"),
        "weights       " + ", ".join(f"{k}={v}" for k, v in metadata["weight_formats"].items()),
        "components    " + ", ".join(k for k, on in metadata["components"].items() if on),
        f"chat format   {_chat_format_line(metadata['chat_format'])}",
        f"special       {_special_line(metadata['special_tokens'])}",
        f"source        {metadata.get('source')}",
    ]
    if metadata.get("notes"):
        lines.append(f"notes         {metadata['notes']}")
    lines += ["", *_table(report["tensors"]), "",
              f"total         {totals['tensors']} arrays, {totals['parameters']:,} parameters, "
              f"{_human_bytes(totals['bytes'])} ({totals['bytes']:,} bytes)"]
    return "\n".join(lines)


def _chat_format_line(chat_format: dict) -> str:
    reasoning = chat_format.get("reasoning")
    markers = f"{reasoning['open']}...{reasoning['close']}" if reasoning else "none"
    return (f"tools={chat_format.get('tool_call_format') or 'none'}, reasoning={markers}, "
            f"thinking by default={bool(chat_format.get('thinking_default'))}")


def _special_line(special: dict) -> str:
    return (f"bos={special.get('bos_id')}, eos={special['eos_ids']}, pad={special.get('pad_id')}, "
            f"add_bos={special.get('add_bos', False)}")


def _table(rows: list[dict]) -> list[str]:
    headers = ("tensor", "shape", "dtype", "format", "bytes")
    cells = [(r["name"], "[" + ", ".join(map(str, r["shape"])) + "]", r["dtype"], r["format"],
              f"{r['bytes']:,}") for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    render = lambda values: "  ".join(  # noqa: E731
        v.rjust(w) if i == 4 else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths)))
    return [render(headers), render(tuple("-" * w for w in widths)), *map(render, cells)]


def _human_bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{count} B"
        count /= 1024
    return f"{count:.1f} GiB"
