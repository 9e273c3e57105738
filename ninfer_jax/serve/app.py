"""The Falcon WSGI application: `create_app(ctx)`.

Each wire adapter is a module with `register(app, ctx)` that adds its routes; the list below
is the only place that knows them. Optional adapters (written separately) are imported only
if their module exists, so the app works while they are being built. Errors from every route
go through serve/errors.py; request ids, body limits, auth and CORS through serve/http.py.
"""
from __future__ import annotations

import importlib
import json
import logging

import falcon

from ninfer_jax.serve.context import ServingContext
from ninfer_jax.serve.errors import install_error_handlers
from ninfer_jax.serve.http import build_middleware

log = logging.getLogger("ninfer_jax.serve")

ADAPTERS = ("models", "openai_chat", "completions")
OPTIONAL_ADAPTERS = ("openai_responses", "anthropic", "metrics", "request_log", "capture",
                     "openapi")


def _adapter_modules():
    for name in ADAPTERS:
        yield importlib.import_module(f"ninfer_jax.serve.{name}")
    for name in OPTIONAL_ADAPTERS:
        qualified = f"ninfer_jax.serve.{name}"
        try:
            module = importlib.import_module(qualified)
        except ModuleNotFoundError as exc:
            if exc.name != qualified:
                raise
            continue
        if hasattr(module, "register"):
            yield module


def create_app(ctx: ServingContext) -> falcon.App:
    app = falcon.App(middleware=build_middleware(ctx.config))
    # Bodies are read and validated by the adapters (413 before parsing, field-named 400s).
    app.req_options.auto_parse_form_urlencoded = False
    app.resp_options.media_handlers[falcon.MEDIA_JSON] = falcon.media.JSONHandler(
        dumps=_dumps)
    install_error_handlers(app)
    for module in _adapter_modules():
        module.register(app, ctx)
    return app


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)
