"""Start-up decisions of the launcher: the engine core's environment (--device,
--tensor-parallel, --no-cuda-graph) and the options that cannot run with several HTTP workers."""
import pytest

from ninfer_jax.serve.config import ServeConfig
from ninfer_jax.serve.engine_setup import NO_COMMAND_BUFFERS_FLAG, core_environment
from ninfer_jax.serve.launcher import check_http_workers, describe_core


def config(**options) -> ServeConfig:
    return ServeConfig(artifact="model.ninfer", **options)


def test_device_selects_a_cuda_device_for_the_core_only():
    assert core_environment(config(), {})["CUDA_VISIBLE_DEVICES"] == "0"
    assert core_environment(config(device=3), {})["CUDA_VISIBLE_DEVICES"] == "3"


def test_device_indexes_the_devices_already_visible():
    base = {"CUDA_VISIBLE_DEVICES": "4, 6,7"}
    assert core_environment(config(device=1), base)["CUDA_VISIBLE_DEVICES"] == "6"
    with pytest.raises(ValueError, match="--device 3: CUDA_VISIBLE_DEVICES=4, 6,7 makes only 3"):
        core_environment(config(device=3), base)


def test_tensor_parallel_makes_its_devices_visible():
    assert core_environment(config(tensor_parallel=2), {})["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert core_environment(config(device=1, tensor_parallel=2),
                            {"CUDA_VISIBLE_DEVICES": "4,6,7"})["CUDA_VISIBLE_DEVICES"] == "6,7"
    with pytest.raises(ValueError, match="--device 2 --tensor-parallel 2: CUDA_VISIBLE_DEVICES"):
        core_environment(config(device=2, tensor_parallel=2), {"CUDA_VISIBLE_DEVICES": "4,6,7"})
    # auto: every device the launcher sees
    assert "CUDA_VISIBLE_DEVICES" not in core_environment(config(tensor_parallel="auto"),
                                                          {"CUDA_VISIBLE_DEVICES": "4,6"})


def test_no_cuda_graph_appends_to_existing_xla_flags():
    assert "XLA_FLAGS" not in core_environment(config(), {"XLA_FLAGS": "--a=1"})
    env = core_environment(config(no_cuda_graph=True), {"XLA_FLAGS": "--a=1 "})
    assert env["XLA_FLAGS"] == f"--a=1 {NO_COMMAND_BUFFERS_FLAG}"
    env = core_environment(config(no_cuda_graph=True), {})
    assert env["XLA_FLAGS"] == "--xla_gpu_enable_command_buffer="


