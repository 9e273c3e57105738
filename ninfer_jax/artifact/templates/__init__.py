"""Chat templates written for ninfer-jax: a plain ChatML fallback and the Qwen-style,
Llama-3-style and GLM-4.5-style templates of random-weight artifacts (`ninfer init-random`)."""
from __future__ import annotations

import pathlib

TEMPLATES_DIR = pathlib.Path(__file__).parent


def builtin_template(name: str) -> str:
    """The text of templates/<name>.jinja (`chatml`, `qwen3`, `qwen3_5`, `llama3`, `glm4_5`,
    `gemma4`, `nemotron_h`)."""
    path = TEMPLATES_DIR / f"{name}.jinja"
    if not path.is_file():
        raise KeyError(f"no built-in chat template named {name!r}")
    return path.read_text(encoding="utf-8")
