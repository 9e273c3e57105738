"""Request bodies: read under --max-request-mib (Content-Length or chunked) and parse strictly.

Every POST route reads its body through `read_json_body`, so these rules hold everywhere:
- the body is read in pieces and refused with 413 as soon as it passes the limit, so a large
  chunked body is never held whole; a body that stalls past the socket's read timeout is 408;
- at most BUDGET_BODIES bodies of the largest size are read and parsed at once per worker
  (`BodyBudget`, counted in bytes, so small bodies pass by): a parse costs several times the
  body, and the thread count alone would allow tens of them; past it a body waits up to
  BUDGET_WAIT_S, then the request is refused as overloaded (429, Anthropic 529);
- JSON is strict: `NaN`, `Infinity` and numbers that overflow to infinity are refused (they
  would be echoed back as invalid JSON), as are lone UTF-16 surrogates (`"\\ud800"`, which no
  UTF-8 writer can encode) and nesting deeper than MAX_DEPTH (recursive code further on
  would overflow the stack). Each refusal is a 400 naming the offending field.
"""
from __future__ import annotations

import contextlib
import json
import math
import re
import threading

import falcon

from ninfer_jax.errors import InvalidRequest, Overloaded, RequestTimeout, RequestTooLarge

MAX_DEPTH = 64
BUDGET_BODIES = 8
BUDGET_WAIT_S = 10.0
_READ_PIECE = 1024 * 1024
_SURROGATE = re.compile("[\ud800-\udfff]")


class _NonFinite:
    """Stands for a NaN/Infinity literal until the walk finds where it sits."""

    def __init__(self, literal: str):
        self.literal = literal


def _parse_float(text: str):
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def read_body_bytes(req: falcon.Request, max_bytes: int) -> bytes:
    """The raw body, at most `max_bytes` (413 past it). Without a Content-Length (chunked
    transfer) the WSGI server's decoded stream is read to its end."""
    stream = req.bounded_stream if req.content_length is not None else req.stream
    pieces, total = [], 0
    try:
        while True:
            piece = stream.read(min(_READ_PIECE, max_bytes + 1 - total))
            if not piece:
                break
            pieces.append(piece)
            total += len(piece)
            if total > max_bytes:
                raise RequestTooLarge(f"The request body exceeds the limit of {max_bytes} "
                                      "bytes (--max-request-mib).")
    except TimeoutError:
        raise RequestTimeout("The request body was not received in time.") from None
    return b"".join(pieces)


def parse_json_object(data: bytes | str) -> dict:
    """`data` as a JSON object (member order kept), by the strict rules above."""
    try:
        body = json.loads(data, parse_constant=_NonFinite, parse_float=_parse_float)
    except RecursionError:
        raise InvalidRequest(f"The request body nests deeper than {MAX_DEPTH} levels.",
                             code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}.",
                             code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    check_strict(body)
    return body


def check_strict(value, root: str = "") -> None:
    """400 naming the first non-finite number, lone surrogate or too-deep member in `value`.
    Iterative, so depth itself cannot overflow the stack here."""
    stack = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidRequest(f"The request body nests deeper than {MAX_DEPTH} levels.",
                                 param=path or None, code="invalid_json")
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise InvalidRequest("The value holds a lone UTF-16 surrogate, which is not "
                                     "valid Unicode text.", param=path or None,
                                     code="invalid_json")
        elif isinstance(item, _NonFinite):
            raise InvalidRequest(f"{item.literal} is not a valid JSON number (only finite "
                                 "numbers are accepted).", param=path or None,
                                 code="invalid_json")
        elif isinstance(item, dict):
            # Reversed onto the stack, so the first offender in document order is named.
            for key, member in reversed(item.items()):
                if _SURROGATE.search(key):
                    raise InvalidRequest("A member name holds a lone UTF-16 surrogate.",
                                         param=path or None, code="invalid_json")
                stack.append((member, f"{path}.{key}" if path else str(key), depth + 1))
        elif isinstance(item, list):
            for index in range(len(item) - 1, -1, -1):
                stack.append((item[index], f"{path}[{index}]", depth + 1))


class BodyBudget:
    """Bytes of request bodies being read or parsed at once in this worker."""

    def __init__(self, total_bytes: int, wait_s: float = BUDGET_WAIT_S):
        self.total_bytes = total_bytes
        self.wait_s = wait_s
        self._free = total_bytes
        self._changed = threading.Condition()

    @property
    def free_bytes(self) -> int:
        return self._free

    @contextlib.contextmanager
    def hold(self, num_bytes: int):
        num_bytes = min(num_bytes, self.total_bytes)
        with self._changed:
            if not self._changed.wait_for(lambda: self._free >= num_bytes, self.wait_s):
                raise Overloaded("Too many large request bodies are being read at once; "
                                 "retry shortly.")
            self._free -= num_bytes
        try:
            yield
        finally:
            with self._changed:
                self._free += num_bytes
                self._changed.notify_all()


def read_json_body(req: falcon.Request, max_bytes: int) -> dict:
    """The request's JSON object: 413 over the limit, 400 naming the field if malformed.
    A middleware that already parsed the body (request capture) leaves it in the context;
    http.BodyLimitMiddleware puts the worker's BodyBudget there."""
    parsed = getattr(req.context, "json_body", None)
    if parsed is not None:
        return parsed
    budget = getattr(req.context, "body_budget", None)
    if budget is None:
        return parse_json_object(read_body_bytes(req, max_bytes))
    # A chunked body announces no size: it is charged as the largest.
    with budget.hold(req.content_length if req.content_length is not None else max_bytes):
        return parse_json_object(read_body_bytes(req, max_bytes))


def loads_finite(text: str):
    """Model-written JSON (tool-call arguments) as (value, changed): NaN, Infinity and numbers
    that overflow become null (changed=True), since a reply must be valid JSON and JSON has
    no such numbers."""
    changed = False

    def to_null(_literal):
        nonlocal changed
        changed = True
        return None

    def finite(literal):
        value = float(literal)
        return value if math.isfinite(value) else to_null(literal)

    value = json.loads(text, parse_constant=to_null, parse_float=finite)
    return value, changed
