"""GET / and GET /ui/{name}: the built-in web page, off with --no-ui.

The page (static/index.html, app.js, style.css) is plain HTML, CSS and JS shipped as package
data; it chats through the server's own POST /v1/chat/completions stream and draws /metrics
on canvases, so it needs no route of its own beyond these files and no asset from elsewhere.
It is served without the API key (serve/wire/http.py): it holds no secret, the user types
the key into it. The Content-Security-Policy keeps it that way: scripts, styles and fetches
from this origin only.
"""
from __future__ import annotations

import pathlib

import falcon

STATIC = pathlib.Path(__file__).with_name("static")
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
    "Referrer-Policy": "no-referrer",
}


def _files() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content type), read once; only these names are ever served."""
    return {path.name: (path.read_bytes(), CONTENT_TYPES[path.suffix])
            for path in sorted(STATIC.iterdir()) if path.suffix in CONTENT_TYPES}


class PageResource:
    def __init__(self, files: dict[str, tuple[bytes, str]]):
        self.files = files

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str = "index.html") -> None:
        if name not in self.files:
            raise falcon.HTTPNotFound()
        resp.data, resp.content_type = self.files[name]
        resp.set_headers(HEADERS)

    on_head = on_get


def register(app: falcon.App, ctx) -> None:
    if ctx.config.no_ui:
        return
    page = PageResource(_files())
    app.add_route("/", page)
    app.add_route("/ui/{name}", page)
