"""A tiny saved artifact shared by the format tests (the default artifact fixtures live in
tests/conftest.py)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_artifact_dir(tmp_path_factory):
    from ninfer_jax.artifact.format import save_artifact
    from tiny_artifacts import tiny_contents

    return save_artifact(tmp_path_factory.mktemp("tiny") / "tiny.ninfer", tiny_contents())


@pytest.fixture(scope="session")
def qwen3_tiny_dir(tmp_path_factory):
    from ninfer_jax.artifact.format import save_artifact
    from ninfer_jax.artifact.random_init import init_random

    return save_artifact(tmp_path_factory.mktemp("qwen3") / "qwen3-tiny.ninfer",
                         init_random("qwen3-tiny", seed=1))
