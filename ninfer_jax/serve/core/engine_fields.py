"""The engine-level request fields every dialect accepts under the same names.

Chat and Completions, Responses and Anthropic Messages all read `seed`, `ignore_eos`,
`stop_token_ids` and the sampler extensions `top_k`, `min_p`, `presence_penalty` and
`frequency_penalty` here, so a value means the same thing (and fails with the same 400) in
every dialect. Each dialect keeps its own range for the fields its wire API defines itself
(Anthropic's temperature is 0..1, OpenAI's 0..2).
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.errors import InvalidRequest
from ninfer_jax.serve.core.fields import (opt_bool, opt_int, opt_number, opt_top_k,
                                          require_int, require_list)

MAX_STOP_TOKEN_IDS = 64
# OpenAI's seed is a signed 64-bit integer; vLLM takes unsigned ones (sampling.py folds both).
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)
TOP_K_MAX = 20
SAMPLER_RANGES = {"min_p": (0.0, 1.0), "presence_penalty": (-2.0, 2.0),
                  "frequency_penalty": (-2.0, 2.0)}
ENGINE_FIELDS = ("seed", "ignore_eos", "stop_token_ids", "top_k", *SAMPLER_RANGES)


@dataclasses.dataclass(frozen=True)
class EngineFields:
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    sampling: dict = dataclasses.field(default_factory=dict)  # top_k, min_p, penalties


def stop_token_ids(value, vocab_size: int) -> tuple[int, ...]:
    """vLLM's `stop_token_ids`: token ids that end the reply like an end token (counted in
    usage, never shown). Every id must be one the model can produce."""
    if value is None:
        return ()
    ids = require_list(value, "stop_token_ids")
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidRequest(f"'stop_token_ids' holds at most {MAX_STOP_TOKEN_IDS} token ids, "
                             f"got {len(ids)}.", param="stop_token_ids")
    ids = [require_int(token, "stop_token_ids", 0, vocab_size - 1,
                       where=f"stop_token_ids[{index}]") for index, token in enumerate(ids)]
    return tuple(dict.fromkeys(ids))


def sampler_extensions(body: dict) -> dict:
    """top_k, min_p and the two penalties (None: not given, the server's default holds)."""
    values = {name: opt_number(body.get(name), name, *bounds)
              for name, bounds in SAMPLER_RANGES.items()}
    values["top_k"] = opt_top_k(body.get("top_k"), "top_k", TOP_K_MAX)
    return values


def engine_fields(body: dict, vocab_size: int) -> EngineFields:
    return EngineFields(
        seed=opt_int(body.get("seed"), "seed", *SEED_RANGE),
        ignore_eos=bool(opt_bool(body.get("ignore_eos"), "ignore_eos")),
        stop_token_ids=stop_token_ids(body.get("stop_token_ids"), vocab_size),
        sampling=sampler_extensions(body))
