"""benchmarks/engine_round_bench.py drives `ninfer serve`'s own engine round by round."""
import engine_round_bench


def test_a_level_decodes_every_stream_and_reports_the_host_phases(default_artifact_path):
    engine = engine_round_bench.warm_engine(str(default_artifact_path), [
        "--max-concurrency", "3", "--max-context", "256", "--prefill-chunk", "64",
        "--step-shapes", "essential"])
    result = engine_round_bench.level(engine, 3, prompt=20, rounds=4, profile=False, seed=0)
    assert result["rows"] == 3 and result["rounds"] == 4
    assert result["decode_tokens"] == 3 * 4  # every timed round decoded all three streams
    phases = result["host_ms_per_round"]
    assert set(phases) == {"program_submit", "program_post", "engine_commit_output",
                           "device_wait"} and all(v >= 0 for v in phases.values())
    assert not engine.scheduler.has_work()  # the level's streams were cancelled and gone
