"""Runs a ``mooncake.http_metadata_server.KVBootstrapServer`` in its own
process: prints ``listening <port>`` once it serves, then serves until its
standard input closes, closes the server and prints ``closed <poll>``."""

from __future__ import annotations

import sys

from mooncake.http_metadata_server import KVBootstrapServer

server = KVBootstrapServer(port=0, host="127.0.0.1")
server.run()
print(f"listening {server.bound_port} {server.poll().name}", flush=True)
sys.stdin.read()
server.close()
print(f"closed {server.poll().name}", flush=True)
