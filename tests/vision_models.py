"""Tiny random multimodal models whose text depends on their input, shared by the vision tests
(tests/model/test_vision_engine.py, tests/e2e/test_vision_live.py).

At the drawn scale a tiny random model's residual stream is the last token's embedding and it
repeats one token (or one newline) whatever the context or the image says, so a test that
compares texts would compare constants. Scaling the attention and MLP outputs up makes the
context, images included, decide the tokens.
"""
from __future__ import annotations

GAIN = 8.0


def sharpen(params: dict, gain: float = GAIN) -> dict:
    """The text layers' attention and MLP output projections scaled by `gain`, in place."""
    for layer in params["layers"]:
        layer["wo"], layer["w_down"] = layer["wo"] * gain, layer["w_down"] * gain
    return params
