"""Browser-test fixtures: one live `ninfer serve` (tests/e2e's start_server, the default
artifact, an API key) and headless Chromium (Debian's /usr/bin/chromium, driven by playwright;
no browser download). Every test here is `slow`; without playwright or Chromium they skip."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).parent
CHROMIUM = os.environ.get("NINFER_CHROMIUM", "/usr/bin/chromium")
API_KEY = "ui-secret"
# Small buckets and the essential step shapes only: a short warm-up.
FLAGS = ("--max-context", "1024", "--prefill-chunk", "64", "--max-concurrency", "4",
         "--step-shapes", "essential", "--seed", "1234")


def _e2e():
    spec = importlib.util.spec_from_file_location("e2e_live_servers",
                                                  HERE.parent / "e2e" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def ui_server(default_artifact_path):
    server = _e2e().start_server(default_artifact_path, *FLAGS, api_key=API_KEY)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not pathlib.Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with playwright_api.sync_playwright() as driver:
        # Debian's Chromium starts headless here with no extra flags (sandbox included).
        browser = driver.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        browser.close()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)
