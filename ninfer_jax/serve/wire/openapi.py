"""GET /openapi.json: an OpenAPI 3.1 description of the routes this app serves.

The paths and methods come from the app's own router at request time, so a route added by
any adapter is described without editing this module; request bodies of the main POST
routes carry schemas of their main fields, and every operation lists the error shape."""
from __future__ import annotations

import falcon
from falcon import inspect as falcon_inspect

MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string"}, "content": {}, "name": {"type": "string"}}}
SAMPLING = {
    "model": {"type": "string"}, "stream": {"type": "boolean"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0}, "top_p": {"type": "number"},
    "seed": {"type": "integer"}, "stop": {"oneOf": [{"type": "string"},
                                                    {"type": "array", "items": {"type": "string"}}]}}
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
        "previous_response_id": {"type": "string"}, "store": {"type": "boolean"}}},
    "/v1/messages": {"type": "object", "required": ["messages", "max_tokens"], "properties": {
        **SAMPLING, "messages": {"type": "array", "items": MESSAGE}, "system": {},
        "stop_sequences": {"type": "array", "items": {"type": "string"}}}},
}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                     "code": {"type": ["string", "null"]}}}}}
ERROR_STATUSES = {"400": "Invalid request", "401": "Missing or wrong API key",
                  "404": "Not found", "413": "Body too large", "429": "Too many requests",
                  "503": "Unavailable or shutting down"}
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD")


def _path(template: str) -> str:
    # falcon spells a field {name} or {name:converter}; OpenAPI only {name}.
    result = template
    for part in template.split("{")[1:]:
        field = part.split("}")[0]
        result = result.replace("{" + field + "}", "{" + field.split(":")[0] + "}")
    return result


def _operation(path: str, method: str) -> dict:
    operation = {"operationId": f"{method.lower()}{path.replace('/', '_').replace('{', '').replace('}', '')}",
                 "responses": {"200": {"description": "OK"},
                               **{status: {"description": text, "content": {
                                   "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
                                  for status, text in ERROR_STATUSES.items()}}}
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
            "components": {"schemas": {"Error": ERROR}}}


class OpenAPIResource:
    def __init__(self, app: falcon.App):
        self.app = app

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = describe(self.app)


def register(app: falcon.App, ctx) -> None:
    app.add_route("/openapi.json", OpenAPIResource(app))
