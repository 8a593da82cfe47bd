"""The HTTP metadata server, as a program and as a Python class.

``python -m mooncake.http_metadata_server [--port 8080] [--host 0.0.0.0]
[--log-level INFO]`` runs the server the way the reference's documentation and
SGLang's deployment guide start it. It is the same server as the
``mooncake_http_metadata_server`` program (the Rust one, run inside this
interpreter), with the same options.

:class:`KVBootstrapServer` is the in-process form that Python callers embed:
an aiohttp application over a ``dict`` (``server.store``), served from a
background thread by :meth:`KVBootstrapServer.run`. It speaks the protocol of
the program: ``GET``/``PUT``/``DELETE /metadata?key=<key>`` with the value as
the body, keys stripped of surrounding whitespace, a blank key refused with
400, and a second ``PUT`` of a ``rpc_meta`` key refused with 400 unless it
carries the value already stored (an engine publishing the same segment
twice). Every answer is ``Content-Type: application/json`` with a plain-text
body, as the reference's server answers. aiohttp is imported when a server is
made, so the module (and the program above) works without it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from enum import Enum
from typing import Any, Dict, Optional

from .cli import run

__all__ = ["KVBootstrapServer", "KVPoll", "main"]

_JSON = "application/json"


def _web():
    """aiohttp's ``web`` module, or an ImportError that says what needs it."""
    try:
        from aiohttp import web
    except ImportError as e:  # pragma: no cover - aiohttp is a dependency
        raise ImportError(
            "mooncake.http_metadata_server.KVBootstrapServer needs aiohttp "
            "(pip install aiohttp); the mooncake_http_metadata_server program "
            "does not"
        ) from e
    return web


class KVPoll(Enum):
    """What :meth:`KVBootstrapServer.poll` reports."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class KVBootstrapServer:
    """An HTTP metadata server held by this process.

    ``KVBootstrapServer(port, host="0.0.0.0")`` builds the application;
    :meth:`run` serves it from a daemon thread, :meth:`close` stops it and
    :meth:`poll` tells whether that thread is serving. ``store`` maps each key
    to the bytes last ``PUT`` under it. ``port=0`` lets the system choose a
    port (:attr:`bound_port` holds it once the server listens).
    """

    def __init__(self, port: int, host: str = "0.0.0.0"):
        web = _web()
        self.port = port
        self.host = host
        self.bound_port: Optional[int] = None
        self.store: Dict[str, bytes] = {}
        self.lock = asyncio.Lock()
        self.app = web.Application()
        self.app.router.add_route("*", "/metadata", self._handle_metadata)
        self.app.router.add_route("GET", "/health", self._handle_health)
        self.thread: Optional[threading.Thread] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._runner: Any = None
        self._started = threading.Event()
        self._error: Optional[BaseException] = None

    # -- request handling ---------------------------------------------------

    @staticmethod
    def _reply(status: int, text: Optional[str] = None, body: Optional[bytes] = None):
        web = _web()
        if body is not None:
            return web.Response(body=body, status=status, content_type=_JSON)
        return web.Response(text=text or "", status=status, content_type=_JSON)

    async def _handle_metadata(self, request):
        """Answers one ``/metadata`` request (``GET``, ``PUT`` or ``DELETE``)."""
        key = str(request.query.get("key", "")).strip()
        if not key:
            return self._reply(400, "metadata key is required")
        if request.method == "GET":
            async with self.lock:
                value = self.store.get(key)
            if value is None:
                return self._reply(404, "metadata not found")
            return self._reply(200, body=value)
        if request.method == "PUT":
            value = bytes(await request.read())
            async with self.lock:
                old = self.store.get(key)
                if old is not None and "rpc_meta" in key:
                    if old == value:
                        return self._reply(200, "metadata unchanged")
                    return self._reply(400, "Duplicate rpc_meta key not allowed")
                self.store[key] = value
            return self._reply(200, "metadata updated")
        if request.method == "DELETE":
            async with self.lock:
                if self.store.pop(key, None) is None:
                    return self._reply(404, "metadata not found")
            return self._reply(200, "metadata deleted")
        return self._reply(405, "Method not allowed")

    async def _handle_health(self, request):
        return self._reply(200, "OK")

    # -- serving ------------------------------------------------------------

    def run(self, timeout: float = 10.0) -> threading.Thread:
        """Starts serving from a daemon thread and returns it once the server
        listens; raises the error that stopped it from listening, if any."""
        if self.thread is not None and self.thread.is_alive():
            return self.thread
        self._started.clear()
        self._error = None
        self.thread = threading.Thread(
            target=self._serve, name="mooncake-metadata-server", daemon=True
        )
        self.thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"metadata server did not start within {timeout} s")
        if self._error is not None:
            raise RuntimeError(
                f"metadata server could not listen on {self.host}:{self.port}: {self._error}"
            ) from self._error
        logging.info("HTTP metadata server listening on %s:%s", self.host, self.bound_port)
        return self.thread

    def _serve(self) -> None:
        web = _web()
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            # The lock made in __init__ may belong to no loop or another one
            # (Python < 3.10 binds it at creation): use one of this loop.
            self.lock = asyncio.Lock()
            self._runner = web.AppRunner(self.app)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, host=self.host, port=self.port)
            loop.run_until_complete(site.start())
            addresses = self._runner.addresses
            self.bound_port = addresses[0][1] if addresses else self.port
        except BaseException as e:  # reported by run()
            self._error = e
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stops serving and waits up to ``timeout`` seconds for the thread."""
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self.thread is not None and self.thread.is_alive():
            self.thread.join(timeout)

    def poll(self) -> KVPoll:
        """``KVPoll.Success`` while the serving thread runs, else ``Failed``."""
        if self.thread is None or not self.thread.is_alive():
            return KVPoll.Failed
        return KVPoll.Success


def main(argv: list[str] | None = None) -> int:
    """Runs the server with ``argv`` (default: this process's arguments) until
    SIGINT or SIGTERM; returns its exit code."""
    return run("mooncake_http_metadata_server", argv)


if __name__ == "__main__":
    sys.exit(main())
