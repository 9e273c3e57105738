"""Engine cores for tests: a real engine-core process running Engine(FakeRunner).

`start_fake_core(**options)` spawns the core exactly as the launcher does (same
CoreSpec path, same socket protocol) with `fake_engine` as its factory; the options are
fake_engine's. Factories here are module-level so the spawned process can import them.
"""
from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import tempfile
import time

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.core_process import CoreSpec, start_core
from ninfer_jax.engine.engine import Engine
from ninfer_jax.engine.fake import FakeRunner

from engine_testkit import VOCAB


def fake_engine(*, num_pages=64, page_size=4, lanes=4, pending=16, max_context=256,
                prefill_chunk=64, decode_sleep=0.0, warmup_sleep=0.0,
                fail_at_step=None) -> Engine:
    runner = FakeRunner(num_pages=num_pages, page_size=page_size, max_batch=8,
                        vocab_size=VOCAB, decode_sleep=decode_sleep, warmup_sleep=warmup_sleep,
                        fail_at_step=fail_at_step)
    config = EngineConfig(max_concurrency=lanes, max_pending=pending, max_context=max_context,
                          kv_capacity=(num_pages - 1) * page_size, prefill_chunk=prefill_chunk)
    return Engine(runner, config, eos_ids=())


def env_probe(path: str, names: tuple, **options) -> Engine:
    """fake_engine, after writing what the factory sees of `names` in os.environ to `path`."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({name: os.environ.get(name) for name in names}, handle)
    return fake_engine(**options)


_BACKGROUND: list = []


def compiling_in_background(seconds: float, **options) -> Engine:
    """fake_engine, with a thread pool busy for `seconds`, as JaxRunner's background compile
    of the remaining step shapes is on a GPU (concurrent.futures joins such threads at exit)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    _BACKGROUND.append(pool.submit(time.sleep, seconds))
    return fake_engine(**options)


def start_fake_core(*, factory=fake_engine, env=None, **options):
    # A short directory of its own: a Unix socket path must fit in 108 bytes.
    directory = tempfile.mkdtemp(prefix="ninfer-core-test-")
    spec = CoreSpec(factory=functools.partial(factory, **options), env=dict(env or {}))
    core = start_core(spec, os.path.join(directory, "core.sock"))
    core.wait_listening(60)
    return core
