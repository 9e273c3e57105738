"""HTTP plumbing shared by every route: request ids, Host check, API-key auth, body limits and
content types; bodies themselves are read by serve/wire/json_body.py.

Middleware order matters: the request id is assigned first so that every response, errors
included (Falcon runs process_response after error handlers), carries it; then the Host
check, then authentication (so an unauthenticated client learns nothing, not even a 413),
then the body-size check (413 from Content-Length, before anything is read) and the
content type (415 for a POST body that is not JSON).

- OpenAI routes answer with `x-request-id`; Anthropic routes (/v1/messages*) with `request-id`
  (their own contract). The id is also in `req.context.request_id` for logs and bodies.
- `--api-key` (or NINFER_API_KEY, or --api-key-file): `Authorization: Bearer KEY` or
  `x-api-key: KEY`, compared in constant time; GET/HEAD /health, CORS preflight (OPTIONS)
  and, unless --no-ui, the web page's GET/HEAD / and /ui/... stay open (the page holds no
  secret: it asks its user for the key and sends it with every API call).
- Host: a browser page on another site can reach a local server through DNS rebinding (its
  own name resolving to 127.0.0.1); such requests carry that name in Host. Allowed are IP
  literals (they cannot be rebound), localhost names, the bound host, this machine's names
  and `--allowed-hosts` entries (`*` turns the check off). A JSON content type is required
  because the types a page may send without a CORS preflight are all non-JSON.
"""
from __future__ import annotations

import functools
import hmac
import ipaddress
import socket
import uuid

import falcon

from ninfer_jax.errors import (AuthenticationFailed, HostNotAllowed, RequestTooLarge,
                               UnsupportedMediaType)
from ninfer_jax.serve.core.errors import is_anthropic_path
from ninfer_jax.serve.wire.json_body import BUDGET_BODIES, BodyBudget

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
        self.budget = BodyBudget(BUDGET_BODIES * max_bytes)

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.body_budget = self.budget
        length = req.content_length
        if length is not None and length > self.max_bytes:
            raise RequestTooLarge(f"The request body has {length} bytes; the limit is "
                                  f"{self.max_bytes} bytes (--max-request-mib).")


class HostCheckMiddleware:
    def __init__(self, bound_host: str, allowed_hosts: tuple[str, ...]):
        self.is_open = "*" in allowed_hosts
        self.allowed = {_normal_host(h) for h in (bound_host, *allowed_hosts)}
        self.allowed.update(_machine_names())

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        host = req.get_header("Host")
        if self.is_open or host is None or self.is_allowed(host):
            return
        raise HostNotAllowed("The Host header names a host this server does not answer to; "
                             "add it with --allowed-hosts.")

    def is_allowed(self, host_header: str) -> bool:
        host = _normal_host(_strip_port(host_header))
        if host in self.allowed or host == "localhost" or host.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return False
        return True


def _strip_port(host: str) -> str:
    host = host.strip()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def _normal_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


@functools.lru_cache(maxsize=1)
def _machine_names() -> frozenset[str]:
    names = {socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return frozenset(_normal_host(name) for name in names if name)


class ContentTypeMiddleware:
    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.method != "POST" or not has_body(req):
            return
        media = (req.content_type or "").partition(";")[0].strip().lower()
        if media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json")):
            return
        raise UnsupportedMediaType(
            "The request body must be sent with Content-Type: application/json"
            + (f" (got {media[:64]!r})." if media else " (none was given)."))


def has_body(req: falcon.Request) -> bool:
    if req.content_length is not None:
        return req.content_length > 0
    return "chunked" in (req.get_header("Transfer-Encoding") or "").lower()


class AuthMiddleware:
    def __init__(self, api_key: str | None, *, open_page: bool = False):
        self._key = api_key.encode("utf-8") if api_key else None
        self._open_page = open_page

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self._key is None or req.method == "OPTIONS" or req.path == "/health":
            return
        if self._open_page and req.method in ("GET", "HEAD") and is_page_path(req.path):
            return
        if not any(hmac.compare_digest(candidate, self._key) for candidate in _credentials(req)):
            raise AuthenticationFailed("Missing or invalid API key.")


def is_page_path(path: str) -> bool:
    """The web page's own paths (serve/ui/routes.py): its HTML and its static files."""
    return path == "/" or path.startswith("/ui/")


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


def build_middleware(config) -> list:
    middleware = [RequestIdMiddleware(),
                  HostCheckMiddleware(config.host, config.allowed_hosts),
                  AuthMiddleware(config.api_key, open_page=not config.no_ui),
                  BodyLimitMiddleware(config.max_request_mib * MIB), ContentTypeMiddleware()]
    if config.cors:
        middleware.insert(0, falcon.CORSMiddleware(
            allow_origins="*", expose_headers=["x-request-id", "request-id"]))
    return middleware
