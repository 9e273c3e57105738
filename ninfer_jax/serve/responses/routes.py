"""The OpenAI Responses Core routes (Falcon resources over responses/service.py).

POST /v1/responses (JSON or SSE), POST /v1/responses/input_tokens, GET and DELETE
/v1/responses/{id}, GET /v1/responses/{id}/input_items, and the two explicit refusals:
POST /v1/responses/{id}/cancel (no background execution) and POST /v1/responses/compact.
One ResponseStore per worker process, created here and shared by these routes.
"""
from __future__ import annotations

import falcon

from ninfer_jax.errors import InvalidRequest
from ninfer_jax.serve.core.context import ServingContext
from ninfer_jax.serve.responses.store import ResponseStore
from ninfer_jax.serve.responses.service import ResponsesService
from ninfer_jax.serve.wire.service_routes import GenerateResource, ServiceResource


def _query(req: falcon.Request) -> dict:
    """Query parameters; `include` may arrive as include or include[] (lists kept)."""
    query = dict(req.params)
    if "include[]" in query:
        query["include"] = query.pop("include[]")
    return query


class InputTokensResource(ServiceResource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.service.count_input_tokens(self._body(req))


class ResponseResource(ServiceResource):
    def on_get(self, req, resp, response_id: str) -> None:
        resp.media = self.service.retrieve(response_id, _query(req))

    def on_delete(self, req, resp, response_id: str) -> None:
        resp.media = self.service.delete(response_id)


class InputItemsResource(ServiceResource):
    def on_get(self, req, resp, response_id: str) -> None:
        resp.media = self.service.list_input_items(response_id, _query(req))


class CancelResource(ServiceResource):
    def on_post(self, req, resp, response_id: str) -> None:
        self.service.store.get(response_id)  # unknown ids are 404 first
        raise InvalidRequest("Responses run synchronously here; there is no background "
                             "execution to cancel.", param="response_id",
                             code="background_not_supported")


class CompactResource(ServiceResource):
    def on_post(self, req, resp) -> None:
        raise InvalidRequest("Response compaction is not supported by this server.",
                             code="compaction_not_supported")


def register(app: falcon.App, ctx: ServingContext) -> None:
    store = ResponseStore(ctx.config.response_store_max_records,
                          ctx.config.response_store_max_mib)
    ctx.extras["response_store"] = store
    service = ResponsesService(ctx, store)
    app.add_route("/v1/responses", GenerateResource(service))
    app.add_route("/v1/responses/input_tokens", InputTokensResource(service))
    app.add_route("/v1/responses/compact", CompactResource(service))
    app.add_route("/v1/responses/{response_id}", ResponseResource(service))
    app.add_route("/v1/responses/{response_id}/input_items", InputItemsResource(service))
    app.add_route("/v1/responses/{response_id}/cancel", CancelResource(service))
