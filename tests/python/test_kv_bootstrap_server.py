"""``mooncake.http_metadata_server.KVBootstrapServer``: the metadata server as
a Python class (aiohttp), run in a process of its own and used by a real
master and store."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest

import procs
from conftest import Cluster

pytest.importorskip("aiohttp")


@pytest.fixture(scope="module")
def server():
    """A KVBootstrapServer process; yields its base URL."""
    p = procs.python("kv_bootstrap_peer.py")
    try:
        m = p.wait_for_line(r"listening (\d+) (\w+)")
        assert m.group(2) == "Success"
        yield p, f"http://{procs.LOOPBACK}:{m.group(1)}"
    finally:
        p.p.stdin.close()
        assert p.p.wait(15) == 0, p.output()


def call(url: str, method: str = "GET", body: bytes | None = None):
    """(status, content type, body) of one request."""
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers.get_content_type(), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get_content_type(), e.read()


def test_missing_empty_and_blank_keys_are_refused(server):
    _, base = server
    for method in ("GET", "PUT", "DELETE"):
        body = b"v" if method == "PUT" else None
        for query in ("", "?key=", "?key=%20%20%20"):
            status, ctype, text = call(f"{base}/metadata{query}", method, body)
            assert (status, ctype, text) == (400, "application/json", b"metadata key is required")
    # Nothing was stored under a blank key.
    assert call(f"{base}/metadata?key=%20", "GET")[0] == 400


def test_round_trip_strips_keys(server):
    _, base = server
    assert call(f"{base}/metadata?key=%20%20kb-valid%20%20", "PUT", b"value")[:2] == (200, "application/json")
    assert call(f"{base}/metadata?key=kb-valid") == (200, "application/json", b"value")
    assert call(f"{base}/metadata?key=%20kb-valid") == (200, "application/json", b"value")
    assert call(f"{base}/metadata?key=kb-valid", "PUT", b"other")[0] == 200
    assert call(f"{base}/metadata?key=kb-valid")[2] == b"other"
    assert call(f"{base}/metadata?key=kb-valid", "DELETE") == (200, "application/json", b"metadata deleted")
    assert call(f"{base}/metadata?key=kb-valid") == (404, "application/json", b"metadata not found")
    assert call(f"{base}/metadata?key=kb-valid", "DELETE")[0] == 404


def test_rpc_meta_keys_are_set_once(server):
    _, base = server
    url = f"{base}/metadata?key=mooncake/rpc_meta/kb-seg"
    assert call(url, "PUT", b"one")[0] == 200
    assert call(url, "PUT", b"one") == (200, "application/json", b"metadata unchanged")
    assert call(url, "PUT", b"two") == (400, "application/json", b"Duplicate rpc_meta key not allowed")
    assert call(url)[2] == b"one"
    assert call(url, "DELETE")[0] == 200
    assert call(url, "PUT", b"two")[0] == 200
    assert call(url)[2] == b"two"


def test_other_methods_and_paths(server):
    _, base = server
    assert call(f"{base}/metadata?key=a", "POST", b"x")[0] == 405
    assert call(f"{base}/health") == (200, "application/json", b"OK")
    assert call(f"{base}/other")[0] == 404


def test_store_runs_against_it(server):
    """A master and a store whose transfer metadata lives in the server."""
    _, base = server
    from mooncake.store import MooncakeDistributedStore

    cluster = Cluster()
    try:
        s = MooncakeDistributedStore()
        rc = s.setup("127.0.0.1", f"{base}/metadata", 16 << 20, 16 << 20, "tcp", "", cluster.master)
        assert rc == 0
        try:
            assert s.put("kb-key", b"through the python metadata server") == 0
            assert s.get("kb-key") == b"through the python metadata server"
            # The store published its segment through the server.
            status, _, body = call(f"{base}/metadata?key=mooncake/rpc_meta/{s.get_hostname()}")
            assert status == 200 and body
        finally:
            s.remove_all(force=True)
            s.close()
    finally:
        assert cluster.stop() == 0, cluster.proc.output()


def test_in_process_lifecycle():
    from mooncake.http_metadata_server import KVBootstrapServer, KVPoll

    s = KVBootstrapServer(port=0, host=procs.LOOPBACK)
    assert s.poll() is KVPoll.Failed
    s.run()
    try:
        assert s.poll() is KVPoll.Success
        base = f"http://{procs.LOOPBACK}:{s.bound_port}"
        assert call(f"{base}/metadata?key=in-proc", "PUT", b"v")[0] == 200
        assert s.store == {"in-proc": b"v"}
    finally:
        s.close()
    assert s.poll() is KVPoll.Failed


def test_port_in_use_is_an_error():
    from mooncake.http_metadata_server import KVBootstrapServer

    first = KVBootstrapServer(port=0, host=procs.LOOPBACK)
    first.run()
    try:
        second = KVBootstrapServer(port=first.bound_port, host=procs.LOOPBACK)
        with pytest.raises(RuntimeError, match="could not listen"):
            second.run()
    finally:
        first.close()


def test_handler_answers_without_serving():
    """The request handler can be driven directly (no socket), as the
    reference's own tests of this class do."""
    from mooncake.http_metadata_server import KVBootstrapServer

    class Request:
        def __init__(self, method, key=None, body=b""):
            self.method = method
            self.query = {} if key is None else {"key": key}
            self._body = body

        async def read(self):
            return self._body

    async def scenario():
        s = KVBootstrapServer(port=0)
        r = await s._handle_metadata(Request("PUT", "  k  ", b"v"))
        assert (r.status, r.content_type) == (200, "application/json")
        r = await s._handle_metadata(Request("GET", "k"))
        assert (r.status, r.body) == (200, b"v")
        r = await s._handle_metadata(Request("DELETE"))
        assert r.status == 400
        assert s.store == {"k": b"v"}

    asyncio.run(scenario())
