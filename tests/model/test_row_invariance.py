"""A row's numbers do not depend on the rows beside it: the step of one decode row and a
verify step of K + 1 rows must compute the same bits for the same token, or speculative
output drifts from plain decoding (with 8-bit activation blocks a last-bit difference can move
a code, then a greedy token). The block kernel's own check is in tests/kernels."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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



@pytest.mark.parametrize("kv_dtype", [jnp.float32, jnp.float16])
def test_a_token_attends_with_the_same_bits_in_any_chunk_and_as_a_decode_row(kv_dtype):
    # A prompt's suffix prefilled after a cached prefix, the whole prompt in one chunk, and the
    # token decoded alone must agree in every bit (with the block artifact a last-bit
    # difference became different greedy text for a repeated request).
    from ninfer_jax.kernels import paged_attention
    from ninfer_jax.kernels.ragged_attention import ragged_paged_attention

    if not paged_attention.cpu_decode_ready(jnp.zeros((1, 1, 1, 8), kv_dtype),
                                            jnp.zeros((1, 1, 1, 8), kv_dtype)):
        pytest.skip("the C++ decode attention is not built")
    rng = np.random.default_rng(3)
    pages, K, S, D, H, T = 8, 2, 4, 8, 4, 13
    k_cache = jnp.asarray(rng.standard_normal((pages, K, S, D)), kv_dtype)
    v_cache = jnp.asarray(rng.standard_normal((pages, K, S, D)), kv_dtype)
    table = jnp.asarray([3, 1, 6, 2, 7, 0, 0, 0], jnp.int32)  # 32 positions
    q = jnp.asarray(rng.standard_normal((T, H, D)), jnp.float32)
    attend = jax.jit(ragged_paged_attention, static_argnames=("scale", "num_chunk_tokens"))

    def chunk(start, queries):
        return np.asarray(attend(queries, k_cache, v_cache, chunk_table=table,
                                 chunk_start=jnp.int32(start), row_tables=table[None],
                                 row_lengths=jnp.ones(1, jnp.int32), scale=0.3,
                                 num_chunk_tokens=queries.shape[0])[:queries.shape[0]])

    whole = chunk(0, q)
    suffix = chunk(9, q[9:])  # positions 9..12 after a "cached" prefix
    np.testing.assert_array_equal(suffix, whole[9:])
    rows = np.asarray(attend(q[5:8], k_cache, v_cache, chunk_table=table,
                             chunk_start=jnp.int32(0), row_tables=jnp.stack([table] * 3),
                             row_lengths=jnp.asarray([6, 7, 8], jnp.int32), scale=0.3,
                             num_chunk_tokens=0))
    np.testing.assert_array_equal(rows, whole[5:8])
