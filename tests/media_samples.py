"""Media samples shared by the media tests (tests/serve, tests/e2e): a PNG and an MP4 made
here, their data URIs, and `media_url`, a local HTTP server of the PNG (/image.png, and
/slow.png after a second; anything else 404)."""
import base64
import http.server
import io
import threading
import time

import numpy as np
import pytest
from PIL import Image


def png(height=40, width=60, seed=0, solid=False) -> bytes:
    shape = (height, width, 3)
    pixels = (np.full(shape, 90, np.uint8) if solid else
              np.random.default_rng(seed).integers(0, 256, shape, np.uint8))
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def mp4(num_frames=10, rate=4) -> bytes:
    import av

    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for n in range(num_frames):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), n * 20, np.uint8),
                                               format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


PNG = png()
PNG_B64 = base64.b64encode(PNG).decode()
PNG_URI = f"data:image/png;base64,{PNG_B64}"
VIDEO_URI = f"data:video/mp4;base64,{base64.b64encode(mp4()).decode()}"


class _Media(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slow.png":
            time.sleep(1.0)
        if self.path not in ("/image.png", "/slow.png"):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        try:
            self.wfile.write(PNG)
        except OSError:
            pass

    def log_message(self, *args):
        pass


def _serve(server):
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def media_url():
    server = _serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Media))
    server.daemon_threads = True
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
