"""Reading and writing the `weights/` subtree of an artifact (an orbax-checkpoint pytree).

The pytree is the params layout of model/config.py: a dict of arrays plus `layers`, a list of
per-layer dicts. A quantized weight is a dict of arrays in place of one array. Arrays are numpy
(bf16 through ml_dtypes); restoring never places anything on a device.

orbax (and therefore jax) is imported inside the functions so that code paths that only need
metadata, the tokenizer or the chat template never import jax.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable, Iterator

import numpy as np


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One stored array: dotted name (e.g. `layers.3.wq` or `layers.3.wq.scale`), shape, dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def num_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _itemsize(self.dtype)


def _itemsize(dtype: str) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        import ml_dtypes  # bfloat16, float8_* and int4 are ml_dtypes names

        return np.dtype(getattr(ml_dtypes, dtype)).itemsize


def human_bytes(count: float) -> str:
    """A byte count for people: B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} GiB"


def walk_tree(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (dotted name, leaf) for every leaf of a nest of dicts and lists."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from walk_tree(value, f"{prefix}{key}.")
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from walk_tree(value, f"{prefix}{index}.")
    else:
        yield prefix[:-1], tree


def subtree(tree: Any, name: str) -> Any:
    """The node at a dotted name (`layers.0.wq`), or None when absent."""
    node = tree
    for part in name.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
        if node is None:
            return None
    return node


def _orbax():
    import orbax.checkpoint as ocp

    return ocp


def save_weights(directory: pathlib.Path, params: dict) -> None:
    """Write params (numpy leaves) as an orbax checkpoint at `directory` (must not exist)."""
    ocp = _orbax()
    params = _as_numpy_tree(params)
    checkpointer = ocp.PyTreeCheckpointer()
    checkpointer.save(pathlib.Path(directory).absolute(), params)


def _as_numpy_tree(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _as_numpy_tree(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_as_numpy_tree(value) for value in tree]
    return np.asarray(tree)


def stored_tree(directory: pathlib.Path) -> Any:
    """The stored pytree's structure with one metadata object (shape, dtype) per array."""
    ocp = _orbax()
    metadata = ocp.PyTreeCheckpointer().metadata(pathlib.Path(directory).absolute())
    # orbax versions differ: StepMetadata -> item_metadata -> TreeMetadata -> tree.
    for attribute in ("item_metadata", "tree"):
        metadata = getattr(metadata, attribute, metadata)
    if not isinstance(metadata, dict):
        raise ValueError(f"unexpected checkpoint metadata {type(metadata).__name__}")
    return metadata


def inventory(directory: pathlib.Path) -> list[TensorInfo]:
    """Every stored array, in pytree order, without reading array data."""
    return [TensorInfo(name, tuple(int(d) for d in leaf.shape), str(np.dtype(leaf.dtype)))
            for name, leaf in walk_tree(stored_tree(directory))]


def restore_weights(directory: pathlib.Path, structure: Any | None = None,
                    shardings: Callable[[Any], Any] | None = None) -> dict:
    """Read every array as numpy. `structure` is the tree returned by `stored_tree`.
    `shardings(structure)`, when given, returns a tree of jax Shardings of the same shape:
    each array is then read straight into its shards on the devices (jax.Array leaves; a
    device reads only its slices, and no whole copy is ever made on the host)."""
    ocp = _orbax()
    structure = structure if structure is not None else stored_tree(directory)
    if shardings is not None:
        targets = iter(_leaves(shardings(structure)))
        restore_args = _map_tree(structure, lambda _: ocp.ArrayRestoreArgs(
            sharding=next(targets)))
    else:
        restore_args = _map_tree(structure, lambda _: ocp.RestoreArgs(restore_type=np.ndarray))
    return ocp.PyTreeCheckpointer().restore(pathlib.Path(directory).absolute(),
                                            restore_args=restore_args)


@dataclasses.dataclass(frozen=True)
class Part:
    """A piece of the stored tree that one restore call reads: top-level entries by key
    (`embed`, `lm_head`, ...; never `layers`) or a run of whole layers by index."""

    keys: tuple[str, ...] = ()
    layers: tuple[int, ...] = ()
    num_bytes: int = 0


def split_parts(structure: Any, part_bytes: int = 0) -> list[Part]:
    """The stored tree as parts that together hold every leaf once: each top-level entry
    but `layers` alone, largest first (an embedding table is the longest single read), then
    runs of consecutive layers, each run closed once it holds `part_bytes` (0: a layer a
    part), so that small layers do not each pay a restore call's fixed cost."""
    def size(tree) -> int:
        return sum(TensorInfo("", tuple(int(d) for d in leaf.shape),
                              str(np.dtype(leaf.dtype))).num_bytes
                   for _, leaf in walk_tree(tree))

    top = sorted((Part(keys=(key,), num_bytes=size(value))
                  for key, value in structure.items() if key != "layers"),
                 key=lambda part: -part.num_bytes)
    runs: list[Part] = []
    run: list[int] = []
    run_bytes = 0
    for index, layer in enumerate(structure.get("layers", ())):
        run.append(index)
        run_bytes += size(layer)
        if run_bytes >= part_bytes:
            runs.append(Part(layers=tuple(run), num_bytes=run_bytes))
            run, run_bytes = [], 0
    if run:
        runs.append(Part(layers=tuple(run), num_bytes=run_bytes))
    return top + runs


def whole_part(structure: Any) -> Part:
    """The one part that is the whole stored tree."""
    return Part(keys=tuple(key for key in structure if key != "layers"),
                layers=tuple(range(len(structure.get("layers", ())))))


def can_restore_parts() -> bool:
    """Whether this orbax reads a part of a checkpoint alone (its PLACEHOLDER leaves)."""
    return getattr(_orbax(), "PLACEHOLDER", None) is not None


def restore_part(directory: pathlib.Path, structure: Any, part: Part) -> dict:
    """Read only `part`'s arrays as numpy: {key: tree} for its keys and, when it has layers,
    `layers` as the list of those layers' trees (in part.layers order). Every other leaf is
    an orbax PLACEHOLDER, so its bytes are never read (the whole part is a plain restore)."""
    if part.keys == whole_part(structure).keys and \
            part.layers == whole_part(structure).layers:
        restored = restore_weights(directory, structure)
        return {key: restored[key] for key in part.keys} | (
            {"layers": restored["layers"]} if part.layers else {})
    ocp = _orbax()
    skip = ocp.PLACEHOLDER
    wanted_layers = set(part.layers)

    def select(tree, keep: bool):
        return _map_tree(tree, (lambda leaf: leaf) if keep else (lambda _: skip))

    item = {key: ([select(layer, index in wanted_layers)
                   for index, layer in enumerate(value)] if key == "layers"
                  else select(value, key in part.keys))
            for key, value in structure.items()}
    restore_args = _map_tree(item, lambda leaf: skip if leaf is skip
                             else ocp.RestoreArgs(restore_type=np.ndarray))
    restored = ocp.PyTreeCheckpointer().restore(
        pathlib.Path(directory).absolute(),
        args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args))
    found = {key: restored[key] for key in part.keys}
    if part.layers:
        found["layers"] = [restored["layers"][index] for index in part.layers]
    return found


def _leaves(tree: Any) -> list:
    """Leaves in walk_tree's order (the order _map_tree visits them)."""
    return [leaf for _, leaf in walk_tree(tree)]


def _map_tree(tree: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(tree, dict):
        return {key: _map_tree(value, fn) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_map_tree(value, fn) for value in tree]
    return fn(tree)
