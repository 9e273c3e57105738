"""Suite-wide fixtures: the default artifact (converted on first use if `make setup` has not
done it) and its tokenizer, shared by serve and e2e tests; early starts of slow child
processes."""
from __future__ import annotations

import json
import os
import pathlib

import pytest

# XLA:CPU's LLVM optimisation level for this pytest process only. On the CPU the suite's
# in-process tests spend most of their time compiling tiny models, and LLVM at O0 cut that by a
# quarter to a third (tests/model/test_dflash.py 132 -> 99 CPU-seconds, tests/artifact/
# test_presets.py 196 -> 134); a fresh-clone `.ci/run` on one 2-core host went from 23:51 to
# 20:35 (user 39:42 -> 33:10). No fast-math either way, and the goldens hold. Children
# (servers, CLIs) keep the default level: they run many steps, and at O0 a live server's
# decode was several times slower (tests/e2e/test_token_policies_live.py's disconnected
# stream 15.5 s -> 116.9 s). Skipped where a GPU is present (its kernels must be the real
# ones) or when the caller set XLA_FLAGS already.
CPU_TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def pytest_configure(config):
    """Start this process's XLA backend with CPU_TEST_XLA_FLAGS, then put XLA_FLAGS back, so the
    flag reaches this process's compiles and no child's."""
    if "XLA_FLAGS" in os.environ or os.path.exists("/dev/nvidiactl"):
        return
    os.environ["XLA_FLAGS"] = CPU_TEST_XLA_FLAGS
    try:
        import jax

        jax.devices()  # XLA reads XLA_FLAGS once, when its first backend starts
    finally:
        del os.environ["XLA_FLAGS"]

# llama.cpp's reference outputs for the default model, vendored unchanged from shared/golden
# so a fresh clone (CI) has them.
GOLDEN_PATH = pathlib.Path(__file__).parent / "golden" / "smollm2_llamacpp.json"


# what the selected modules' start_early() returned (pytest_collection_finish)
_started_early: list = []


def pytest_collection_finish(session):
    """A selected test module's `start_early()` (which starts a slow child process its
    fixture only waits for, as test_tensor_parallel's, and returns it) runs once the run's
    tests are collected, so the child works beside the tests before that module (CI has two
    cores) instead of holding the suite; the fixture's own call returns the same child."""
    if session.config.option.collectonly:
        return
    for module in dict.fromkeys(getattr(item, "module", None) for item in session.items):
        if hasattr(module, "start_early"):
            _started_early.append(module.start_early())


def pytest_sessionfinish(session):
    """Children still running (the run stopped before their tests) are killed."""
    for child in _started_early:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.fixture(scope="session")
def golden():
    return json.loads(GOLDEN_PATH.read_text())


@pytest.fixture(scope="session")
def default_artifact_path():
    from ninfer_jax.artifact.default_model import ensure_default_artifact

    return ensure_default_artifact()


@pytest.fixture(scope="session")
def default_artifact(default_artifact_path):
    from ninfer_jax.artifact.format import load_artifact

    return load_artifact(default_artifact_path, weights=False)


@pytest.fixture(scope="session")
def default_tokenizer(default_artifact):
    return default_artifact.load_tokenizer()


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_executables():
    """Drop JAX's compiled executables after each test module. XLA:CPU maps every loaded
    executable's code and data (about three memory maps each), jit caches keep them for the
    process's life, and a full run reached Linux's 65,530 maps per process about half way:
    the next compile then crashed inside LLVM (segfaults in backend_compile_and_load in CI).
    What a later module needs again comes back from the persistent compilation cache."""
    yield
    import gc

    import jax

    gc.collect()
    jax.clear_caches()
