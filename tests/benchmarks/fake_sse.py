"""A stand-in for `ninfer serve`'s streaming completions and chat completions (a chat
prompt's length is its word count): one chunk per token at a fixed interval, then the usage
chunk, so the benchmark's figures can be checked against known
timings. A prompt longer than `long_prompt` waits `long_delay` s before its first token."""
from __future__ import annotations

import http.server
import json
import threading
import time


class FakeCompletions(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, interval: float = 0.02, long_prompt: int = 100, long_delay: float = 0.3):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.interval, self.long_prompt, self.long_delay = interval, long_prompt, long_delay
        self.bodies: list[dict] = []
        self.disconnects = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._json(200, {"object": "list", "data": [{"id": "fake-model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        is_chat = self.path == "/v1/chat/completions"
        prompt = body["messages"][0]["content"].split() if is_chat else body.get("prompt")
        if not isinstance(prompt, list) or "ignore_eos" not in body:
            self._json(400, {"error": {"message": "token ids and ignore_eos expected"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        if len(prompt) > self.server.long_prompt:
            time.sleep(self.server.long_delay)
        try:
            sent = []
            for _ in range(body["max_tokens"]):
                sent.append(time.perf_counter())
                choice = {"index": 0, "delta": {"content": "x"}} if is_chat else {
                    "index": 0, "text": "x", "finish_reason": None}
                self._event({"choices": [choice]})
                time.sleep(self.server.interval)
            rate = (len(sent) - 1) / (sent[-1] - sent[0]) if len(sent) > 1 else 0.0
            self._event({"choices": [], "usage": {"prompt_tokens": len(prompt),
                                                  "completion_tokens": body["max_tokens"]},
                         "timings": {"prompt_ms": 1.5, "predicted_per_second": rate}})
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            self.server.disconnects += 1

    def _event(self, obj: dict) -> None:
        self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
        self.wfile.flush()

    def _json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
