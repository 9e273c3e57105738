"""GET /openapi.json: an OpenAPI 3.1 description of the routes this app serves.

The paths and methods come from the app's own router at request time, so a route added by
any adapter is described without editing this module; request bodies of the main POST
routes carry schemas of their main fields, and every operation lists the error shape."""
from __future__ import annotations

import falcon
from falcon import inspect as falcon_inspect

from ninfer_jax.serve.core.errors import is_anthropic_path

MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string"}, "content": {}, "name": {"type": "string"}}}
# The engine fields every dialect reads alike (serve/core/engine_fields.py).
ENGINE = {
    "seed": {"type": "integer"}, "ignore_eos": {"type": "boolean"},
    "stop_token_ids": {"type": ["array", "null"], "maxItems": 64,
                       "items": {"type": "integer", "minimum": 0}},
    "top_k": {"type": "integer", "maximum": 20},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2}}
SAMPLING = {
    "model": {"type": "string"}, "stream": {"type": "boolean"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0}, "top_p": {"type": "number"}, **ENGINE,
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}}
REQUEST_BODIES = {
    "/v1/chat/completions": {"type": "object", "required": ["messages"], "properties": {
        **SAMPLING, "messages": {"type": "array", "items": MESSAGE},
        "tools": {"type": "array", "items": {"type": "object"}},
        "max_completion_tokens": {"type": "integer", "minimum": 1}}},
    "/v1/completions": {"type": "object", "required": ["prompt"], "properties": {
        **SAMPLING, "prompt": {"oneOf": [{"type": "string"},
                                         {"type": "array", "items": {"type": "string"}}]}}},
    "/v1/responses": {"type": "object", "required": ["input"], "properties": {
        "model": {"type": "string"}, "stream": {"type": "boolean"}, "input": {},
        "instructions": {"type": "string"}, "max_output_tokens": {"type": "integer"},
        "previous_response_id": {"type": "string"}, "store": {"type": "boolean"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1}, **ENGINE}},
}
# Anthropic Messages has its own fields: max_tokens is optional here (--default-max-tokens),
# temperature is in [0, 1], stop strings are stop_sequences (OpenAI's stop is not among them).
ANTHROPIC_PROMPT = {
    "model": {"type": "string"}, "messages": {"type": "array", "items": MESSAGE},
    "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    "tools": {"type": "array", "items": {"type": "object"}}, "tool_choice": {"type": "object"},
    "thinking": {"type": "object"}}
REQUEST_BODIES["/v1/messages"] = {
    "type": "object", "required": ["model", "messages"], "properties": {
        **ANTHROPIC_PROMPT, "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1}, **ENGINE,
        "stop_sequences": {"type": "array", "items": {"type": "string"}, "maxItems": 4}}}
REQUEST_BODIES["/v1/messages/count_tokens"] = {
    "type": "object", "required": ["model", "messages"], "properties": ANTHROPIC_PROMPT}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                     "code": {"type": ["string", "null"]}}}}}
ERROR_STATUSES = {"400": "Invalid request", "401": "Missing or wrong API key",
                  "404": "Not found", "413": "Body too large", "429": "Too many requests",
                  "503": "Unavailable or shutting down"}
ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "request_id": {"type": ["string", "null"]},
    "error": {"type": "object", "properties": {"type": {"type": "string"},
                                               "message": {"type": "string"}}}}}
# serve/core/errors.py: Anthropic routes answer overload with 529 and a queue timeout with 504.
ANTHROPIC_ERROR_STATUSES = {**{k: v for k, v in ERROR_STATUSES.items() if k != "429"},
                            "504": "Timed out waiting for admission", "529": "Overloaded"}
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD")


def _path(template: str) -> str:
    # falcon spells a field {name} or {name:converter}; OpenAPI only {name}.
    result = template
    for part in template.split("{")[1:]:
        field = part.split("}")[0]
        result = result.replace("{" + field + "}", "{" + field.split(":")[0] + "}")
    return result


def _operation(path: str, method: str) -> dict:
    statuses, error = ERROR_STATUSES, "#/components/schemas/Error"
    if is_anthropic_path(path):
        statuses, error = ANTHROPIC_ERROR_STATUSES, "#/components/schemas/AnthropicError"
    operation = {"operationId": f"{method.lower()}{path.replace('/', '_').replace('{', '').replace('}', '')}",
                 "responses": {"200": {"description": "OK"},
                               **{status: {"description": text, "content": {
                                   "application/json": {"schema": {"$ref": error}}}}
                                  for status, text in statuses.items()}}}
    params = [part.split("}")[0] for part in path.split("{")[1:]]
    if params:
        operation["parameters"] = [{"name": name, "in": "path", "required": True,
                                    "schema": {"type": "string"}} for name in params]
    if method == "POST":
        schema = REQUEST_BODIES.get(path, {"type": "object"})
        operation["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": schema}}}
    return operation


def describe(app: falcon.App) -> dict:
    paths: dict[str, dict] = {}
    for route in falcon_inspect.inspect_routes(app):
        path = _path(route.path)
        for method in route.methods:
            if method.method in METHODS and not method.internal:
                paths.setdefault(path, {})[method.method.lower()] = _operation(path, method.method)
    return {"openapi": "3.1.0",
            "info": {"title": "ninfer-jax", "version": "1"},
            "paths": dict(sorted(paths.items())),
            "components": {"schemas": {"Error": ERROR, "AnthropicError": ANTHROPIC_ERROR}}}


class OpenAPIResource:
    def __init__(self, app: falcon.App):
        self.app = app

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = describe(self.app)


def register(app: falcon.App, ctx) -> None:
    app.add_route("/openapi.json", OpenAPIResource(app))
