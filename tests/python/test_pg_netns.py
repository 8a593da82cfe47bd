"""The mooncake-cpu group over TCP between two network namespaces joined by
a veth pair: the ranks share no loopback, only the link between them.
Needs root and iproute2; skipped (with the reason) otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

if os.environ.get("MOONCAKE_TEST_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["transport", "all_reduce", "broadcast_gather", "reduce_scatter_barrier", "send_recv",
         "all_to_all", "rooted", "batch_p2p"]
TIMEOUT_S = 300


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def two_namespaces():
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (the ip command) is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"mcpg{os.getpid() % 100000}"
    ns = [f"{tag}a", f"{tag}b"]
    made = []
    try:
        for n in ns:
            r = _ip("netns", "add", n)
            if r.returncode != 0:
                pytest.skip(f"cannot create a network namespace: {r.stderr.strip()}")
            made.append(n)
        r = _ip("link", "add", f"{tag}x", "type", "veth", "peer", "name", f"{tag}y")
        if r.returncode != 0:
            pytest.skip(f"cannot create a veth pair: {r.stderr.strip()}")
        addrs = ["10.213.7.1", "10.213.7.2"]
        for n, dev, addr in zip(ns, (f"{tag}x", f"{tag}y"), addrs):
            for cmd in (["link", "set", dev, "netns", n],
                        ["-n", n, "addr", "add", f"{addr}/24", "dev", dev],
                        ["-n", n, "link", "set", dev, "up"],
                        ["-n", n, "link", "set", "lo", "up"]):
                r = _ip(*cmd)
                assert r.returncode == 0, (cmd, r.stderr)
        yield list(zip(ns, addrs))
    finally:
        for n in made:
            _ip("netns", "del", n)  # takes its end of the veth pair along


def _rank(ns: str, rank: int, host: str, port: int, addr: str) -> subprocess.Popen:
    code = ("import sys, pg_cases; "
            f"sys.exit(pg_cases.host_main({rank}, 2, {host!r}, {port}, {CASES!r}))")
    env = dict(os.environ, MOONCAKE_PG_TRANSPORT="tcp", MOONCAKE_PG_HOST=addr)
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code], cwd=HERE, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_ranks_in_two_network_namespaces(two_namespaces):
    (ns0, addr0), (ns1, addr1) = two_namespaces
    # The second namespace cannot reach the first's loopback: only the veth.
    r0 = _rank(ns0, 0, addr0, 0, addr0)
    r1 = None
    try:
        line = r0.stdout.readline()
        assert line.startswith("store-port "), (line, r0.stderr.read() if r0.poll() is not None else "")
        r1 = _rank(ns1, 1, addr0, int(line.split()[1]), addr1)
        out1, err1 = r1.communicate(timeout=TIMEOUT_S)
        out0, err0 = r0.communicate(timeout=TIMEOUT_S)
    finally:
        for p in (r0, r1):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert r1.returncode == 0, f"rank 1: {out1}\n{err1}"
    assert r0.returncode == 0, f"rank 0: {out0}\n{err0}"
