"""The .ninfer v3 artifact: a directory written atomically and validated on every load.

Layout (docs/artifact-format.md describes each field):
    metadata.json        format_version 3, name, architecture, config, weight_formats,
                         special_tokens, components, chat_format, source
    tokenizer.json       a `tokenizers` tokenizer
    chat_template.jinja  the default chat template
    weights/             orbax checkpoint of the text model's params (weights_io.py)
    mtp/                 orbax checkpoint of the MTP head, when components.mtp (components.py)
    dflash/, dflash2/    orbax checkpoints of the DFlash / DFlash2 drafters, when those
                         components are on; hyper-parameters in `dflash_config` /
                         `dflash2_config`
    draft_head/          orbax checkpoint of the reduced proposal head (--lm-head-draft), when
                         components.draft_head; its size in `draft_head_config`
    vision/              orbax checkpoint of the vision tower, when components.vision; its
                         hyper-parameters are metadata.json's `vision_config`

`load_artifact` checks every file and raises `ArtifactError(file, problem)` naming the file at
fault. Nothing here imports jax unless weights are read or written.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any

import numpy as np

from ninfer_jax.artifact import checksums, weights_io
from ninfer_jax.artifact.components import (DFLASH_VARIANTS, DRAFT_HEAD, DRAFTER_COMPONENTS,
                                            MTP_DIR, VISION_DIR, dflash_config_of,
                                            dflash_expected_shapes,
                                            draft_head_expected_shapes, mtp_expected_shapes,
                                            split_mtp, vision_config_of,
                                            vision_expected_shapes)
from ninfer_jax.artifact.tensor_groups import (FLOAT_FORMATS, expected_dtype,  # noqa: F401
                                               is_norm, tensor_group)
from ninfer_jax.errors import ArtifactError
from ninfer_jax.model.config import ARCHITECTURES, ModelConfig
from ninfer_jax.model.vision.config import VisionConfig

FORMAT_VERSION = 3
METADATA_FILE = "metadata.json"
TOKENIZER_FILE = "tokenizer.json"
TEMPLATE_FILE = "chat_template.jinja"
WEIGHTS_DIR = "weights"
COMPONENTS = ("text", "mtp", "dflash", "dflash2", "draft_head", "vision")
# Quantized formats store a dict of arrays per weight; their layout is owned by kernels/quant_matmul.
QUANTIZED_FORMATS = ("int8", "fp8", "int4", "nvfp4", "q8_0", "q4_0", "q4_1")  # q*: GGUF blocks
TOOL_CALL_FORMATS = (None, "hermes", "qwen_xml", "glm_xml", "gemma4", "nemotron")
CHECKSUMMED = (WEIGHTS_DIR, MTP_DIR, VISION_DIR, *DRAFTER_COMPONENTS, TOKENIZER_FILE,
               TEMPLATE_FILE)


@dataclasses.dataclass
class ArtifactContents:
    """Everything a converter produces; `save_artifact` turns it into a directory."""

    name: str
    config: ModelConfig
    params: dict
    tokenizer_json: str
    chat_template: str
    special_tokens: dict[str, Any]
    chat_format: dict[str, Any]
    source: dict[str, Any]
    weight_formats: dict[str, str]
    components: dict[str, bool] = dataclasses.field(
        default_factory=lambda: {"text": True, "mtp": False, "dflash": False, "vision": False})
    notes: str | None = None
    vision_config: VisionConfig | None = None  # the tower's, exactly when components.vision
    # drafter configs by variant ("dflash", "dflash2"), exactly for the components that are on
    dflash_configs: dict[str, Any] = dataclasses.field(default_factory=dict)
    draft_head_vocab: int = 0  # Vd of the draft_head component (0: none)

    def metadata(self) -> dict[str, Any]:
        metadata = {
            "format_version": FORMAT_VERSION, "name": self.name,
            "architecture": self.config.architecture, "config": self.config.to_dict(),
            "weight_formats": dict(self.weight_formats),
            "special_tokens": self.special_tokens, "components": dict(self.components),
            "chat_format": self.chat_format, "source": self.source,
        }
        if self.notes:
            metadata["notes"] = self.notes
        if self.vision_config is not None:
            metadata["vision_config"] = self.vision_config.to_dict()
        for variant, config in self.dflash_configs.items():
            metadata[f"{variant}_config"] = config.to_dict()
        if self.draft_head_vocab:
            metadata["draft_head_config"] = {"vocab": self.draft_head_vocab}
        return metadata


@dataclasses.dataclass
class Artifact:
    path: pathlib.Path
    metadata: dict[str, Any]
    config: ModelConfig
    params: dict | None
    chat_template: str
    tokenizer_path: pathlib.Path

    @property
    def name(self) -> str:
        return self.metadata.get("name") or self.config.architecture

    @property
    def eos_ids(self) -> list[int]:
        return list(self.metadata["special_tokens"]["eos_ids"])

    @property
    def bos_id(self) -> int | None:
        return self.metadata["special_tokens"].get("bos_id")

    @property
    def chat_format(self) -> dict[str, Any]:
        return self.metadata["chat_format"]

    @property
    def weight_formats(self) -> dict[str, str]:
        return self.metadata["weight_formats"]

    @property
    def components(self) -> dict[str, bool]:
        return self.metadata["components"]

    @property
    def vision_config(self) -> VisionConfig | None:
        return vision_config_of(self.metadata)

    def dflash_config(self, variant: str):
        """The `variant` drafter's DFlashConfig (model/dflash.py), or None."""
        return dflash_config_of(self.metadata, variant)

    def load_tokenizer(self):
        from ninfer_jax.text.tokenizer import Tokenizer

        return Tokenizer.from_artifact(self)


