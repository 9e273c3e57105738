"""The built-in web page (serve/ui/routes.py): served at / and /ui/..., without the API key,
with no asset from another host; --no-ui removes it (404)."""
from __future__ import annotations

import re

import pytest
from falcon import testing
from harness import build_harness

from ninfer_jax.serve.options import parse_serve_args
from ninfer_jax.serve.ui.routes import STATIC

KEY = "ui-secret"
# src=, href=, url(...) and fetch targets naming a scheme-qualified or protocol-relative URL
EXTERNAL = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?(?:https?:)?//"""
                      r"""|fetch\(\s*["'`](?:https?:)?//|import\s*\(?\s*["'](?:https?:)?//""", re.I)


@pytest.fixture(scope="module")
def keyed(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, api_key=KEY)
    yield testing.TestClient(h.app)
    h.close()


@pytest.fixture(scope="module")
def no_ui(default_artifact, default_tokenizer):
    h = build_harness(default_artifact, default_tokenizer, api_key=KEY, no_ui=True)
    yield testing.TestClient(h.app)
    h.close()


def test_page_and_assets_are_served_without_the_key(keyed):
    page = keyed.simulate_get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        assert f"/ui/{name}" in page.text
        asset = keyed.simulate_get(f"/ui/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    assert keyed.simulate_head("/").status_code == 200
    # the API behind it still needs the key
    assert keyed.simulate_get("/metrics").status_code == 401
    assert keyed.simulate_get("/v1/models").status_code == 401


def test_the_host_check_covers_the_page(keyed):
    reply = keyed.simulate_get("/", headers={"Host": "rebound.example"})
    assert reply.status_code >= 400 and "<html" not in reply.text


def test_only_the_packaged_files_are_served(keyed):
    for path in ("/ui/nothing.js", "/ui/..%2Froutes.py", "/ui/__init__.py", "/ui/"):
        assert keyed.simulate_get(path).status_code in (401, 404), path
    assert keyed.simulate_get("/ui/routes.py").status_code == 404


def test_no_external_urls_in_the_page_or_its_assets():
    names = sorted(p.name for p in STATIC.iterdir())
    assert names == ["app.js", "index.html", "style.css"]
    for name in names:
        text = (STATIC / name).read_text(encoding="utf-8")
        assert not EXTERNAL.search(text), (name, EXTERNAL.search(text).group(0))
        assert "http://" not in text and "https://" not in text, name


def test_the_checker_sees_an_external_url():
    for bad in ('<script src="https://cdn.example/x.js">', "<link href='//cdn.example/a.css'>",
                "background: url(http://x.example/i.png)", 'fetch("https://api.example/")'):
        assert EXTERNAL.search(bad), bad


def test_the_page_sends_json_and_the_bearer_key():
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    assert '"Content-Type"] = "application/json"' in script
    assert '"Bearer " + key' in script


def test_no_ui_gives_404_at_the_page_paths(no_ui):
    for path in ("/", "/ui/app.js", "/ui/style.css"):
        reply = no_ui.simulate_get(path, headers={"Authorization": f"Bearer {KEY}"})
        assert reply.status_code == 404, path
    # without the key nothing is open any more: the page paths are no exception
    assert no_ui.simulate_get("/").status_code == 401


def test_no_ui_is_one_declared_option_parsed_alike_by_replay():
    assert parse_serve_args("a.ninfer", ["--no-ui"]).no_ui is True
    assert parse_serve_args("a.ninfer", []).no_ui is False
