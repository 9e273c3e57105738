"""The one place where failures become wire error bodies.

`ninfer_jax.errors` types carry the status, code and offending parameter; this module renders
them as the OpenAI body `{"error": {"message", "type", "param", "code"}}` or the Anthropic body
`{"type": "error", "error": {"type", "message"}, "request_id"}`, and installs Falcon error
handlers that pick the dialect from the route (/v1/messages* is Anthropic). Falcon's own
HTTP errors (unknown route, wrong method) and unexpected exceptions get the same shapes; an
unexpected exception is logged with its traceback and reported as a generic 500. A client
that left before its reply started (disconnect.ClientGone) gets an empty 499, nginx's
"client closed request", which no one reads.
"""
from __future__ import annotations

import json
import logging

import falcon

from ninfer_jax import errors
from ninfer_jax.serve.wire.disconnect import ClientGone

log = logging.getLogger("ninfer_jax.serve")

ANTHROPIC_PREFIX = "/v1/messages"
# Anthropic reports these two failures with its own status codes.
_ANTHROPIC_STATUS = {errors.Overloaded: 529, errors.QueueTimeout: 504}


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def openai_error_body(error: errors.NinferError) -> dict:
    return {"error": {"message": error.message, "type": error.openai_type,
                      "param": error.param, "code": error.code}}


def anthropic_status(error: errors.NinferError) -> int:
    for cls, status in _ANTHROPIC_STATUS.items():
        if isinstance(error, cls):
            return status
    return error.status


def anthropic_error_body(error: errors.NinferError, request_id: str | None) -> dict:
    return {"type": "error", "error": {"type": error.anthropic_type, "message": error.message},
            "request_id": request_id}


def from_falcon(error: falcon.HTTPError) -> errors.NinferError:
    """Falcon's routing/method errors expressed as our own types."""
    status = int(error.status_code)
    message = error.description or error.title or "request failed"
    if status == 404:
        return errors.NotFound(message)
    if status == 413:
        return errors.RequestTooLarge(message)
    failure = errors.InvalidRequest(message, code="method_not_allowed" if status == 405 else None)
    failure.status = status
    return failure


def render_error(req: falcon.Request, resp: falcon.Response, error: errors.NinferError) -> None:
    request_id = getattr(req.context, "request_id", None)
    if is_anthropic_path(req.path):
        resp.status = anthropic_status(error)
        # The same spelling as the request-id header (serve/wire/http.py).
        body = anthropic_error_body(error, f"req_{request_id}" if request_id else None)
    else:
        resp.status = error.status
        body = openai_error_body(error)
    resp.content_type = falcon.MEDIA_JSON
    resp.text = json.dumps(body)


def _handle_ninfer(req, resp, error, params):
    render_error(req, resp, error)


def _handle_falcon(req, resp, error, params):
    render_error(req, resp, from_falcon(error))
    if error.headers:
        resp.set_headers(error.headers)


def _handle_unexpected(req, resp, error, params):
    if isinstance(error, falcon.HTTPError):
        return _handle_falcon(req, resp, error, params)
    log.exception("unexpected error on %s %s (request %s)", req.method, route_of(req),
                  getattr(req.context, "request_id", "-"))
    render_error(req, resp, errors.InternalError("The server hit an internal error."))


# Falcon (and http.HTTPStatus) know no reason phrase for 499: it would read "499 Unknown".
CLIENT_CLOSED_REQUEST = "499 Client Closed Request"


def route_of(req: falcon.Request) -> str:
    """The matched route template: operational logs never carry a client-written path."""
    return req.uri_template or "(no route)"


def _handle_client_gone(req, resp, error, params):
    log.info("%s %s: %s", req.method, route_of(req), error)
    resp.status = CLIENT_CLOSED_REQUEST
    resp.text = ""


def install_error_handlers(app: falcon.App) -> None:
    # Falcon picks the most specific handler registered for an exception's class.
    app.add_error_handler(Exception, _handle_unexpected)
    app.add_error_handler(falcon.HTTPError, _handle_falcon)
    app.add_error_handler(errors.NinferError, _handle_ninfer)
    app.add_error_handler(ClientGone, _handle_client_gone)
