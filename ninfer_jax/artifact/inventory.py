"""What `ninfer inspect-artifact` reports: metadata, components, the tensor inventory read
from the checkpoints' metadata (weights/ and, when present, mtp/ and vision/; no array data is
loaded), a summary of the vision tower when there is one and model_report.py's summary of the
model's layers, attention, state, KV and MoE."""
from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from ninfer_jax.artifact import weights_io
from ninfer_jax.artifact.weights_io import human_bytes
from ninfer_jax.artifact.components import (MTP_DIR, MTP_PREFIX, VISION_DIR, VISION_PREFIX,
                                            mtp_expected_shapes, vision_expected_shapes)
from ninfer_jax.artifact.format import WEIGHTS_DIR, load_artifact
from ninfer_jax.artifact.model_report import format_model, model_summary
from ninfer_jax.artifact.tensor_groups import FLOAT_FORMATS, tensor_group
from ninfer_jax.errors import ArtifactError

_FLOAT_NAMES = {numpy_name: name for name, numpy_name in FLOAT_FORMATS.items()}


def describe_artifact(path: str | pathlib.Path) -> dict[str, Any]:
    """A JSON-ready report: metadata, tensors (name, shape, dtype, format, bytes), totals."""
    artifact = load_artifact(path, weights=False)
    config = artifact.config
    vision = artifact.vision_config
    vision_shapes = vision_expected_shapes(vision)
    expected = {**config.expected_shapes(), **mtp_expected_shapes(config), **vision_shapes}
    tensors = _inventory(artifact.path, WEIGHTS_DIR, "")
    if artifact.components.get("mtp"):
        tensors += _inventory(artifact.path, MTP_DIR, MTP_PREFIX)
    if vision:
        tensors += _inventory(artifact.path, VISION_DIR, VISION_PREFIX)
    rows = [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype,
             "format": _row_format(t, expected, artifact.weight_formats),
             "bytes": t.num_bytes} for t in tensors]
    report = {"path": str(artifact.path), "metadata": artifact.metadata, "tensors": rows,
              "totals": {"tensors": len(rows),
                         "parameters": sum(int(np.prod(s)) for s in expected.values()),
                         "bytes": sum(r["bytes"] for r in rows)}}
    if vision:
        report["vision"] = {**vision.to_dict(), "parameters": sum(
            int(np.prod(s)) for s in vision_shapes.values()), "mrope_section":
            list(config.mrope_section)}
    report["model"] = model_summary(config, artifact.weight_formats)
    return report


def _inventory(root: pathlib.Path, subdirectory: str, prefix: str) -> list:
    try:
        tensors = weights_io.inventory(root / subdirectory)
    except Exception as exc:
        raise ArtifactError(root / subdirectory,
                            f"corrupt checkpoint (metadata unreadable: {exc})") from None
    return [weights_io.TensorInfo(prefix + t.name, t.shape, t.dtype) for t in tensors]


def _row_format(tensor, expected: dict, weight_formats: dict[str, str]) -> str:
    """A plain array's format is its float dtype (projections kept in float inside a
    quantized group, such as stacked experts); a quantized weight's arrays, named
    `<weight>.<part>`, report their group's format."""
    if tensor.name in expected:
        return _FLOAT_NAMES.get(tensor.dtype, weight_formats.get(tensor_group(tensor.name), "f32"))
    return weight_formats.get(tensor_group(tensor.name.rsplit(".", 1)[0]), "f32")


def format_report(report: dict[str, Any]) -> str:
    """The readable form: a metadata header, then one aligned row per stored array."""
    metadata, totals = report["metadata"], report["totals"]
    config = metadata["config"]
    lines = [
        f"artifact      {report['path']}",
        f"name          {metadata.get('name')}",
        f"architecture  {metadata['architecture']} (format v{metadata['format_version']})",
        "config        " + ", ".join(f"{k}={v}" for k, v in config.items()
                                     if k not in ("architecture", "layer_types")),
        *format_model(report["model"]),
        *([_vision_line(report["vision"])] if "vision" in report else ()),
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
              f"{human_bytes(totals['bytes'])} ({totals['bytes']:,} bytes)"]
    return "\n".join(lines)


def _vision_line(vision: dict) -> str:
    deepstack = ",".join(map(str, vision["deepstack_layers"])) or "none"
    return (f"vision        {vision['depth']} blocks of {vision['hidden_size']} "
            f"({vision['num_heads']} heads), patch {vision['patch_size']}x"
            f"{vision['patch_size']}x{vision['temporal_patch_size']}, merge "
            f"{vision['spatial_merge_size']}, deepstack taps {deepstack}, "
            f"{vision['parameters']:,} parameters, MRoPE {vision['mrope_section']} "
            "(vision component, loaded with --vision)")


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
