"""GET (and HEAD) /health, GET /v1/models and GET /v1/models/{id}.

/health is 200 {"status": "ok"} once the engine finished warming up and while it can accept
work, 503 {"status": "loading"} before that, and 503 {"status": "unavailable"} after an
engine-wide failure. Queue saturation does not make the server unhealthy.
"""
from __future__ import annotations

import falcon

from ninfer_jax.errors import ModelNotFound
from ninfer_jax.serve.core.context import ServingContext


def engine_status(ctx: ServingContext) -> str:
    engine = ctx.engine
    if not engine.healthy:
        return "unavailable"
    ready = getattr(engine, "ready", None)
    return "ok" if ready is None or ready.is_set() else "loading"


class HealthResource:
    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        status = engine_status(self.ctx)
        resp.status = falcon.HTTP_200 if status == "ok" else falcon.HTTP_503
        stats = self.ctx.engine.stats()
        # Step shapes compiled: on a GPU the server is ready after the few that can serve any
        # step, and the rest compile in the background.
        resp.media = {"status": status, "compiled_shapes": stats.compiled_shapes,
                      "total_shapes": stats.total_shapes}

    # Load balancers and uptime probes ask with HEAD: the same status, no body.
    on_head = on_get


def model_card(ctx: ServingContext) -> dict:
    return {"id": ctx.model_id, "object": "model", "created": int(ctx.started_at),
            "owned_by": "ninfer-jax", "max_model_len": ctx.max_context}


class ModelsResource:
    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"object": "list", "data": [model_card(self.ctx)]}

    def on_get_one(self, req: falcon.Request, resp: falcon.Response, model_id: str) -> None:
        if model_id != self.ctx.model_id:
            raise ModelNotFound(f"The model '{model_id}' does not exist; this server serves "
                                f"'{self.ctx.model_id}'.", param="model")
        resp.media = model_card(self.ctx)


def register(app: falcon.App, ctx: ServingContext) -> None:
    app.add_route("/health", HealthResource(ctx))
    models = ModelsResource(ctx)
    app.add_route("/v1/models", models)
    app.add_route("/v1/models/{model_id:path}", models, suffix="one")
