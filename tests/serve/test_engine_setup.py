"""Start-up decisions of the launcher: the engine core's environment (--device,
--tensor-parallel, --no-cuda-graph) and the options that cannot run with several HTTP workers."""
import pytest

from ninfer_jax.serve.config import ServeConfig
from ninfer_jax.serve.engine_setup import NO_COMMAND_BUFFERS_FLAG, core_environment
from ninfer_jax.serve.launcher import check_http_workers


def config(**options) -> ServeConfig:
    return ServeConfig(artifact="model.ninfer", **options)


def test_device_selects_a_cuda_device_for_the_core_only():
    assert core_environment(config(), {}) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert core_environment(config(device=3), {}) == {"CUDA_VISIBLE_DEVICES": "3"}


def test_device_indexes_the_devices_already_visible():
    base = {"CUDA_VISIBLE_DEVICES": "4, 6,7"}
    assert core_environment(config(device=1), base)["CUDA_VISIBLE_DEVICES"] == "6"
    with pytest.raises(ValueError, match="--device 3: CUDA_VISIBLE_DEVICES=4, 6,7 makes only 3"):
        core_environment(config(device=3), base)


def test_tensor_parallel_makes_its_devices_visible():
    assert core_environment(config(tensor_parallel=2), {}) == {"CUDA_VISIBLE_DEVICES": "0,1"}
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
