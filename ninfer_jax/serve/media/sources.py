"""Where media bytes come from: data URIs and HTTP(S) URLs.

`acquire(part, limits)` returns the raw bytes of one MediaPart. A data URI must be
`data:[<type>/<subtype>][;...][;base64],<data>`, its type (when given) image/* for an image
and video/* for a video; base64 payloads are decoded strictly. An HTTP(S) URL is fetched with
a timeout and at most `max_bytes` read: a transport failure or an error status is
MediaFetchFailed (502), no answer in time MediaFetchTimeout (504), a body over the cap
MediaBudgetExceeded. Every malformed source is InvalidMedia naming the part's field.
Runs on the HTTP thread that prepares the request (blocking I/O, bounded by the timeout).
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import http.client
import socket
import urllib.error
import urllib.parse
import urllib.request

from ninfer_jax.errors import (InvalidMedia, MediaBudgetExceeded, MediaFetchFailed,
                               MediaFetchTimeout)
from ninfer_jax.text.conversation import MediaPart

FETCH_TIMEOUT_S = 10.0  # connect and each read of a media URL
USER_AGENT = "ninfer-jax media fetch"


@dataclasses.dataclass(frozen=True)
class SourceLimits:
    max_bytes: int  # one item's raw bytes (--max-request-mib)
    timeout_s: float = FETCH_TIMEOUT_S


def acquire(part: MediaPart, limits: SourceLimits) -> bytes:
    url = part.url
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        data = _data_uri(part)
    elif scheme in ("http", "https"):
        data = _fetch(part, limits)
    else:
        raise InvalidMedia(f"'{part.param}' must be an http(s) URL or a data URI; got "
                           f"{'scheme ' + repr(scheme) if scheme else 'no scheme'}.",
                           param=part.param)
    if len(data) > limits.max_bytes:
        raise MediaBudgetExceeded(f"'{part.param}' holds {len(data)} bytes, more than the "
                                  f"{limits.max_bytes} a media item may have.", param=part.param)
    if not data:
        raise InvalidMedia(f"'{part.param}' holds no bytes.", param=part.param)
    return data


def _data_uri(part: MediaPart) -> bytes:
    header, comma, payload = part.url[5:].partition(",")
    if not comma:
        raise InvalidMedia(f"'{part.param}' is a data URI without a ',' before its data.",
                           param=part.param)
    fields = header.split(";")
    mime = fields[0].strip().lower()
    if mime and not mime.startswith(f"{part.kind}/"):
        raise InvalidMedia(f"'{part.param}' declares media type {mime!r}; a {part.kind} "
                           f"needs {part.kind}/*.", param=part.param)
    if "base64" in (f.strip().lower() for f in fields[1:]):
        try:
            return base64.b64decode("".join(payload.split()), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidMedia(f"'{part.param}' is not valid base64.",
                               param=part.param) from None
    return urllib.parse.unquote_to_bytes(payload)


def _fetch(part: MediaPart, limits: SourceLimits) -> bytes:
    parsed = urllib.parse.urlsplit(part.url)
    if not parsed.hostname:
        raise InvalidMedia(f"'{part.param}' is a URL without a host.", param=part.param)
    request = urllib.request.Request(part.url, headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=limits.timeout_s) as response:
            data = response.read(limits.max_bytes + 1)
    except urllib.error.HTTPError as exc:
        raise MediaFetchFailed(f"fetching '{part.param}' failed: HTTP {exc.code}.",
                               param=part.param) from None
    except (socket.timeout, TimeoutError):
        raise _timeout(part, limits) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (socket.timeout, TimeoutError)):
            raise _timeout(part, limits) from None
        raise MediaFetchFailed(f"fetching '{part.param}' failed: {exc.reason}.",
                               param=part.param) from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise MediaFetchFailed(f"fetching '{part.param}' failed: {exc}.",
                               param=part.param) from None
    return data


def _timeout(part: MediaPart, limits: SourceLimits) -> MediaFetchTimeout:
    return MediaFetchTimeout(f"fetching '{part.param}' took longer than {limits.timeout_s:g} s.",
                             param=part.param)
