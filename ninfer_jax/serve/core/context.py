"""ServingContext: everything a wire adapter needs, built once per worker process.

Adapters receive it through `register(app, ctx)` and never reach for globals. It holds the
engine (anything with `submit`, `stats`, `healthy` and a `ready` event: in `ninfer serve` an
engine/core_client.EngineClient talking to the engine-core process, in tests and replay an
in-process Engine), the tokenizer and chat
renderer of the loaded artifact, the public model id, the ServeConfig and what the artifact's
metadata says about its chat format (reasoning markers, tool-call format, thinking default).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

from ninfer_jax.engine.request import GenerationRequest, RequestHandle
from ninfer_jax.serve.config import ServeConfig
from ninfer_jax.serve.wire.shutdown import InFlight


class EngineLike(Protocol):
    ready: Any  # threading.Event, set once warm-up finished

    @property
    def healthy(self) -> bool: ...

    def submit(self, request: GenerationRequest) -> RequestHandle: ...

    def stats(self) -> Any: ...


@dataclasses.dataclass
class ServingContext:
    engine: EngineLike
    tokenizer: Any  # text.tokenizer.Tokenizer
    renderer: Any  # text.chat_template.ChatRenderer
    model_id: str  # the public id requests must name
    config: ServeConfig
    metadata: dict  # the artifact's metadata.json
    max_context: int  # effective per-sequence ceiling (prompt + output)
    started_at: float = dataclasses.field(default_factory=time.time)
    # Services other helpers attach (request log, metrics); None when not configured.
    extras: dict = dataclasses.field(default_factory=dict)
    # The requests a stopping worker ends after --shutdown-timeout (serve/wire/shutdown.py).
    in_flight: InFlight = dataclasses.field(default_factory=InFlight)
    # serve/media/intake.MediaIntake with --vision (built by create_app), else None.
    media: Any = None

    @property
    def chat_format(self) -> dict:
        return self.metadata.get("chat_format") or {}

    @property
    def model_name(self) -> str:
        return self.metadata.get("name") or self.metadata.get("architecture", "")

    @property
    def architecture(self) -> str:
        return self.metadata.get("architecture", "")

    @property
    def eos_ids(self) -> frozenset[int]:
        return frozenset((self.metadata.get("special_tokens") or {}).get("eos_ids", ()))

    @property
    def reasoning_markers(self) -> tuple[str, str] | None:
        reasoning = self.chat_format.get("reasoning")
        if not reasoning:
            return None
        return reasoning["open"], reasoning["close"]

    @property
    def tool_call_format(self) -> str | None:
        return self.chat_format.get("tool_call_format")

    @property
    def thinking_default(self) -> bool:
        return bool(self.chat_format.get("thinking_default")) and self.reasoning_markers is not None

    def new_detokenizer(self):
        from ninfer_jax.text.detokenizer import IncrementalDetokenizer

        return IncrementalDetokenizer(self.tokenizer)
