"""The layering of docs/architecture.md, checked on every import in ninfer_jax (function-level
imports included): kernels <- model <- engine <- serve <- cli, text and artifact below serve
and not in a loop with each other, and inside serve/ no wire dialect imports another one.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "ninfer_jax"

# A package may import its own modules and those of strictly lower rank.
RANK = {
    "errors": 0,
    "kernels": 1,
    "model": 2, "text": 2,
    "artifact": 3,
    "engine": 4,
    "serve": 5,
    "replay": 6,
    "cli": 7,
}
DIALECTS = ("openai", "responses", "anthropic")
# serve/ subpackages that every dialect may use; none of them may reach into a dialect.
SHARED = ("core", "wire", "observability")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path):
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # `from ninfer_jax.serve import anthropic` names a module
                yield node.lineno, f"{target}.{alias.name}"


def _top(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "ninfer_jax" and len(parts) > 1 else None


def _serve_group(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) > 3 and parts[:2] == ["ninfer_jax", "serve"]:
        return parts[2]
    return None


def violations(module: str, target: str) -> list[str]:
    src, dst = _top(module), _top(target)
    if dst is None or dst not in RANK or src == dst:
        if src == dst == "serve":
            return _serve_violations(module, target)
        return []
    if src not in RANK:
        return [f"{src} is not in the layer table"]
    if RANK[dst] >= RANK[src]:
        return [f"{src} (rank {RANK[src]}) imports {dst} (rank {RANK[dst]})"]
    return []


def _serve_violations(module: str, target: str) -> list[str]:
    src, dst = _serve_group(module), _serve_group(target)
    if dst not in DIALECTS or src == dst:
        return []
    if src in DIALECTS:
        return [f"dialect {src} imports dialect {dst}"]
    if src in SHARED:
        return [f"shared serve.{src} imports dialect {dst}"]
    return []


def _all_modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_every_import_respects_the_layers():
    found = []
    for path in _all_modules():
        module = _module_name(path)
        for lineno, target in _imports(path):
            for problem in violations(module, target):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: {target}: {problem}")
    assert not found, "layer violations:\n" + "\n".join(found)


def test_every_package_has_a_rank():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert packages | modules <= set(RANK), sorted((packages | modules) - set(RANK))


@pytest.mark.parametrize("module,target,expected", [
    ("ninfer_jax.model.sampling", "ninfer_jax.engine.request", "model (rank 2) imports engine"),
    ("ninfer_jax.text.tokenizer", "ninfer_jax.artifact.tokenizer_build", "text (rank 2)"),
    ("ninfer_jax.serve.anthropic.service", "ninfer_jax.serve.responses.service",
     "dialect anthropic imports dialect responses"),
    ("ninfer_jax.serve.core.generation", "ninfer_jax.serve.openai.chat",
     "shared serve.core imports dialect openai"),
])
def test_the_checker_sees_a_violation(module, target, expected):
    problems = violations(module, target)
    assert problems and expected in problems[0]


@pytest.mark.parametrize("module,target", [
    ("ninfer_jax.engine.runner", "ninfer_jax.model.llama"),
    ("ninfer_jax.serve.openai.completions", "ninfer_jax.serve.openai.chat"),
    ("ninfer_jax.serve.anthropic.service", "ninfer_jax.serve.core.generation"),
    ("ninfer_jax.serve.app", "ninfer_jax.serve.anthropic.routes"),
    ("ninfer_jax.cli.serve", "ninfer_jax.serve.options"),
])
def test_the_checker_allows_downward_imports(module, target):
    assert violations(module, target) == []
