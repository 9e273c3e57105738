"""A row's numbers do not depend on the rows beside it: the step of one decode row and a
verify step of K + 1 rows must compute the same bits for the same token, or speculative
output drifts from plain decoding (with 8-bit activation blocks a last-bit difference can move
a code, then a greedy token). The block kernel's own check is in tests/kernels."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.model.layers import rms_norm


def test_rms_norm_gives_a_row_the_same_bits_in_any_number_of_rows():
    # Verify rows must compute what a decode row computes (speculation stays exact with
    # 8-bit activation blocks): XLA CPU's reduction alone differed in the last bit.
    rng = np.random.default_rng(8)
    weight = jnp.asarray(rng.standard_normal(576), jnp.float32)
    norm = jax.jit(lambda x: rms_norm(x, weight, 1e-5))
    x = rng.standard_normal((8, 576)).astype(np.float32) * 3.0
    full = np.asarray(norm(jnp.asarray(x)))
    for rows in (1, 2, 3, 5):
        np.testing.assert_array_equal(np.asarray(norm(jnp.asarray(x[:rows]))), full[:rows])
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(full, want * np.asarray(weight), rtol=1e-5, atol=1e-5)

