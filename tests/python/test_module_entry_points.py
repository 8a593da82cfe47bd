"""Programs started as modules, the way the reference's and SGLang's
deployment guides start them (``python -m mooncake.http_metadata_server``)."""

from __future__ import annotations

import sys
import urllib.request

import procs


def test_python_m_http_metadata_server():
    p = procs.Proc([sys.executable, "-m", "mooncake.http_metadata_server", "--port", "0",
                    "--host", procs.LOOPBACK, "--log-level", "INFO"])
    try:
        port = p.wait_for_line(r"listening on [\d.]+:(\d+)").group(1)
        url = f"http://{procs.LOOPBACK}:{port}/metadata?key=mod-k"
        put = urllib.request.Request(url, data=b"value", method="PUT")
        with urllib.request.urlopen(put, timeout=5) as r:
            assert r.status == 200
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.read() == b"value"
    finally:
        assert p.stop() == 0, p.output()


def test_python_m_http_metadata_server_rejects_bad_flags():
    p = procs.Proc([sys.executable, "-m", "mooncake.http_metadata_server", "--no-such-flag"])
    p.p.wait(30)
    assert p.p.returncode == 2, p.output()
