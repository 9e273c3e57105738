"""SIGHUP (serve/wire/http_worker.py): ignored by the master and the workers, so a hang-up or a
stray `kill -HUP` cuts no stream and the server keeps answering."""
import signal
import time

import httpx

from tests.reliability.test_shutdown import start_streams


def test_sighup_does_not_cut_streams(fake_server):
    server = fake_server(decode_sleep=0.02, shutdown_timeout_s=0.5, scripts={"ramble": "la"})
    results, threads = start_streams(server, "ramble", 2, max_tokens=150)  # ~3 s, past the drain
    server.process.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    for thread in threads:
        thread.join(30)
    assert len(results) == 2
    for status, _, lines in results:
        assert status == 200 and lines[-1] == "[DONE]"
        assert '"error"' not in lines[-2]
    assert server.process.poll() is None
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert server.stop() == 0
    assert "SIGHUP ignored" in server.stderr_text()
