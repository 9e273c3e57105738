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


def serve_in_thread(server):
    """Run a socketserver's serve_forever in a daemon thread; returns the server."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def file_server(files: dict, slow: tuple = ("/slow.png",)):
    """A local HTTP server of `files` (path -> bytes), started: a path in `slow` answers
    after a second, any other unlisted path 404. Stop it with shutdown()."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path in slow:
                time.sleep(1.0)
            body = files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return serve_in_thread(server)


@pytest.fixture(scope="module")
def media_url():
    server = file_server({"/image.png": PNG, "/slow.png": PNG})
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
