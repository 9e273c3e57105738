"""The Anthropic Messages routes (Falcon resources over anthropic_service).

POST /v1/messages (aggregate or SSE) and POST /v1/messages/count_tokens. Errors use the
Anthropic body and status mapping of serve/errors.py (529 overload, 504 queue timeout);
the `request-id` header comes from the shared request-id middleware.
"""
from __future__ import annotations

import falcon

from ninfer_jax.serve.anthropic_service import MessagesService
from ninfer_jax.serve.context import ServingContext
from ninfer_jax.serve.disconnect import peer_of
from ninfer_jax.serve.http import MIB, read_json_body
from ninfer_jax.serve.sse import start_sse


class _Resource:
    def __init__(self, service: MessagesService):
        self.service = service

    def _body(self, req: falcon.Request) -> dict:
        return read_json_body(req, self.service.ctx.config.max_request_mib * MIB)


class MessagesResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        run = self.service.start(self._body(req), req.context.request_id, peer_of(req))
        if run.request.stream:
            start_sse(resp, self.service.run_stream(run))
        else:
            resp.media = self.service.run_aggregate(run)


class CountTokensResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.service.count_tokens(self._body(req))


def register(app: falcon.App, ctx: ServingContext) -> None:
    service = MessagesService(ctx)
    app.add_route("/v1/messages", MessagesResource(service))
    app.add_route("/v1/messages/count_tokens", CountTokensResource(service))
