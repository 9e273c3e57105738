"""The process-local store of terminal Responses (OpenAI Responses Core).

Owns retrieval (GET/DELETE), continuation state for `previous_response_id` and the
input-item listing. Bounded as an LRU by record count (--response-store-max-records) and
by bytes (--response-store-max-mib); a lookup refreshes a record's recency.

Each record keeps its own continuation `context`: the parent's context followed by this
request's input Items and its output Items. Contexts are tuples that share the parent's
Item objects, so a child stays usable after its parent is deleted or evicted, and memory
grows by pointers, not by copies. Byte accounting is deliberately pessimistic: a record
counts its envelope, its own input Items and its whole inherited context.

Thread model: HTTP threads only; one lock guards the ordered map. Records are immutable
once stored (callers must not mutate the dicts they put in or get out).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import threading

from ninfer_jax.errors import InvalidRequest, NotFound

MIB = 1 << 20


def json_size(value) -> int:
    """Bytes of the compact UTF-8 JSON encoding: the unit of store accounting."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


@dataclasses.dataclass(frozen=True)
class StoredResponse:
    response_id: str
    response: dict  # the terminal wire object returned by GET
    input_items: tuple[dict, ...]  # normalized Items supplied to this request
    context: tuple[dict, ...]  # parent context + input_items + output Items
    context_bytes: int  # json_size of every Item in `context`
    num_bytes: int  # what this record is charged: envelope + own input + inherited context
    preserve_thinking: bool | None  # resolved value, inherited by children that omit it
    session_key: str | None  # engine prefix-reuse hint shared along a stored chain


def build_record(response: dict, input_items, parent: StoredResponse | None,
                 preserve_thinking: bool | None, is_stored: bool) -> StoredResponse:
    """The record for a finished Response, chaining context and session key from its parent."""
    input_items = tuple(input_items)
    output_items = tuple(response.get("output", ()))
    input_bytes = sum(json_size(item) for item in input_items)
    output_bytes = sum(json_size(item) for item in output_items)
    inherited_bytes = parent.context_bytes if parent is not None else 0
    if parent is not None:
        context = parent.context + input_items + output_items
        session_key = parent.session_key
    else:
        context = input_items + output_items
        # Only stored roots name a session; store:false roots stay anonymous.
        session_key = response["id"] if is_stored else None
    return StoredResponse(
        response_id=response["id"], response=response, input_items=input_items,
        context=context, context_bytes=inherited_bytes + input_bytes + output_bytes,
        num_bytes=json_size(response) + input_bytes + inherited_bytes,
        preserve_thinking=preserve_thinking, session_key=session_key)


def capacity_exceeded(message: str) -> InvalidRequest:
    return InvalidRequest(message, param="store", code="response_store_capacity_exceeded")


class ResponseStore:
    """Bounded LRU of StoredResponse records keyed by response id."""

    def __init__(self, max_records: int, max_mib: int):
        self.max_records = max_records
        self.max_bytes = max_mib * MIB
        self._records: "collections.OrderedDict[str, StoredResponse]" = collections.OrderedDict()
        self._sizes: dict[str, int] = {}
        self._total_bytes = 0
        self._lock = threading.Lock()

    def check_can_store(self) -> None:
        """Fail before generation when no Response could ever be stored."""
        if self.max_records <= 0 or self.max_bytes <= 0:
            raise capacity_exceeded(
                "The local response store has no capacity (--response-store-max-records or "
                "--response-store-max-mib is 0); send store:false.")

    def put(self, record: StoredResponse) -> None:
        """Store `record`, evicting least-recently-used records to fit both bounds."""
        size = record.num_bytes
        self.check_can_store()
        if size > self.max_bytes:
            raise capacity_exceeded(
                f"This response needs {size} bytes of local storage, more than the store's "
                f"whole capacity of {self.max_bytes} bytes; send store:false.")
        with self._lock:
            self._remove(record.response_id)
            self._records[record.response_id] = record
            self._sizes[record.response_id] = size
            self._total_bytes += size
            while len(self._records) > self.max_records or self._total_bytes > self.max_bytes:
                oldest = next(iter(self._records))
                self._remove(oldest)

    def get(self, response_id: str, *, param: str | None = None) -> StoredResponse:
        with self._lock:
            record = self._records.get(response_id)
            if record is not None:
                self._records.move_to_end(response_id)
                return record
        raise NotFound(f"No stored response with id '{response_id}' (store:false, deleted, "
                       "evicted, or from an earlier server process).",
                       param=param, code="response_not_found")

    def delete(self, response_id: str) -> None:
        with self._lock:
            if self._remove(response_id):
                return
        raise NotFound(f"No stored response with id '{response_id}'.",
                       code="response_not_found")

    def stats(self) -> dict:
        with self._lock:
            return {"records": len(self._records), "bytes": self._total_bytes}

    def _remove(self, response_id: str) -> bool:
        if self._records.pop(response_id, None) is None:
            return False
        self._total_bytes -= self._sizes.pop(response_id)
        return True


def page_items(items, *, after: str | None, limit: int, order: str) -> dict:
    """One page of a record's input Items as an OpenAI list object.

    `order` is "asc" (request order) or "desc"; `after` is the id of the last Item of the
    previous page in that order. Validation of limit/order happens in the adapter."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    start = 0
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise InvalidRequest(f"'after' names no input item of this response: '{after}'.",
                                 param="after")
        start = ids.index(after) + 1
    page = ordered[start:start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(ordered),
    }
