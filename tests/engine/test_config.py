"""EngineConfig: bounds, pool sizing, serve options, --kv-capacity auto arithmetic."""
import pytest

from ninfer_jax.engine.config import (
    CPU_AUTO_KV_TOKENS, EngineConfig, auto_kv_tokens, kv_bytes_per_token,
)
from ninfer_jax.serve.config import ServeConfig


def test_bounds_are_checked():
    with pytest.raises(ValueError):
        EngineConfig(max_concurrency=257)
    with pytest.raises(ValueError):
        EngineConfig(max_concurrency=0)
    assert EngineConfig(max_concurrency=256).max_concurrency == 256
    with pytest.raises(ValueError):
        EngineConfig(decode_share=-0.1)
    assert EngineConfig(max_concurrency=8, max_pending=3).max_outstanding == 11


def test_pool_pages_follow_the_kv_capacity_or_the_context():
    assert EngineConfig(max_context=100).num_pages(16) == 7 + 1  # ceil(100/16) + dummy page
    assert EngineConfig(max_context=100, kv_capacity=1024).num_pages(16) == 64 + 1


def test_from_serve_config():
    serve = ServeConfig(artifact="x", max_concurrency=4, max_pending_requests=2,
                        pending_timeout_ms=1500, prefill_chunk=256, decode_share=0.5,
                        max_context=2048, kv_capacity="auto", no_prefix_reuse=True)
    config = EngineConfig.from_serve_config(serve)
    assert (config.max_concurrency, config.max_pending, config.pending_timeout) == (4, 2, 1.5)
    assert (config.prefill_chunk, config.decode_share, config.max_context) == (256, 0.5, 2048)
    assert config.kv_capacity == CPU_AUTO_KV_TOKENS and not config.prefix_reuse
    measured = EngineConfig.from_serve_config(serve, resolved_kv_tokens=4096)
    assert measured.kv_capacity == 4096
    assert EngineConfig.from_serve_config(ServeConfig(artifact="x")).kv_tokens == 8192


def test_auto_kv_tokens_leaves_the_headroom_in_whole_pages():
    per_token = kv_bytes_per_token(num_layers=30, num_kv_heads=3, head_dim=64, dtype_bytes=2)
    assert per_token == 2 * 30 * 3 * 64 * 2
    free = (1 << 30) + per_token * 16 * 10 + 5  # room for exactly 10 pages past the headroom
    assert auto_kv_tokens(free, per_token, page_size=16) == 160
    assert auto_kv_tokens(100, per_token, page_size=16) == 16  # never below one page


def test_large_auto_pools_are_rounded_so_restarts_keep_their_shapes():
    from ninfer_jax.engine.config import AUTO_POOL_GRANULE_PAGES

    per_page = 1024 * 16
    big = 100 * AUTO_POOL_GRANULE_PAGES * per_page
    a = auto_kv_tokens(big + 3 * per_page, 1024, page_size=16, headroom_bytes=0)
    b = auto_kv_tokens(big + 200 * per_page, 1024, page_size=16, headroom_bytes=0)
    assert a == b == 100 * AUTO_POOL_GRANULE_PAGES * 16
    small = auto_kv_tokens(37 * per_page, 1024, page_size=16, headroom_bytes=0)
    assert small == 37 * 16  # small pools keep every page
    # a pool of ~17k pages (run 41's H100) rounds to 256 pages (a restart that straddles a
    # granule's edge, as run 41's 17144 and 17173 would, keeps its pool in kv_sizing)
    assert auto_kv_tokens(16900 * per_page, 1024, page_size=16, headroom_bytes=0) == \
        auto_kv_tokens(17144 * per_page, 1024, page_size=16, headroom_bytes=0) == 16896 * 16
    for pages in (64, 100, 1000, 17144, 10**6):  # never more than 1/64 of the pool unused
        kept = auto_kv_tokens(pages * per_page, 1024, page_size=16, headroom_bytes=0) // 16
        assert pages - pages // 64 <= kept <= pages


def test_the_default_host_budget_adds_eight_states_an_explicit_one_does_not():
    default = EngineConfig.from_serve_config(ServeConfig(artifact="x"))
    page, state = 1 << 16, 5 * (1 << 16) + 1  # a state takes 6 page slots
    assert default.host_pages(page) == 8192 * 16
    assert default.host_pages(page, state) == 8192 * 16 + 8 * 6
    explicit = EngineConfig.from_serve_config(ServeConfig(artifact="x", host_context_mib=64))
    assert explicit.host_pages(page, state) == 64 * 16
    assert EngineConfig(host_context_mib=0).host_pages(page, state) == 0
