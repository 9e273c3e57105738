"""--kv-capacity auto arithmetic (serve/kv_sizing.py), without starting a server."""
import dataclasses

import jax.numpy as jnp
import numpy as np

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.serve import kv_sizing
from ninfer_jax.serve.config import ServeConfig

GIB = 1 << 30
# SmolLM2-135M: 30 layers, 3 KV heads of 64 -> 2 * 30 * 3 * 64 = 11520 values per token.
SMOLLM2 = dataclasses.make_dataclass(
    "Cfg", ["num_layers", "num_kv_heads", "head_dim", ("is_hybrid", bool, False),
            ("is_gemma", bool, False), ("is_nemotron", bool, False), ("has_state", bool, False),
            ("architecture", str, "llama"), ("vocab_size", int, 49152)])(30, 3, 64)


def test_gemma_pages_hold_the_full_layers_and_state_slots_the_sliding_rings():
    import dataclasses as dc

    from ninfer_jax.artifact.presets import PRESETS

    config = PRESETS["gemma4-31b"].config  # 50 sliding: 16 kv heads of 256; 10 full: 4 of 512
    assert kv_sizing.attention_layers(config) == 10
    assert kv_sizing.bytes_per_token_of(config, jnp.bfloat16) == 10 * 2 * 4 * 512 * 2
    # a ring per slot: window 1024 + a step of 2048 tokens - 1, in pages of 16: 192 pages
    ring = kv_sizing.state_bytes_of(config, jnp.bfloat16, 3, kv_dtype=jnp.bfloat16,
                                    page_size=16, step_tokens=2048)
    assert ring == 3 * 192 * 16 * 50 * 2 * 16 * 256 * 2
    shared = dc.replace(config, num_kv_shared_layers=12)  # 10 sliding and 2 full read others'
    assert kv_sizing.attention_layers(shared) == 8
    assert kv_sizing.bytes_per_token_of(shared, jnp.bfloat16) == 8 * 2 * 4 * 512 * 2
    assert kv_sizing.state_bytes_of(shared, jnp.bfloat16, 3, kv_dtype=jnp.bfloat16,
                                    page_size=16, step_tokens=2048) == ring * 40 // 50
    serve = ServeConfig(artifact="x", max_concurrency=2, device_state_slots=0)
    assert kv_sizing.device_state_slots_of(serve, config) == 3  # 2 lanes + the dummy


def test_nemotron_pools_count_attention_layers_and_state_bytes_per_mamba_layer():
    from ninfer_jax.artifact.presets import PRESETS

    config = PRESETS["nemotron-h-8b"].config  # 24 Mamba-2, 4 attention, 24 MLP layers
    assert kv_sizing.attention_layers(config) == 4
    assert kv_sizing.bytes_per_token_of(config, jnp.bfloat16) == 4 * 2 * 8 * 128 * 2
    conv, ssm = 3 * (128 * 64 + 2 * 8 * 128) * 2, 128 * 64 * 128 * 4  # bf16 conv, f32 SSM
    assert kv_sizing.state_bytes_of(config, jnp.bfloat16, 3) == 3 * 24 * (conv + ssm)
    serve = ServeConfig(artifact="x", max_concurrency=2, device_state_slots=2)
    assert kv_sizing.device_state_slots_of(serve, config) == 5  # 2 lanes + 2 extra + dummy


def test_bytes_per_token_follows_the_kv_dtype():
    assert kv_sizing.bytes_per_token_of(SMOLLM2, jnp.float32) == 11520 * 4
    assert kv_sizing.bytes_per_token_of(SMOLLM2, jnp.bfloat16) == 11520 * 2
    # 8-bit codes plus a float32 scale per token, kv head, k and v: 2 * 30 * 3 * (64 + 4).
    for dtype in (jnp.float8_e4m3fn, jnp.int8):
        assert kv_sizing.bytes_per_token_of(SMOLLM2, dtype) == 2 * 30 * 3 * 68
    # 4-bit pages: 32 bytes of codes, 4 e4m3 block scales and a float32 scale per head of 64;
    # k8v4's keys are int8 pages (64 + 4), nvfp4's keys 4-bit as its values.
    from ninfer_jax.kernels.paged_attention import K8V4, NVFP4
    assert kv_sizing.bytes_per_token_of(SMOLLM2, K8V4) == 30 * 3 * (68 + 40)
    assert kv_sizing.bytes_per_token_of(SMOLLM2, NVFP4) == 2 * 30 * 3 * 40
    # so --kv-capacity auto fits more tokens in the same memory
    tokens = {dtype: kv_sizing.cpu_auto_kv_tokens(GIB, kv_sizing.bytes_per_token_of(
        SMOLLM2, dtype), page_size=16, max_context=1 << 20)
        for dtype in (jnp.bfloat16, jnp.int8, K8V4, NVFP4)}
    assert tokens[jnp.bfloat16] < tokens[jnp.int8] < tokens[K8V4] < tokens[NVFP4]


