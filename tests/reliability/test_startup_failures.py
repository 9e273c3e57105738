"""Start-up failures say what is wrong in one line: bad options, a used port, a damaged
artifact (file checksums, artifact/checksums.py), with no traceback."""
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ninfer_jax.cli.serve import serve
from ninfer_jax.serve.launcher import check_port

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "artifact"))

from tiny_artifacts import tiny_contents  # noqa: E402


@pytest.mark.parametrize("args, says", [
    (["--port", "70000"], "70000 is not in the range 1<=x<=65535"),
    (["--kv-capacity", "1"], "less than --max-context 8192"),
])
def test_bad_options_are_refused_with_a_message(args, says):
    result = CliRunner().invoke(serve, ["a.ninfer", *args])
    assert result.exit_code == 2
    assert says in result.output and "Traceback" not in result.output


def test_a_used_port_says_so():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(OSError, match=f"127.0.0.1:{port} is already in use"):
            check_port("127.0.0.1", port)
    check_port("127.0.0.1", port)  # free again


def test_a_damaged_artifact_stops_start_up_in_one_line(tmp_path):
    from ninfer_jax.artifact.format import save_artifact

    path = save_artifact(tmp_path / "tiny.ninfer", tiny_contents())
    biggest = max((f for f in (path / "weights").rglob("*") if f.is_file()),
                  key=lambda f: f.stat().st_size)
    data = bytearray(biggest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    biggest.write_bytes(bytes(data))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-m", "ninfer_jax.cli.main", "serve", str(path), "--port", str(port),
         "--max-context", "64", "--prefill-chunk", "16", "--log-stats-interval-ms", "0"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert any("checksum mismatch" in line for line in errors), result.stderr
    assert len(result.stderr.splitlines()) < 15, result.stderr
    shutil.rmtree(path)
