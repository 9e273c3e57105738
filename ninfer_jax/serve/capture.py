"""--capture-requests FILE: append every generation request's endpoint and JSON body, with its
request id, so a run can be replayed later (`ninfer replay`).

Off by default: bodies hold user data (prompts, tool arguments). Only the body is kept,
never a header, so the API key is not captured. A Falcon middleware, added after the auth
middleware (unauthenticated requests are not captured), reads the body of a POST to a
generation route before its resource runs, records it, and hands the same bytes back to the
resource. Lines carry the same `request_id` as the request log, so a capture joins its
request_done record (the client sees it in `x-request-id`, or as `req_<id>` in the Anthropic
`request-id` header).
"""
from __future__ import annotations

import io
import json
import logging

import falcon

from ninfer_jax.serve.http import MIB
from ninfer_jax.serve.request_log import JsonlWriter, server_instance_id

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
        length = req.content_length
        # Falcon reads exactly Content-Length bytes; without one the resource sees no body.
        if not length or length > self.max_bytes:
            return
        data = req.stream.read(length)
        # The resource reads the same bytes (bounded_stream wraps env["wsgi.input"]).
        req.env["wsgi.input"] = req.stream = io.BytesIO(data)
        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return  # the resource answers 400; there is nothing to replay
        if isinstance(body, dict):
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