def test_the_mtp_head_adds_one_attention_layer_per_token():
    from ninfer_jax.artifact.presets import PRESETS

    config = PRESETS["qwen3.5-27b"].config  # 16 full-attention layers: 4 kv heads of 256
    plain = kv_sizing.bytes_per_token_of(config, jnp.bfloat16)
    assert plain == 16 * 2 * 4 * 256 * 2
    assert kv_sizing.bytes_per_token_of(config, jnp.bfloat16, mtp=True) == plain * 17 // 16


def test_cpu_is_bounded_by_a_quarter_of_available_ram():
    per_token = 11520 * 4
    # 1 GiB available: a quarter is 268435456 B = 5825.4 tokens -> 364 whole 16-token pages.
    tokens = kv_sizing.cpu_auto_kv_tokens(GIB, per_token, page_size=16, max_context=8192)
    assert tokens == 5824 and tokens * per_token <= GIB // 4
    assert (tokens + 16) * per_token > GIB // 4


def test_cpu_is_bounded_by_sixteen_contexts():
    tokens = kv_sizing.cpu_auto_kv_tokens(512 * GIB, 11520 * 4, page_size=16, max_context=1024)
    assert tokens == 16 * 1024


def test_cpu_never_below_one_page():
    assert kv_sizing.cpu_auto_kv_tokens(1000, 11520 * 4, page_size=16, max_context=1024) == 16


def test_device_memory_wins_when_the_device_reports_it():
    per_token = 11520 * 2
    sizing = kv_sizing.auto_kv_sizing(free_device_bytes=3 * GIB, available_host_bytes=GIB,
                                      bytes_per_token=per_token, page_size=16,
                                      max_context=8192)
    # 2 GiB after the headroom: 93206.7 tokens -> 5825 pages of 16, rounded down to a
    # granule of 64 pages (at most 1/64 of the pool): 5824.
    assert sizing.tokens == 5824 * 16
    assert "GiB free on the device" in sizing.basis
    cpu = kv_sizing.auto_kv_sizing(free_device_bytes=None, available_host_bytes=GIB,
                                   bytes_per_token=per_token, page_size=16, max_context=8192)
    assert cpu.tokens == kv_sizing.cpu_auto_kv_tokens(GIB, per_token, page_size=16,
                                                      max_context=8192)
    assert cpu.basis.startswith("CPU:")


class FakeDevice:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_device_free_bytes():
    assert kv_sizing.device_free_bytes(FakeDevice(None)) is None
    assert kv_sizing.device_free_bytes(FakeDevice({"bytes_in_use": 5})) is None
    stats = {"bytes_limit": 10 * GIB, "bytes_in_use": 3 * GIB}
    assert kv_sizing.device_free_bytes(FakeDevice(stats)) == 7 * GIB


def test_host_available_bytes_is_plausible():
    available = kv_sizing.host_available_bytes()
    assert 0 < available < 1 << 50


def test_measured_tokens_reach_the_engine_config():
    serve = ServeConfig(artifact="x", kv_capacity="auto", max_context=1024)
    engine = EngineConfig.from_serve_config(serve, resolved_kv_tokens=5824)
    assert engine.kv_tokens == 5824 and engine.num_pages(16) == 5824 // 16 + 1


def test_place_weights_casts_once_so_the_runner_cast_is_free():
    from ninfer_jax.model import steps

    artifact = dataclasses.make_dataclass("A", ["params", "config"])(
        {"w": np.ones((2, 3), np.float32), "codes": np.zeros(4, np.int8)}, SMOLLM2)
    placed = kv_sizing.place_weights(artifact, jnp.bfloat16)
    assert placed.params["w"].dtype == jnp.bfloat16 and placed.params["codes"].dtype == jnp.int8
    again = steps.cast_params(placed.params, jnp.bfloat16)
    assert again["w"] is placed.params["w"]  # no second copy on the device


