"""Shared fixtures: real processes of the installed package on loopback."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import procs  # noqa: E402


@pytest.fixture(scope="session")
def metadata_server():
    """A `mooncake_http_metadata_server`; yields its metadata URL."""
    p = procs.start("mooncake_http_metadata_server", "--port=0", f"--host={procs.LOOPBACK}")
    try:
        m = p.wait_for_line(r"listening on ([\d.]+):(\d+)")
        yield f"http://{procs.LOOPBACK}:{m.group(2)}/metadata"
    finally:
        assert p.stop() == 0, p.output()