# ----------------------------------------------------------------------------- save


def save_artifact(out: str | os.PathLike, contents: ArtifactContents, *,
                  overwrite: bool = False) -> pathlib.Path:
    """Write an artifact directory atomically: everything goes to a temporary directory next to
    OUT, which is renamed into place only once complete (no half artifact after a failure)."""
    out = pathlib.Path(out).absolute()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists")
    # Before any weight is written: a bad metadata field must not cost gigabytes of writing.
    check_metadata(contents.metadata(), out / METADATA_FILE)
    if ("mtp" in contents.params) != bool(contents.components.get("mtp")):
        raise ArtifactError(out / METADATA_FILE, "components.mtp disagrees with the params "
                                                 "(an mtp tree is written exactly when it is on)")
    for component in ("vision", *DRAFTER_COMPONENTS):
        if (component in contents.params) != bool(contents.components.get(component)):
            raise ArtifactError(out / METADATA_FILE, f"components.{component} disagrees with "
                                f"the params (a {component} tree is written exactly when it "
                                "is on)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial",
                                            dir=out.parent))
    try:
        _write_files(staging, contents)
        _validate_directory(staging, weights=False, display=out)
        if out.exists():
            retired = out.with_name(f".{out.name}.{os.getpid()}.old")
            os.rename(out, retired)
            os.rename(staging, out)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _write_files(directory: pathlib.Path, contents: ArtifactContents) -> None:
    (directory / TOKENIZER_FILE).write_text(contents.tokenizer_json, encoding="utf-8")
    (directory / TEMPLATE_FILE).write_text(contents.chat_template, encoding="utf-8")
    text, mtp = split_mtp(contents.params)
    weights_io.save_weights(directory / WEIGHTS_DIR, text)
    if mtp is not None:
        weights_io.save_weights(directory / MTP_DIR, mtp)
    for component in (VISION_DIR, *DRAFTER_COMPONENTS):  # directory = params key
        if component in contents.params:
            weights_io.save_weights(directory / component, contents.params[component])
    metadata = contents.metadata()
    metadata["checksums"] = checksums.compute(directory, CHECKSUMMED)
    # metadata last: a directory with metadata.json is complete by construction.
    (directory / METADATA_FILE).write_text(
        json.dumps(metadata, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- load


def load_artifact(path: str | os.PathLike, weights: bool = True, *,
                  mtp: bool = False, vision: bool = False, verify: bool = True,
                  shardings=None, placement=None, dflash: str | None = None,
                  draft_head: bool = False) -> Artifact:
    """Validate an artifact and return it; with weights=True the params are read (numpy),
    with mtp=True also the MTP head, as params["mtp"], and with vision=True the vision tower,
    as params["vision"], with dflash="dflash" or "dflash2" that drafter, as params[dflash],
    and with draft_head=True the reduced proposal head, as params["draft_head"] (an error
    if the artifact lacks the component asked for).
    Reading weights first checks the recorded file checksums, unless verify=False.
    `shardings(stored structure) -> tree of jax Shardings` restores the text weights
    straight into device shards instead (weights_io.restore_weights; tensor parallelism).
    `placement(structure, read_part) -> tree` takes the text weights' restore over instead:
    it reads them part by part with `read_part(weights_io.Part) -> numpy subtree` (errors
    already ArtifactErrors naming the checkpoint) and returns the tree it made of them
    (engine/weight_pipeline.py: read, fused and placed on the device as a pipeline)."""
    if shardings is not None and placement is not None:
        raise ValueError("load_artifact takes shardings or placement, not both")
    directory = pathlib.Path(path)
    wanted = tuple(name for name, on in ((dflash, dflash), (DRAFT_HEAD, draft_head)) if on)
    return _validate_directory(directory, weights=weights, display=directory, mtp=mtp,
                               vision=vision, verify=verify, shardings=shardings,
                               placement=placement, drafters=wanted)


def load_whole_artifact(path: str | os.PathLike, verify: bool = True) -> ArtifactContents:
    """An artifact read back as ArtifactContents with every component it has (to save it
    again with more: `ninfer convert ARTIFACT OUT --dflash DIR`)."""
    directory = pathlib.Path(path)
    metadata = read_metadata(directory / METADATA_FILE, directory / METADATA_FILE)
    components = metadata["components"]
    present = tuple(c for c in DRAFTER_COMPONENTS if components.get(c))
    artifact = _validate_directory(directory, weights=True, display=directory,
                                   mtp=bool(components.get("mtp")),
                                   vision=bool(components.get("vision")), verify=verify,
                                   drafters=present)
    params = {key: _to_numpy(value) for key, value in artifact.params.items()}
    return ArtifactContents(
        name=metadata.get("name") or artifact.config.architecture, config=artifact.config,
        params=params, tokenizer_json=artifact.tokenizer_path.read_text(encoding="utf-8"),
        chat_template=artifact.chat_template, special_tokens=metadata["special_tokens"],
        chat_format=metadata["chat_format"], source=metadata.get("source", {}),
        weight_formats=dict(metadata["weight_formats"]), components=dict(components),
        notes=metadata.get("notes"), vision_config=artifact.vision_config,
        dflash_configs={v: artifact.dflash_config(v) for v in DFLASH_VARIANTS
                        if components.get(v)},
        draft_head_vocab=(metadata.get("draft_head_config") or {}).get("vocab", 0))


def _to_numpy(tree):
    if isinstance(tree, dict):
        return {key: _to_numpy(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_numpy(value) for value in tree)
    return np.asarray(tree)


def _validate_directory(directory: pathlib.Path, *, weights: bool,
                        display: pathlib.Path, mtp: bool = False, vision: bool = False,
                        verify: bool = True, shardings=None, placement=None,
                        drafters: tuple[str, ...] = ()) -> Artifact:
    if not directory.is_dir():
        raise ArtifactError(display, "not an artifact directory (missing or not a directory)")
    metadata = read_metadata(directory / METADATA_FILE, display / METADATA_FILE)
    config = _config_from_metadata(metadata, display / METADATA_FILE)
    has_mtp = bool(metadata["components"].get("mtp"))
    has_vision = bool(metadata["components"].get("vision"))
    present = tuple(c for c in DRAFTER_COMPONENTS if metadata["components"].get(c))
    for required in (TOKENIZER_FILE, TEMPLATE_FILE, WEIGHTS_DIR, *([MTP_DIR] * has_mtp),
                     *([VISION_DIR] * has_vision), *present):
        if not (directory / required).exists():
            raise ArtifactError(display / required, "missing")
    if mtp and not has_mtp:
        raise ArtifactError(display / METADATA_FILE, "the artifact has no mtp component")
    if vision and not has_vision:
        raise ArtifactError(display / METADATA_FILE, "the artifact has no vision component")
    for component in drafters:
        if component not in present:
            raise ArtifactError(display / METADATA_FILE,
                                f"the artifact has no {component} component")
    template = (directory / TEMPLATE_FILE).read_text(encoding="utf-8")
    params = None
    if weights:
        # Hashing runs beside the restore (both read every byte; the second read comes from
        # the page cache) and is waited for before the params are returned, so a damaged file
        # is still an error naming it, also when the restore itself failed on it first.
        verified = (checksums.verify_in_background(directory, metadata.get("checksums"), display)
                    if verify else lambda: None)
        try:
            params = _read_params(directory, display, metadata, config, mtp=mtp, vision=vision,
                                  shardings=shardings, placement=placement,
                                  drafters=drafters)
        except Exception:
            verified()
            raise
        verified()
    return Artifact(path=directory, metadata=metadata, config=config, params=params,
                    chat_template=template, tokenizer_path=directory / TOKENIZER_FILE)


def _read_params(directory: pathlib.Path, display: pathlib.Path, metadata: dict, config,
                 *, mtp: bool, vision: bool, shardings, placement,
                 drafters: tuple[str, ...] = ()) -> dict:
    formats = metadata["weight_formats"]
    params = _read_weights(directory / WEIGHTS_DIR, display / WEIGHTS_DIR,
                           config.expected_shapes(), formats, shardings=shardings,
                           placement=placement)
    if mtp:
        params["mtp"] = _read_weights(directory / MTP_DIR, display / MTP_DIR,
                                      mtp_expected_shapes(config), formats, prefix="mtp")
    if vision:
        params["vision"] = _read_weights(
            directory / VISION_DIR, display / VISION_DIR,
            vision_expected_shapes(vision_config_of(metadata)), formats, prefix="vision")
    for component in drafters:
        expected = (draft_head_expected_shapes(metadata, config.hidden_size)
                    if component == DRAFT_HEAD
                    else dflash_expected_shapes(dflash_config_of(metadata, component)))
        params[component] = _read_weights(directory / component, display / component,
                                          expected, formats, prefix=component)
    return params


def read_metadata(file: pathlib.Path, display: pathlib.Path | None = None) -> dict[str, Any]:
    display = display or file
    if not file.is_file():
        raise ArtifactError(display, "missing")
    try:
        metadata = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(display, f"not valid JSON ({exc})") from None
    if not isinstance(metadata, dict):
        raise ArtifactError(display, "must hold a JSON object")
    _check_header(metadata, display)
    return metadata


def check_metadata(metadata: dict[str, Any], display: pathlib.Path) -> ModelConfig:
    """Everything load_artifact checks in metadata.json, on a dict; returns its config."""
    _check_header(metadata, display)
    return _config_from_metadata(metadata, display)


def _check_header(metadata: dict[str, Any], display: pathlib.Path) -> None:
    version = metadata.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(display, f"format_version is {version!r}; this build reads "
                                     f"version {FORMAT_VERSION} (re-convert the model)")
    for key in ("architecture", "config", "weight_formats", "special_tokens", "components",
                "chat_format"):
        if key not in metadata:
            raise ArtifactError(display, f"missing field {key!r}")
    _check_fields(metadata, display)


def _check_fields(metadata: dict[str, Any], display: pathlib.Path) -> None:
    if metadata["architecture"] not in ARCHITECTURES:
        raise ArtifactError(display, f"unknown architecture {metadata['architecture']!r} "
                                     f"(known: {', '.join(ARCHITECTURES)})")
    known_formats = (*FLOAT_FORMATS, *QUANTIZED_FORMATS)
    for group, fmt in metadata["weight_formats"].items():
        if fmt not in known_formats:
            raise ArtifactError(display, f"weight_formats.{group}: unknown format {fmt!r}")
    eos_ids = metadata["special_tokens"].get("eos_ids")
    if not isinstance(eos_ids, list) or not eos_ids or not all(isinstance(i, int) for i in eos_ids):
        raise ArtifactError(display, "special_tokens.eos_ids must be a non-empty list of ids")
    unknown = set(metadata["components"]) - set(COMPONENTS)
    if unknown or not metadata["components"].get("text"):
        raise ArtifactError(display, f"components must name only {COMPONENTS} and include text")
    if metadata["chat_format"].get("tool_call_format") not in TOOL_CALL_FORMATS:
        raise ArtifactError(display, "chat_format.tool_call_format must be one of "
                                     f"{', '.join(map(str, TOOL_CALL_FORMATS[1:]))} or null")


def _config_from_metadata(metadata: dict[str, Any], display: pathlib.Path) -> ModelConfig:
    try:
        config = ModelConfig.from_dict(metadata["config"])
    except (TypeError, ValueError) as exc:
        raise ArtifactError(display, f"invalid config: {exc}") from None
    if config.architecture != metadata["architecture"]:
        raise ArtifactError(display, "config.architecture differs from architecture")
    for token_id in metadata["special_tokens"]["eos_ids"]:
        if not 0 <= token_id < config.vocab_size:
            raise ArtifactError(display, f"eos id {token_id} is outside the vocabulary")
    if bool(metadata["components"].get("mtp")) != (config.mtp_num_layers > 0):
        raise ArtifactError(display, "components.mtp must be true exactly when "
                                     "config.mtp_num_layers > 0")
    _check_vision(metadata, config, display)
    _check_drafters(metadata, config, display)
    return config


def _check_drafters(metadata: dict[str, Any], config: ModelConfig,
                    display: pathlib.Path) -> None:
    """components.dflash / dflash2 / draft_head go with their `<name>_config`, a valid one
    that fits this text model."""
    for component in DRAFTER_COMPONENTS:
        has = bool(metadata["components"].get(component))
        if has != (f"{component}_config" in metadata):
            raise ArtifactError(display, f"components.{component} must be true exactly when "
                                         f"{component}_config is present")
    for variant in DFLASH_VARIANTS:
        try:
            drafter = dflash_config_of(metadata, variant)
            if drafter is not None:
                if drafter.variant != variant:
                    raise ValueError(f"variant is {drafter.variant!r}")
                drafter.check_target(config)
        except (TypeError, ValueError) as exc:
            raise ArtifactError(display, f"invalid {variant}_config: {exc}") from None
    head = metadata.get("draft_head_config")
    if head is not None and not (isinstance(head.get("vocab"), int)
                                 and 0 < head["vocab"] <= config.vocab_size):
        raise ArtifactError(display, "draft_head_config.vocab must be an id count within "
                                     "the vocabulary")


def _check_vision(metadata: dict[str, Any], config: ModelConfig, display: pathlib.Path) -> None:
    """components.vision goes with a valid `vision_config` whose tower feeds this text model
    and whose placeholder ids are in its vocabulary, and with an MRoPE text config."""
    has_vision = bool(metadata["components"].get("vision"))
    if has_vision != ("vision_config" in metadata):
        raise ArtifactError(display, "components.vision must be true exactly when "
                                     "vision_config is present")
    if not has_vision:
        return
    try:
        vision = vision_config_of(metadata)
    except (TypeError, ValueError) as exc:
        raise ArtifactError(display, f"invalid vision_config: {exc}") from None
    if vision.out_hidden_size != config.hidden_size:
        raise ArtifactError(display, "vision_config.out_hidden_size differs from the text "
                                     "model's hidden_size")
    for field in ("image_token_id", "video_token_id", "vision_start_token_id",
                  "vision_end_token_id"):
        if not 0 <= getattr(vision, field) < config.vocab_size:
            raise ArtifactError(display, f"vision_config.{field} is outside the vocabulary")
    if not config.mrope_section:
        raise ArtifactError(display, "a vision component needs config.mrope_section")


def _read_weights(directory: pathlib.Path, display: pathlib.Path,
                  expected: dict[str, tuple[int, ...]], weight_formats: dict[str, str],
                  prefix: str | None = None, shardings=None, placement=None) -> dict:
    """Read one checkpoint after checking it holds exactly `expected`; a component's
    checkpoint (prefix "mtp") stores the tree that `expected` names under `mtp.`.
    `placement`: see load_artifact (its own errors, a device's, pass through as they are)."""
    try:
        structure = weights_io.stored_tree(directory)
    except Exception as exc:  # orbax raises many types for a damaged checkpoint
        raise ArtifactError(display, f"corrupt checkpoint (metadata unreadable: {exc})") from None
    check_tensors({prefix: structure} if prefix else structure, expected, weight_formats,
                  display)

    def restored(read):
        try:
            return read()
        except Exception as exc:
            raise ArtifactError(display, f"corrupt checkpoint ({type(exc).__name__}: "
                                         f"{exc})") from None

    if placement is not None:
        return placement(structure, lambda part: restored(
            lambda: weights_io.restore_part(directory, structure, part)))
    return restored(lambda: weights_io.restore_weights(directory, structure, shardings))


def check_tensors(structure: Any, expected: dict[str, tuple[int, ...]],
                  weight_formats: dict[str, str], display: pathlib.Path) -> None:
    """Compare the stored tree (leaves with .shape and .dtype) with the expected tensors
    (ModelConfig.expected_shapes() or components.mtp_expected_shapes())."""
    for name, shape in expected.items():
        node = weights_io.subtree(structure, name)
        if node is None:
            raise ArtifactError(display, f"missing tensor {name} (expected shape {shape})")
        if isinstance(node, dict):
            _check_quantized(name, node, shape, weight_formats, display)
            continue
        if tuple(node.shape) != tuple(shape):
            raise ArtifactError(display, f"tensor {name} has shape {tuple(node.shape)}, "
                                         f"the config needs {tuple(shape)}")
        want = expected_dtype(name, weight_formats)
        if want is not None and str(np.dtype(node.dtype)) != want:
            raise ArtifactError(display, f"tensor {name} is {np.dtype(node.dtype)}, "
                                         f"weight_formats says {want}")
    for name, _ in weights_io.walk_tree(structure):
        if not any(name == known or name.startswith(known + ".") for known in expected):
            raise ArtifactError(display, f"unknown tensor {name}")


def _check_quantized(name: str, leaf: dict, shape: tuple[int, ...],
                     weight_formats: dict[str, str], display: pathlib.Path) -> None:
    """A quantized leaf must have its group's declared format and cover the config's shape
    (group formats pad the input dimension up to a multiple of their group)."""
    from ninfer_jax.kernels.quant_matmul.formats import format_of, logical_shape

    declared = weight_formats.get(tensor_group(name), "f32")
    try:
        stored = format_of(leaf)
        rows, cols = logical_shape(leaf)
    except (ValueError, KeyError, IndexError) as exc:
        raise ArtifactError(display, f"tensor {name}: {exc}") from None
    if stored != declared:
        raise ArtifactError(display, f"tensor {name} is stored as {stored}, weight_formats "
                                     f"says {declared}")
    if name == "embed":  # a block table's rows are the table's rows (formats.py)
        rows, cols = cols, rows
    if len(shape) != 2 or cols != shape[1] or rows < shape[0]:
        raise ArtifactError(display, f"tensor {name} ({stored}) covers [{rows}, {cols}], "
                                     f"the config needs {tuple(shape)}")
