"""The Falcon WSGI application: `create_app(ctx)`.

Each wire adapter is a module with `register(app, ctx)` that adds its routes; the list below
(ROUTE_MODULES) is the only place that knows them. Errors from every route go through
serve/core/errors.py; request ids, body limits, auth and CORS through serve/wire/http.py.
"""
from __future__ import annotations

import importlib
import json
import logging

import falcon

from ninfer_jax.serve.core.context import ServingContext
from ninfer_jax.serve.core.errors import install_error_handlers
from ninfer_jax.serve.wire.http import build_middleware

log = logging.getLogger("ninfer_jax.serve")

# Every module that adds routes, in registration order. Each is imported unconditionally: an
# adapter that fails to import is a broken server, not a missing feature.
ROUTE_MODULES = (
    "ninfer_jax.serve.openai.models",
    "ninfer_jax.serve.openai.chat",
    "ninfer_jax.serve.openai.completions",
    "ninfer_jax.serve.responses.routes",
    "ninfer_jax.serve.anthropic.routes",
    "ninfer_jax.serve.observability.metrics",
    "ninfer_jax.serve.observability.request_log",
    "ninfer_jax.serve.observability.capture",
    "ninfer_jax.serve.wire.openapi",
    "ninfer_jax.serve.ui.routes",
)


def _route_modules():
    return [importlib.import_module(name) for name in ROUTE_MODULES]


def create_app(ctx: ServingContext) -> falcon.App:
    app = falcon.App(middleware=build_middleware(ctx.config))
    # Bodies are read and validated by the adapters (413 before parsing, field-named 400s).
    app.req_options.auto_parse_form_urlencoded = False
    app.resp_options.media_handlers[falcon.MEDIA_JSON] = falcon.media.JSONHandler(
        dumps=_dumps)
    install_error_handlers(app)
    if ctx.config.vision and ctx.media is None:
        from ninfer_jax.serve.media.intake import from_config

        ctx.media = from_config(ctx.config, ctx.metadata)
    for module in _route_modules():
        module.register(app, ctx)
    return app


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)