def test_place_weights_fuses_on_the_host_so_the_runner_keeps_the_placed_leaves():
    from ninfer_jax.artifact.random_init import random_params
    from ninfer_jax.model import fused_projections, steps

    from ninfer_jax.model.config import ModelConfig

    config = ModelConfig("llama", vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
    artifact = dataclasses.make_dataclass("A", ["params", "config"])(
        random_params(config, seed=0, dtype="f32"), config)
    placed = kv_sizing.place_weights(artifact, jnp.float32)
    layer = placed.params["layers"][0]
    assert {"wqkv", "w_gate_up"} <= set(layer) and "wq" not in layer
    again = steps.cast_params(fused_projections.fuse_projections(placed.params, config),
                              jnp.float32)
    assert again["layers"][0]["wqkv"] is layer["wqkv"]  # no second copy on the device


def test_default_pool_is_a_context_per_lane_within_the_bound():
    def default(lanes, bound, max_context=1024):
        return kv_sizing.default_kv_tokens(lanes=lanes, max_context=max_context, bound=bound,
                                           page_size=16)

    assert default(8, bound=65536) == 8 * 1024
    assert default(8, bound=5000) == 5008  # the bound, in whole pages
    assert default(4, bound=100) == 1024  # never below one full context
    assert default(1, bound=65536) == 1024
    assert default(3, bound=65536, max_context=1000) == 3008


def test_resolve_pool_measures_only_for_auto_or_several_lanes():
    artifact = dataclasses.make_dataclass("A", ["params", "config"])(
        {"w": np.ones((2, 3), np.float32)}, SMOLLM2)

    def resolve(**options):
        serve = ServeConfig(artifact="x", max_context=1024, **options)
        placed, tokens = kv_sizing.resolve_pool(serve, artifact, jnp.float32, jnp.float32,
                                                max_context=1024, page_size=16)
        return placed is not artifact, tokens, EngineConfig.from_serve_config(
            serve, resolved_kv_tokens=tokens).kv_tokens

    assert resolve(kv_capacity=3000) == (False, 3000, 3000)
    assert resolve() == (False, None, 1024)  # one lane: one context
    measured, tokens, pool = resolve(max_concurrency=4)
    assert measured and tokens == pool == 4 * 1024  # this host has room for 4 contexts
    measured, tokens, pool = resolve(kv_capacity="auto", max_concurrency=4)
    assert measured and tokens == pool >= 4 * 1024


def test_device_pool_leaves_room_for_a_compile_of_the_largest_weight():
    """GPU compiles autotune on copies of a matmul's operands: the pool leaves one copy of
    the largest weight per background compile thread free besides the 1 GiB headroom."""
    import numpy as np

    from ninfer_jax.engine.runner import BACKGROUND_COMPILE_THREADS

    params = {"embed": np.zeros((1000, 64), np.float32), "w": np.zeros((8, 8), np.float32)}
    assert kv_sizing.compile_scratch_bytes(params) == (BACKGROUND_COMPILE_THREADS * 1000 * 64
                                                       * 4)
    per_token = 11520 * 2
    sizing = kv_sizing.auto_kv_sizing(free_device_bytes=4 * GIB, available_host_bytes=GIB,
                                      bytes_per_token=per_token, page_size=16,
                                      max_context=8192, scratch_bytes=GIB)
    # 4 GiB - 1 GiB headroom - 1 GiB scratch: the same 2 GiB as above.
    assert sizing.tokens == 5824 * 16
    assert "compile scratch" in sizing.basis


def test_hybrid_pools_count_attention_layers_and_leave_out_the_state_slots():
    from ninfer_jax.model.config import ModelConfig

    hybrid = ModelConfig(architecture="qwen3_5", vocab_size=64, hidden_size=8,
                         intermediate_size=8, num_layers=4, num_heads=2, num_kv_heads=1,
                         head_dim=8, layer_types=("linear_attention",) * 3 + ("full_attention",),
                         linear_num_key_heads=1, linear_num_value_heads=2,
                         linear_key_head_dim=4, linear_value_head_dim=4,
                         linear_conv_kernel_dim=4)
    assert kv_sizing.attention_layers(hybrid) == 1 and kv_sizing.attention_layers(SMOLLM2) == 30
    assert kv_sizing.bytes_per_token_of(hybrid, jnp.float32) == 2 * 1 * 8 * 4
    conv_dim = 2 * 1 * 4 + 2 * 4
    per_slot = 3 * ((4 - 1) * conv_dim * 2 + 2 * 4 * 4 * 4)  # bf16 conv, f32 recurrent
    assert kv_sizing.state_bytes_of(hybrid, jnp.bfloat16, 5) == 5 * per_slot
    assert kv_sizing.state_bytes_of(SMOLLM2, jnp.bfloat16, 5) == 0
    serve = ServeConfig(artifact="x", max_concurrency=2, device_state_slots=2)
    assert kv_sizing.device_state_slots_of(serve, hybrid) == 5  # 2 lanes + 2 extra + dummy
    assert kv_sizing.device_state_slots_of(serve, SMOLLM2) == 0
    per_token = 64
    plain = kv_sizing.auto_kv_sizing(free_device_bytes=2 * GIB, available_host_bytes=GIB,
                                     bytes_per_token=per_token, page_size=16, max_context=64)
    slots = kv_sizing.auto_kv_sizing(free_device_bytes=2 * GIB, available_host_bytes=GIB,
                                     bytes_per_token=per_token, page_size=16, max_context=64,
                                     state_bytes=64 * 1024 * 16)
    assert plain.tokens - slots.tokens == 1024 * 16 and "state slots" in slots.basis
    cpu = kv_sizing.cpu_auto_kv_tokens(4 * GIB, per_token, page_size=16, max_context=GIB,
                                       state_bytes=GIB - 16 * per_token)
    assert cpu == 16


def test_a_loaded_vision_tower_keeps_its_encode_scores_out_of_the_pool():
    """--vision: the largest tower call's f32 scores and softmax (16 heads x 8,192^2 x 4 B,
    twice) are kept free; without the tower loaded nothing is."""
    import types

    from ninfer_jax.artifact.presets import PRESETS

    vision = PRESETS["qwen3.5-27b"].vision
    with_tower = types.SimpleNamespace(vision_config=vision, params={"vision": {}})
    assert kv_sizing.vision_scratch_bytes(with_tower) == 2 * 16 * 8192 ** 2 * 4
    text_only = types.SimpleNamespace(vision_config=vision, params={})
    assert kv_sizing.vision_scratch_bytes(text_only) == 0


def test_a_restart_keeps_the_last_auto_pool_where_it_still_fits(tmp_path):
    """Run 41 (H100): the cold start measured 17144 pages, the restart 17173, a granule's
    edge apart after rounding, so every step shape compiled again. The pool of the last
    start with the same key is kept while it fits (up to 256 MiB over what is measured now,
    down to 1/32 under); further off, the new measurement wins and is remembered."""
    per_token, page = 144 * 1024, 16
    key = {"device": "NVIDIA H100 80GB HBM3", "bytes_per_token": per_token}

    def start(pages, directory=tmp_path, key=key):
        sizing = kv_sizing.KvSizing(pages * page, per_token, "measured")
        return kv_sizing.keep_last_pool(sizing, page_size=page, key=key,
                                        directory=directory).tokens // page

    assert start(16896) == 16896  # the first start remembers its pool
    assert start(17152) == 16896  # more free now: the stored shapes' pool, 256 pages unused
    assert start(16890) == 16896  # a little less free: 6 pages (13.5 MiB) over is kept
    assert start(16000) == 16000  # 896 pages (2 GiB) less: measured again ...
    assert start(16100) == 16000  # ... and remembered
    assert start(17000) == 17000  # 1000 pages more (over 1/32): the larger pool wins
    assert start(17000, key=dict(key, max_context=4096)) == 17000  # another key: its own
    assert start(16500, key=dict(key, max_context=4096)) == 16500
    assert start(16990) == 17000
    (next(tmp_path.glob("pool-*.json"))).write_text("not json")
    assert start(16990) in (16990, 17000)  # an unreadable file is measured afresh
    assert start(16000, directory=None) == 16000  # no cache directory: nothing kept
