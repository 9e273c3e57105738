"""HTTP plumbing shared by every route: request ids, API-key auth, body limits, JSON bodies.

Middleware order matters: the request id is assigned first so that every response, errors
included (Falcon runs process_response after error handlers), carries it; then the body-size
check (413 from Content-Length, before anything is read); then authentication.

- OpenAI routes answer with `x-request-id`; Anthropic routes (/v1/messages*) with `request-id`
  (their own contract). The id is also in `req.context.request_id` for logs and bodies.
- `--api-key`: `Authorization: Bearer KEY` or `x-api-key: KEY`, compared in constant time;
  GET /health and CORS preflight (OPTIONS) stay open.
"""
from __future__ import annotations

import hmac
import json
import uuid

import falcon

from ninfer_jax.errors import AuthenticationFailed, InvalidRequest, RequestTooLarge
from ninfer_jax.serve.errors import is_anthropic_path

MIB = 1024 * 1024


def new_request_id() -> str:
    return uuid.uuid4().hex


class RequestIdMiddleware:
    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.request_id = new_request_id()

    def process_response(self, req, resp, resource, req_succeeded) -> None:
        request_id = getattr(req.context, "request_id", None)
        if request_id is None:
            return
        if is_anthropic_path(req.path):
            resp.set_header("request-id", f"req_{request_id}")
        else:
            resp.set_header("x-request-id", request_id)


class BodyLimitMiddleware:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        length = req.content_length
        if length is not None and length > self.max_bytes:
            raise RequestTooLarge(f"The request body has {length} bytes; the limit is "
                                  f"{self.max_bytes} bytes (--max-request-mib).")


class AuthMiddleware:
    def __init__(self, api_key: str | None):
        self._key = api_key.encode("utf-8") if api_key else None

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self._key is None or req.method == "OPTIONS" or req.path == "/health":
            return
        if not any(hmac.compare_digest(candidate, self._key) for candidate in _credentials(req)):
            raise AuthenticationFailed("Missing or invalid API key.")


def _credentials(req: falcon.Request) -> list[bytes]:
    found = []
    authorization = req.get_header("Authorization") or ""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        found.append(token.strip().encode("utf-8"))
    api_key = req.get_header("x-api-key")
    if api_key:
        found.append(api_key.encode("utf-8"))
    return found


def read_json_body(req: falcon.Request, max_bytes: int) -> dict:
    """The request's JSON object (member order kept). 413 over the limit, 400 if malformed."""
    data = req.bounded_stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RequestTooLarge(f"The request body exceeds the limit of {max_bytes} bytes "
                              "(--max-request-mib).")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}.",
                             code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    return body


def build_middleware(config) -> list:
    middleware = [RequestIdMiddleware(), BodyLimitMiddleware(config.max_request_mib * MIB),
                  AuthMiddleware(config.api_key)]
    if config.cors:
        middleware.insert(0, falcon.CORSMiddleware(
            allow_origins="*", expose_headers=["x-request-id", "request-id"]))
    return middleware
