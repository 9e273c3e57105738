"""An HTTP worker's side of the process layout: a fresh interpreter builds the worker's app
over an EngineClient connected to a real engine core (fake runner), serves a chat request
through it, and must not have imported JAX (on a GPU a worker importing JAX would claim
device memory)."""
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "engine"))

from core_testkit import start_fake_core  # noqa: E402

WORKER = """
import json, sys
from falcon import testing
from ninfer_jax.serve.app import create_app
from ninfer_jax.serve.config import ServeConfig
from ninfer_jax.serve.launcher import build_worker_context

config = ServeConfig(artifact=sys.argv[1], log_stats_interval_ms=0,
                     allowed_hosts=("falconframework.org",))
ctx = build_worker_context(config, sys.argv[2], bytes.fromhex(sys.argv[3]))
ctx.engine.wait_ready(30)
client = testing.TestClient(create_app(ctx))
# greedy: the fake runner's sampled ids are random in its 1,000-token vocabulary, where
# SmolLM2's end-of-turn ids (0, 2) ended 5 tokens early now and then (a CI run: 2 tokens)
reply = client.simulate_post("/v1/chat/completions", json={
    "model": ctx.model_id, "max_tokens": 5, "temperature": 0,
    "messages": [{"role": "user", "content": "hi"}]})
health = client.simulate_get("/health")
print(json.dumps({
    "status": reply.status_code, "usage": reply.json.get("usage"), "health": health.json,
    "max_context": ctx.max_context,
    "jax": sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib"))}))
ctx.engine.shutdown()
"""


def test_worker_serves_through_the_core_without_importing_jax(default_artifact_path):
    core = start_fake_core(max_context=256)
    try:
        result = subprocess.run(
            [sys.executable, "-c", WORKER, str(default_artifact_path), core.address,
             core.authkey.hex()], capture_output=True, text=True, timeout=120)
    finally:
        core.stop()
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["jax"] == []
    assert report["status"] == 200 and report["usage"]["completion_tokens"] == 5
    assert report["health"]["status"] == "ok"
    assert report["max_context"] == 256  # the core's engine config, not the CLI default


def test_a_worker_answers_health_while_its_engine_is_built():
    """Before the engine core has built its engine (the weights take 10-20 s on a GPU) a
    worker answers GET / HEAD /health with 503 "loading" at once and holds every other
    request until its app exists, then hands it over; afterwards the app answers all."""
    import threading

    from falcon import testing

    from ninfer_jax.serve.launcher import _WhileBuilding

    starting = _WhileBuilding()
    client = testing.TestClient(starting)
    health = client.simulate_get("/health")
    assert health.status_code == 503
    assert health.json == {"status": "loading", "compiled_shapes": 0, "total_shapes": 0}
    head = client.simulate_head("/health")
    assert head.status_code == 503 and head.content == b""

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']}".encode()]

    replies = []
    waiting = threading.Thread(target=lambda: replies.append(
        client.simulate_post("/v1/chat/completions", body="{}")))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and not replies  # held until the app exists
    starting.serve(app)
    waiting.join(10)
    assert replies[0].status_code == 200 and replies[0].text == "POST /v1/chat/completions"
    assert client.simulate_get("/health").text == "GET /health"
