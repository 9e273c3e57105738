"""The executable store's key: whatever changes the traced step changes the file it loads."""
from ninfer_jax.engine.executable_store import TRACE_ENV, ExecutableStore


def _path(tmp_path, shape=(0, 8)):
    return ExecutableStore(tmp_path, {"config": "tiny"})._path(shape)


def test_trace_time_switches_change_the_key(tmp_path, monkeypatch):
    for name in TRACE_ENV:
        monkeypatch.delenv(name, raising=False)
    plain = _path(tmp_path)
    assert _path(tmp_path) == plain
    assert _path(tmp_path, (0, 16)) != plain
    seen = {plain}
    for name, value in (("NINFER_GDN_PREFILL", "wy"), ("NINFER_GDN_PREFILL", "kernel"),
                        ("NINFER_GDN_ROWS_KERNEL", "1")):
        monkeypatch.setenv(name, value)
        path = _path(tmp_path)
        assert path not in seen, f"{name}={value} would load another trace's executable"
        seen.add(path)


def test_unrelated_environment_keeps_the_key(tmp_path, monkeypatch):
    plain = _path(tmp_path)
    monkeypatch.setenv("NINFER_API_KEY", "secret")
    assert _path(tmp_path) == plain
