"""Sampling resolution: model defaults < process flags < request fields, then --greedy.

Model defaults depend on the loaded model and on whether the reply starts in thinking mode
(Qwen publishes different settings for the two modes). Unregistered models sample with the
engine's neutral defaults. The seed is the request's, else --seed, else a fresh random one,
so every request the engine sees is reproducible from its log record.
"""
from __future__ import annotations

import dataclasses
import secrets

from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.serve.config import SamplingOverrides

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                   "frequency_penalty")
# Seeds reach the device as non-negative 63-bit integers; signed client seeds fold into them.
SEED_MODULUS = 2 ** 63


@dataclasses.dataclass(frozen=True)
class SamplingPreset:
    """(name prefix or architecture) -> defaults for thinking and non-thinking replies."""

    match: str
    thinking: dict
    non_thinking: dict


# The first preset whose `match` prefixes the model name (or equals the architecture) wins.
PRESETS = (
    # SmolLM2's model card samples with these settings.
    SamplingPreset("smollm2", {}, {"temperature": 0.2, "top_p": 0.9}),
    SamplingPreset("qwen3.6-35b-a3b",
                   {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                    "presence_penalty": 1.5},
                   {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0,
                    "presence_penalty": 1.5}),
    SamplingPreset("qwen3.6", {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0},
                   {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0,
                    "presence_penalty": 1.5}),
    SamplingPreset("qwen3.8", {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0},
                   {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0,
                    "presence_penalty": 1.5}),
    # Qwen3's published recommendations for its two modes.
    SamplingPreset("qwen3", {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0},
                   {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0}),
)


def model_defaults(model_name: str, architecture: str, thinking: bool) -> dict:
    name = (model_name or "").lower()
    for preset in PRESETS:
        if name.startswith(preset.match) or architecture == preset.match:
            chosen = preset.thinking if thinking else preset.non_thinking
            return dict(chosen or preset.non_thinking)
    return {}


def resolve_sampling(defaults: dict, overrides: SamplingOverrides, request: dict,
                     seed: int | None) -> SamplingParams:
    """`request` maps SAMPLING_FIELDS to the client's values (None = not given)."""
    values = dict(defaults)
    for name in SAMPLING_FIELDS:
        flag = getattr(overrides, name)
        if flag is not None:
            values[name] = flag
        if request.get(name) is not None:
            values[name] = request[name]
    if overrides.greedy:
        values["temperature"] = 0.0
    if seed is None:
        seed = overrides.seed
    if seed is None:
        seed = secrets.randbelow(SEED_MODULUS)
    return SamplingParams(**values, seed=seed % SEED_MODULUS)
