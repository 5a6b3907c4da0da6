"""A real HTTP server on a loopback address serving a real PNG, for the image URL guard's
tests (fast tier and e2e): /pic.png the picture, /to?url=URL a 302 to URL, else 404. It
records the paths asked, so a test can tell that nothing reached it."""

from __future__ import annotations

import http.server
import io
import threading

from PIL import Image


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class ImageHost:
    """The server on `host` (`port` 0: any free one), serving `png` at /pic.png."""

    def __init__(self, host: str, port: int = 0, png: bytes | None = None) -> None:
        self.paths: list[str] = []
        self.png = png if png is not None else png_bytes(Image.new("RGB", (8, 6), (200, 30, 40)))
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.paths.append(self.path)
                if self.path.startswith("/to?url="):
                    self.send_response(302)
                    self.send_header("Location", self.path.removeprefix("/to?url="))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path == "/pic.png":
                    self.send_response(200)
                    self.send_header("Content-Type", "image/png")
                    self.send_header("Content-Length", str(len(owner.png)))
                    self.end_headers()
                    self.wfile.write(owner.png)
                else:
                    self.send_error(404)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer((host, port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
