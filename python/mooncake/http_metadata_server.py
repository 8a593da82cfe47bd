"""``python -m mooncake.http_metadata_server [--port 8080] [--host 0.0.0.0]
[--log-level INFO]``: the HTTP metadata server, started the way the
reference's documentation and SGLang's deployment guide start it.

It is the same server as the ``mooncake_http_metadata_server`` program (the
Rust one, run inside this interpreter), with the same options. The
reference's module also exposes its Python server class; this one is only an
entry point.
"""

from __future__ import annotations

import sys

from .cli import run


def main(argv: list[str] | None = None) -> int:
    """Runs the server with ``argv`` (default: this process's arguments) until
    SIGINT or SIGTERM; returns its exit code."""
    return run("mooncake_http_metadata_server", argv)


if __name__ == "__main__":
    sys.exit(main())
