"""A tiny saved artifact shared by the format tests (the default artifact fixtures live in
tests/conftest.py)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_artifact_dir(tmp_path_factory):
    from ninfer_jax.artifact.format import save_artifact
    from tiny_artifacts import tiny_contents

    return save_artifact(tmp_path_factory.mktemp("tiny") / "tiny.ninfer", tiny_contents())
