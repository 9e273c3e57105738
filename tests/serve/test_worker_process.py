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
