"""The one typed exception hierarchy of ninfer-jax.

Every failure a client can see is one of these. Each wire dialect (OpenAI, Anthropic) maps
them to its own status code and error body in exactly one place (serve/core/errors.py); nothing
else builds error JSON. `status` is the HTTP status, `code` a stable machine-readable string,
`param` the offending request field (dotted path) when there is one.
"""
from __future__ import annotations


class NinferError(Exception):
    status = 500
    code = "internal_error"
    # OpenAI error "type" and Anthropic error "type" for this class of failure.
    openai_type = "server_error"
    anthropic_type = "api_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def __reduce__(self):
        # Errors cross the engine-core channel (Failed events, submit refusals). The default
        # reduction calls cls(*args), which subclasses with other signatures cannot take.
        return _rebuild_error, (type(self), self.args, self.__dict__)


class InvalidRequest(NinferError):
    """Malformed or out-of-range request value (HTTP 400)."""

    status = 400
    code = "invalid_request"
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class UnknownParameter(InvalidRequest):
    code = "unknown_parameter"


class Unsupported(InvalidRequest):
    """A recognised feature whose observable behaviour the engine cannot provide (HTTP 400)."""

    code = "unsupported_parameter"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"

    def __init__(self, num_tokens: int, max_context: int, message: str | None = None,
                 *, param: str | None = None):
        self.num_tokens = num_tokens
        self.max_context = max_context
        super().__init__(
            message
            or f"This request needs {num_tokens} tokens of context (prompt plus requested "
            f"output), but the server's context ceiling is {max_context} tokens.",
            param=param,
        )


class InvalidMedia(InvalidRequest):
    """A media source, its bytes or its decoded content that cannot be used (HTTP 400)."""

    code = "invalid_media"


class MediaBudgetExceeded(InvalidRequest):
    """Media preprocessing refused for resources: pixels, patches, vision tokens, live
    payload memory (HTTP 400)."""

    code = "media_budget_exceeded"


class MediaFetchFailed(NinferError):
    """A media URL the server could not fetch (HTTP 502: the remote side failed)."""

    status = 502
    code = "media_fetch_failed"
    openai_type = "server_error"
    anthropic_type = "api_error"


class MediaFetchTimeout(NinferError):
    """A media URL that did not answer in time (HTTP 504)."""

    status = 504
    code = "media_fetch_timeout"
    openai_type = "server_error"
    anthropic_type = "timeout_error"


class AuthenticationFailed(NinferError):
    status = 401
    code = "invalid_api_key"
    openai_type = "authentication_error"
    anthropic_type = "authentication_error"


class HostNotAllowed(NinferError):
    """A Host header the server does not answer to (DNS-rebinding guard, --allowed-hosts)."""

    status = 403
    code = "host_not_allowed"
    openai_type = "invalid_request_error"
    anthropic_type = "permission_error"


class NotFound(NinferError):
    status = 404
    code = "not_found"
    openai_type = "invalid_request_error"
    anthropic_type = "not_found_error"


class ModelNotFound(NotFound):
    code = "model_not_found"


class RequestTooLarge(NinferError):
    status = 413
    code = "request_too_large"
    openai_type = "invalid_request_error"
    anthropic_type = "request_too_large"


class RequestTimeout(NinferError):
    """The request head or body did not arrive within the read timeout (HTTP 408)."""

    status = 408
    code = "request_timeout"
    openai_type = "invalid_request_error"
    anthropic_type = "timeout_error"


class UnsupportedMediaType(NinferError):
    """A POST body whose Content-Type is not JSON (HTTP 415)."""

    status = 415
    code = "unsupported_media_type"
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class Overloaded(NinferError):
    """Admission capacity is full (429 for OpenAI, 529 for Anthropic)."""

    status = 429
    code = "server_overloaded"
    openai_type = "server_error"
    anthropic_type = "overloaded_error"


class QueueTimeout(NinferError):
    """Not admitted before --pending-timeout-ms (503 for OpenAI, 504 for Anthropic)."""

    status = 503
    code = "request_queue_timeout"
    openai_type = "server_error"
    anthropic_type = "timeout_error"


class EngineUnavailable(NinferError):
    status = 503
    code = "engine_unavailable"
    openai_type = "server_error"
    anthropic_type = "api_error"


class InternalError(NinferError):
    status = 500
    code = "internal_error"


def _rebuild_error(cls, args, state):
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ArtifactError(Exception):
    """A .ninfer artifact is missing, malformed or inconsistent. Always names the file."""

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem
