"""setup(..., enable_client_http_server=True, client_http_port=P) serves the
client's metrics and health over HTTP, counting a known workload."""

import urllib.error
import urllib.request

import procs
from mooncake.store import MooncakeDistributedStore


def fetch(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.status, r.read().decode()


def sample(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} in\n{text}")


def test_setup_starts_the_client_http_server(cluster):
    port = procs.free_port()
    s = MooncakeDistributedStore()
    rc = s.setup(
        "127.0.0.1", cluster.metadata, 16 << 20, 16 << 20, "tcp", "", cluster.master,
        enable_client_http_server=True, client_http_port=port,
    )
    assert rc == 0
    try:
        assert fetch(port, "/health") == (200, '{"status":"healthy","code":0}')
        for i in range(3):
            assert s.put(f"py-metrics-{i}", b"x" * 1000) == 0
        for i in range(4):
            s.get(f"py-metrics-{i}")
        status, text = fetch(port, "/metrics")
        assert status == 200
        op = 'client_mode="real",op_name="{}"'
        assert sample(text, "mooncake_transfer_write_operation_count{" + op.format("put") + "}") == 3
        assert sample(text, "mooncake_transfer_write_operation_bytes{" + op.format("put") + "}") == 3000
        assert sample(text, 'mooncake_transfer_write_bytes{client_mode="real"}') == 3000
        assert 'rpc_name="PutStart"} 3' in text
        # The fourth key does not exist: an error, not a read.
        assert 'mooncake_transfer_operation_errors_total{client_mode="real"' in text
    finally:
        s.remove_all(force=True)
        s.close()
    # The server goes with the client.
    try:
        fetch(port, "/health")
        raise AssertionError("still serving after close")
    except urllib.error.URLError:
        pass


def test_without_the_flag_no_server_and_a_taken_port_fails(cluster):
    port = procs.free_port()
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", cluster.metadata, 16 << 20, 16 << 20, "tcp", "", cluster.master,
                   client_http_port=port) == 0
    try:
        try:
            fetch(port, "/health")
            raise AssertionError("serving without enable_client_http_server")
        except urllib.error.URLError:
            pass
    finally:
        s.close()
    holder = MooncakeDistributedStore()
    assert holder.setup("127.0.0.1", cluster.metadata, 16 << 20, 16 << 20, "tcp", "", cluster.master,
                        enable_client_http_server=True, client_http_port=port) == 0
    try:
        second = MooncakeDistributedStore()
        rc = second.setup("127.0.0.1", cluster.metadata, 16 << 20, 16 << 20, "tcp", "", cluster.master,
                          enable_client_http_server=True, client_http_port=port)
        assert rc != 0, "a taken port is refused"
    finally:
        holder.close()