def test_gpu_memory_utilization_is_the_cores_allocator_limit():
    """XLA's GPU allocator stops at 75% of the card unless told; the core gets 90% (vLLM's
    default utilisation) or what --gpu-memory-utilization says, over any inherited value."""
    assert core_environment(config(), {})["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9"
    env = core_environment(config(gpu_memory_utilization=0.5),
                           {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3"})
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"


def test_the_start_up_line_says_what_the_core_gets():
    auto = config(tensor_parallel="auto")  # the variable left unset: no KeyError (it was)
    assert describe_core(auto, core_environment(auto, {}), {}) == (
        "engine core: --device 0 (CUDA_VISIBLE_DEVICES=unset: every device), CUDA graphs on, "
        "up to 90% of each GPU's memory; 1 HTTP worker(s)")
    tuned = config(device=1, no_cuda_graph=True, gpu_memory_utilization=0.5)
    line = describe_core(tuned, core_environment(tuned, {"CUDA_VISIBLE_DEVICES": "4,6"}), {})
    assert line == ("engine core: --device 1 (CUDA_VISIBLE_DEVICES=6), CUDA graphs off "
                    f"(XLA_FLAGS={NO_COMMAND_BUFFERS_FLAG}), up to 50% of each GPU's memory; "
                    "1 HTTP worker(s)")


def test_one_http_worker_accepts_every_option():
    check_http_workers(config(request_log_jsonl="log.jsonl", capture_requests="c.jsonl"))


def test_several_workers_refuse_the_per_worker_responses_store():
    with pytest.raises(ValueError, match="--response-store-max-records 0"):
        check_http_workers(config(http_workers=2))
    check_http_workers(config(http_workers=2, response_store_max_records=0))
    check_http_workers(config(http_workers=2, response_store_max_mib=0))


@pytest.mark.parametrize("option", ["request_log_jsonl", "capture_requests"])
def test_several_workers_refuse_the_jsonl_files(option):
    with pytest.raises(ValueError, match=option.replace("_", "-")):
        check_http_workers(config(http_workers=2, response_store_max_records=0,
                                  **{option: "out.jsonl"}))


def test_http_threads_default_to_one_per_lane_and_pending_request():
    from ninfer_jax.serve.config import ServeConfig, http_threads_per_worker

    assert http_threads_per_worker(ServeConfig(artifact="a")) == 1 + 16 + 16
    assert http_threads_per_worker(ServeConfig(artifact="a", max_pending_requests=0)) == 32
    many = ServeConfig(artifact="a", max_concurrency=256, max_pending_requests=16)
    assert http_threads_per_worker(many) == 256 + 16 + 16
    shared = ServeConfig(artifact="a", max_concurrency=256, http_workers=4,
                         response_store_max_records=0)
    assert http_threads_per_worker(shared) == 72
    assert http_threads_per_worker(ServeConfig(artifact="a", http_threads=5)) == 5


def test_device_state_slots_apply_to_hybrid_models_only():
    from click.testing import CliRunner

    from ninfer_jax.cli.serve import serve
    from ninfer_jax.engine.config import EngineConfig
    from ninfer_jax.model.config import ModelConfig
    from ninfer_jax.serve.engine_setup import log_state_slots

    assert "--device-state-slots" in CliRunner().invoke(serve, ["--help"]).output
    dense = ModelConfig(architecture="llama", vocab_size=8, hidden_size=8, intermediate_size=8,
                        num_layers=2, num_heads=1, num_kv_heads=1, head_dim=8)
    hybrid = ModelConfig(architecture="qwen3_5", vocab_size=8, hidden_size=8,
                         intermediate_size=8, num_layers=2, num_heads=1, num_kv_heads=1,
                         head_dim=8, layer_types=("linear_attention", "full_attention"))
    options = config(max_concurrency=2, device_state_slots=3)
    engine = EngineConfig.from_serve_config(options)
    assert engine.device_state_slots == 3
    assert engine.state_slot_capacity(hybrid.is_hybrid) == 5
    assert engine.state_slot_capacity(dense.is_hybrid) == 0
    assert "no effect" in log_state_slots(options, dense)  # accepted, nothing to size
    assert "2 lanes + 3 spare" in log_state_slots(options, hybrid)
    assert log_state_slots(config(), dense) is None


def test_device_state_slots_default_to_one_spare_per_lane():
    """The spec's default: --device-state-slots unset means --max-concurrency spare slots."""
    from ninfer_jax.engine.config import EngineConfig

    unset = EngineConfig.from_serve_config(config(max_concurrency=3))
    assert unset.device_state_slots == 3 and unset.state_slot_capacity(True) == 6
    assert EngineConfig.from_serve_config(
        config(max_concurrency=3, device_state_slots=0)).state_slot_capacity(True) == 3


def test_speculation_on_a_hybrid_is_refused_under_tensor_parallelism_and_with_vision():
    from ninfer_jax.model.config import ModelConfig
    from ninfer_jax.serve.engine_setup import check_speculation

    hybrid = ModelConfig(architecture="qwen3_5", vocab_size=8, hidden_size=8,
                         intermediate_size=8, num_layers=2, num_heads=1, num_kv_heads=1,
                         head_dim=8, layer_types=("linear_attention", "full_attention"))
    assert check_speculation(config(spec="ngram"), hybrid).backend == "ngram"
    with pytest.raises(ValueError, match="--tensor-parallel"):
        check_speculation(config(spec="ngram", tensor_parallel=2), hybrid)
    with pytest.raises(ValueError, match="MTP head"):
        check_speculation(config(spec="mtp"), hybrid)  # mtp_num_layers 0: no head
    with pytest.raises(ValueError, match="--vision"):
        check_speculation(config(spec="ngram", vision=True), hybrid)


def test_dflash_on_a_dense_model_gets_draft_store_slots_and_refuses_tp_and_vision():
    from ninfer_jax.engine.config import EngineConfig
    from ninfer_jax.model.config import ModelConfig
    from ninfer_jax.serve.engine_setup import check_speculation, runner_state_slots

    dense = ModelConfig(architecture="qwen3", vocab_size=8, hidden_size=8, intermediate_size=8,
                        num_layers=2, num_heads=1, num_kv_heads=1, head_dim=8)
    engine = EngineConfig.from_serve_config(config(max_concurrency=3))
    for backend in ("dflash", "dflash2"):
        speculative = check_speculation(config(spec=backend), dense, {backend: True})
        assert runner_state_slots(engine, dense, speculative) == 3  # one per lane, no spare
        for flags in ({"tensor_parallel": 2}, {"vision": True}):
            with pytest.raises(ValueError, match=f"--spec {backend} is not built for"):
                check_speculation(config(spec=backend, **flags), dense, {backend: True})
    ngram = check_speculation(config(spec="ngram"), dense)
    assert runner_state_slots(engine, dense, ngram) == 0
    assert runner_state_slots(engine, dense, None) == 0


def test_weights_is_refused_where_it_cannot_quantize():
    from ninfer_jax.model.config import ModelConfig
    from ninfer_jax.serve.engine_setup import check_weights

    dense = ModelConfig(architecture="llama", vocab_size=8, hidden_size=64,
                        intermediate_size=96, num_layers=1, num_heads=2, num_kv_heads=1,
                        head_dim=32)
    floats = {"embed": "f32", "layers": "f32", "norms": "f32"}
    check_weights(config(), {"layers": "q4_1"}, dense)  # no --weights: nothing to check
    for fmt in ("q8_0", "q4_1", "int8", "nvfp4"):
        check_weights(config(weights=fmt), floats, dense)
    with pytest.raises(ValueError, match="already q4_1"):
        check_weights(config(weights="q8_0"), {"layers": "q4_1"}, dense)
    with pytest.raises(ValueError, match="--tensor-parallel"):
        check_weights(config(weights="int8", tensor_parallel=2), floats, dense)
    odd = ModelConfig(architecture="llama", vocab_size=8, hidden_size=48, intermediate_size=96,
                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=24)
    with pytest.raises(ValueError, match="hidden_size 48, num_heads x head_dim 48"):
        check_weights(config(weights="q4_0"), floats, odd)
    check_weights(config(weights="int8"), floats, odd)  # per-channel: any K


def test_weights_q8_0_serves_what_the_converted_artifact_serves(tmp_path):
    # build_engine as `ninfer serve ART --weights q8_0` runs it in the core: the float
    # projections arrive quantized (interleaved for the kernel where this CPU has its path)
    # and decode the tokens that `ninfer convert --weights q8_0`'s artifact decodes
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "artifact"))
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "model"))
    from runner_driver import generate
    from tiny_artifacts import tiny_config, tiny_contents

    from ninfer_jax.artifact import convert_common
    from ninfer_jax.artifact.format import load_artifact, save_artifact
    from ninfer_jax.engine.runner import JaxRunner
    from ninfer_jax.kernels.quant_matmul import formats
    from ninfer_jax.serve.engine_setup import build_engine

    contents = tiny_contents(tiny_config(num_layers=2, hidden_size=32, intermediate_size=64,
                                         head_dim=8))
    path = save_artifact(tmp_path / "tiny.ninfer", contents)
    engine = build_engine(ServeConfig(artifact=str(path), weights="q8_0", max_context=64,
                                      max_concurrency=1))
    runner = engine.runner
    layer = runner.params["layers"][0]
    kinds = {formats.format_of(layer[key]) for key in ("wqkv", "wo", "w_gate_up", "w_down")}
    assert kinds and kinds <= {"q8_0", "q8_0x16"}, kinds
    assert not isinstance(runner.params["embed"], dict)  # the table stays float
    converted = save_artifact(tmp_path / "q8.ninfer",
                              convert_common.apply_quantization(contents, "q8_0"))
    reference = JaxRunner(load_artifact(converted), num_pages=runner.num_pages,
                          page_size=runner.page_size, max_batch=1,
                          max_context=runner.max_context,
                          prefill_chunk=runner.chunk_buckets[-1])
    prompt = [[5, 17, 99, 3, 42, 7]]
    assert generate(runner, prompt, 8) == generate(reference, prompt, 8)


def test_block_weights_are_stored_ones_or_quantized_at_load():
    from ninfer_jax.serve.engine_setup import uses_block_weights

    assert uses_block_weights(config(), {"layers": "q4_1"})
    assert uses_block_weights(config(weights="q8_0"), {"layers": "bf16"})
    assert not uses_block_weights(config(), {"layers": "f32"})
    assert not uses_block_weights(config(weights="int8"), {"layers": "bf16"})
