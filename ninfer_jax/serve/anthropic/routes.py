"""The Anthropic Messages routes (Falcon resources over anthropic/service.py).

POST /v1/messages (aggregate or SSE) and POST /v1/messages/count_tokens. Errors use the
Anthropic body and status mapping of serve/core/errors.py (529 overload, 504 queue timeout);
the `request-id` header comes from the shared request-id middleware.
"""
from __future__ import annotations

import falcon

from ninfer_jax.serve.anthropic.service import MessagesService
from ninfer_jax.serve.core.context import ServingContext
from ninfer_jax.serve.wire.service_routes import GenerateResource, ServiceResource


class CountTokensResource(ServiceResource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.service.count_tokens(self._body(req))


def register(app: falcon.App, ctx: ServingContext) -> None:
    service = MessagesService(ctx)
    app.add_route("/v1/messages", GenerateResource(service))
    app.add_route("/v1/messages/count_tokens", CountTokensResource(service))
