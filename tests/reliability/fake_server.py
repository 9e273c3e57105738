"""A real gunicorn server (ninfer's worker class, settings and shutdown hooks) over the
fake-model harness: what `ninfer serve` runs, minus the engine-core process and JAX.

Run as `python fake_server.py ARTIFACT OPTIONS_JSON`: OPTIONS_JSON holds ServeConfig fields
(port included) plus the harness's own (decode_sleep, max_context, engine_options: {lanes,
pending, host_mib, kv_pages}; scripts: {key: text}). It logs to stderr like the real
launcher; the test talks to it over TCP.
"""
from __future__ import annotations

import collections
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "serve"))

from harness import build_harness  # noqa: E402

from ninfer_jax.artifact.format import load_artifact  # noqa: E402
from ninfer_jax.serve.config import ServeConfig  # noqa: E402
from ninfer_jax.serve.launcher import NinferApplication  # noqa: E402

HARNESS_OPTIONS = ("decode_sleep", "max_context", "engine_options")


class _NoCore:
    address = authkey = None

    def close_in_child(self) -> None:
        pass


class FakeApplication(NinferApplication):
    def __init__(self, artifact_path: str, options: dict):
        self.artifact_path = artifact_path
        self.scripts = options.pop("scripts", {})
        self.harness_options = {k: options.pop(k) for k in HARNESS_OPTIONS if k in options}
        self.options = options
        super().__init__(ServeConfig(artifact=artifact_path, **options), _NoCore())

    def load(self):
        artifact = load_artifact(self.artifact_path, weights=False)
        h = build_harness(artifact, **self.harness_options, **self.options)
        for key, text in self.scripts.items():
            h.book.add(key, text, end=not key.startswith("ramble"))
        # The fake runner records every step and plan for unit tests' assertions; a soak
        # measures the worker's memory, so only the latest are kept here.
        h.runner.steps = collections.deque(h.runner.steps, maxlen=100)
        h.runner.plans = collections.deque(h.runner.plans, maxlen=100)
        self.ctx = h.ctx
        return h.app


if __name__ == "__main__":
    from ninfer_jax.serve.launcher import logging_config

    import logging.config

    options = json.loads(sys.argv[2])
    logging.config.dictConfig(logging_config(options.get("log_level", "info")))
    FakeApplication(sys.argv[1], options).run()
