"""Numeric limits the compiled steps are built around, below the engine that enforces them."""
from __future__ import annotations

# Sampling over the 20 most likely tokens at most; top_k <= 0 means "the cap" (the spec's rule).
TOP_K_CAP = 20
