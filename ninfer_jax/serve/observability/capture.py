"""--capture-requests FILE: append every generation request's endpoint and JSON body, with its
request id, so a run can be replayed later (`ninfer replay`).

Off by default: bodies hold user data (prompts, tool arguments). Only the body is kept,
never a header, so the API key is not captured. A Falcon middleware, added after the auth
middleware (unauthenticated requests are not captured), reads the body of a POST to a
generation route before its resource runs (serve/wire/json_body.py's strict rules: what it
refuses is not captured, and the resource answers the 400), records it, and leaves the parsed
body for the resource. Lines carry the same `request_id` as the request log, so a capture joins its
request_done record (the client sees it in `x-request-id`, or as `req_<id>` in the Anthropic
`request-id` header).
"""
from __future__ import annotations

import logging

import falcon

from ninfer_jax.serve.wire.http import MIB
from ninfer_jax.serve.wire.json_body import read_json_body
from ninfer_jax.serve.observability.request_log import JsonlWriter, server_instance_id

log = logging.getLogger("ninfer_jax.serve.capture")

CAPTURE_SCHEMA = "ninfer_request_capture"
CAPTURE_SCHEMA_VERSION = 1
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses",
                     "/v1/messages")


class CaptureMiddleware:
    def __init__(self, writer: JsonlWriter, max_bytes: int):
        self.writer = writer
        self.max_bytes = max_bytes

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.method != "POST" or req.path not in GENERATION_ROUTES:
            return
        # A body refused here (413, 408, 400) is refused the same way to the client.
        body = read_json_body(req, self.max_bytes)
        req.context.json_body = body
        self.writer.emit("request_capture", {"request_id": req.context.request_id,
                                             "endpoint": req.path, "body": body})


def register(app: falcon.App, ctx) -> None:
    path = ctx.config.capture_requests
    if not path:
        return
    writer = JsonlWriter(path, server_instance_id(ctx), schema=CAPTURE_SCHEMA,
                         schema_version=CAPTURE_SCHEMA_VERSION)
    ctx.extras["capture"] = writer
    app.add_middleware(CaptureMiddleware(writer, ctx.config.max_request_mib * MIB))
    log.warning("capturing request bodies to %s (they contain user data)", path)
