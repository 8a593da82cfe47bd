"""A metadata server written in Python (the HTTP protocol of
`mooncake_http_metadata_server`), run in a thread of the test process.

Because it needs the GIL to answer, a blocking engine or store call that
consults it can only finish if that call released the GIL."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class _Handler(BaseHTTPRequestHandler):
    def _key(self):
        q = parse_qs(urlparse(self.path).query)
        return q.get("key", [None])[0]

    def _reply(self, code: int, body: bytes = b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        v = self.server.kv.get(self._key())
        self.server.gets += 1
        if v is None:
            self._reply(404, b"metadata not found")
        else:
            self._reply(200, v)

    def do_PUT(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.server.kv[self._key()] = self.rfile.read(n)
        self._reply(200, b"metadata updated")

    def do_DELETE(self):
        self.server.kv.pop(self._key(), None)
        self._reply(200, b"metadata deleted")

    def log_message(self, *args):
        pass


class PyMetadataServer:
    def __init__(self):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.kv = {}
        self.httpd.gets = 0
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/metadata"

    @property
    def gets(self) -> int:
        return self.httpd.gets

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
