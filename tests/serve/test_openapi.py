"""GET /openapi.json (serve/wire/openapi.py): every route the app serves is described, with its
methods, and the document has OpenAPI 3.1's required structure."""
import re

from falcon import inspect as falcon_inspect

OPERATION_KEYS = {"get", "post", "put", "delete", "patch", "head"}


def test_every_served_route_is_described(client, harness):
    reply = client.simulate_get("/openapi.json")
    assert reply.status_code == 200
    doc = reply.json
    served = {}
    for route in falcon_inspect.inspect_routes(harness.app):
        path = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.path)
        methods = {m.method.lower() for m in route.methods if not m.internal}
        served[path] = methods & OPERATION_KEYS
    assert "/v1/chat/completions" in served and "/openapi.json" in served
    for path, methods in served.items():
        assert set(doc["paths"][path]) == methods, path


def test_document_is_structurally_valid_openapi_31(client):
    doc = client.simulate_get("/openapi.json").json
    assert doc["openapi"].startswith("3.1.")
    assert {"title", "version"} <= set(doc["info"])
    refs = set()
    operation_ids = []
    for path, item in doc["paths"].items():
        assert path.startswith("/")
        for method, operation in item.items():
            assert method in OPERATION_KEYS
            assert operation["responses"] and all(
                re.fullmatch(r"[1-5]\d\d", status) and "description" in body
                for status, body in operation["responses"].items())
            operation_ids.append(operation["operationId"])
            names = re.findall(r"\{(\w+)\}", path)
            assert sorted(p["name"] for p in operation.get("parameters", [])
                          if p["in"] == "path") == sorted(names)
            if "requestBody" in operation:
                assert "application/json" in operation["requestBody"]["content"]
            refs |= set(re.findall(r'"\$ref": "([^"]+)"', str(operation).replace("'", '"')))
    assert len(operation_ids) == len(set(operation_ids))
    for ref in refs:
        assert ref.startswith("#/components/schemas/")
        assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"]
    chat = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
    assert "messages" in chat["application/json"]["schema"]["required"]


def test_anthropic_routes_describe_their_own_fields_and_errors(client):
    doc = client.simulate_get("/openapi.json").json
    create = doc["paths"]["/v1/messages"]["post"]
    schema = create["requestBody"]["content"]["application/json"]["schema"]
    assert "max_tokens" not in schema["required"]  # optional: --default-max-tokens
    assert "stop" not in schema["properties"]  # stop strings are stop_sequences
    for path in ("/v1/messages", "/v1/responses", "/v1/chat/completions"):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert {"seed", "ignore_eos", "stop_token_ids", "min_p"} <= set(
            body["schema"]["properties"]), path
    assert schema["properties"]["temperature"]["maximum"] == 1
    count = doc["paths"]["/v1/messages/count_tokens"]["post"]
    assert "messages" in count["requestBody"]["content"]["application/json"]["schema"]["required"]
    for operation in (create, count):
        assert {"504", "529"} <= set(operation["responses"]) and "429" not in operation["responses"]
        ref = operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/AnthropicError"
    error = client.simulate_post("/v1/messages", json={"model": "m", "messages": []}).json
    assert set(error) == set(doc["components"]["schemas"]["AnthropicError"]["properties"])
