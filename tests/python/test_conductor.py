"""The Conductor KV indexer (`mooncake_conductor`) fed by publishers that
encode exactly as vLLM and SGLang do (pyzmq PUB sockets, their msgspec
structs), queried through `mooncake.conductor`, and the master's own events
end to end."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, List, Optional, Union

import msgspec
import pytest
import zmq

import procs
from conftest import Cluster, new_store
from mooncake.conductor import ConductorClient, ConductorError, seq_hashes

# vLLM (`vllm/distributed/kv_events.py`): maps, events tagged by `type`,
# hashes as SHA-256 bytes by default.


class VllmBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: List[Any]
    data_parallel_rank: Optional[int] = None


class VllmEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class VllmStored(VllmEvent, tag="BlockStored"):
    block_hashes: List[Union[bytes, int]]
    parent_block_hash: Union[bytes, int, None]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[List[Optional[tuple]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class VllmRemoved(VllmEvent, tag="BlockRemoved"):
    block_hashes: List[Union[bytes, int]]
    medium: Optional[str]
    group_idx: Optional[int] = None


# SGLang (`disaggregation/kv_events.py`): array-like structs, signed hashes,
# the request's cache_salt in `metadata`.


class SglBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: List[Any]
    attn_dp_rank: Optional[int] = None


class SglEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class SglStored(SglEvent, tag="BlockStored"):
    block_hashes: List[int]
    parent_block_hash: Optional[int]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None


class BlockStoredMetadata(msgspec.Struct, omit_defaults=True, gc=False):
    cache_salt: str


class SglStoredWithMetadata(SglStored, tag="BlockStored", kw_only=True):
    metadata: BlockStoredMetadata


class SglRemoved(SglEvent, tag="BlockRemoved"):
    block_hashes: List[int]
    medium: Optional[str] = None


class Publisher:
    """A PUB socket sending `[topic, seq (8 bytes big-endian), payload]`, seq
    from 0, as both engines' ZmqEventPublisher."""

    def __init__(self, ctx):
        self.sock = ctx.socket(zmq.PUB)
        self.sock.bind(f"tcp://{procs.LOOPBACK}:*")
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.seq = 0
        self.enc = msgspec.msgpack.Encoder()

    def publish(self, batch) -> None:
        self.sock.send_multipart((b"", self.seq.to_bytes(8, "big"), self.enc.encode(batch)))
        self.seq += 1


def sha(*parts) -> bytes:
    return hashlib.sha256(repr(parts).encode()).digest()


def signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


PROMPT = [101, 15, 100, 55, 89, 63, 7, 8]


@pytest.fixture
def conductor(tmp_path):
    cfg = tmp_path / "conductor_config.json"
    cfg.write_text(json.dumps({"http_server_port": 1, "kvevent_instance": []}))
    # The file's port is overridden by the flag.
    p = procs.start("mooncake_conductor", "--port=0", f"--host={procs.LOOPBACK}", env={"CONDUCTOR_CONFIG_PATH": str(cfg)})
    try:
        m = p.wait_for_line(r"listening on [\d.]+:(\d+)")
        yield ConductorClient(f"http://{procs.LOOPBACK}:{m.group(1)}", timeout=10)
    finally:
        assert p.stop() == 0, p.output()


def heard(c: ConductorClient, instance: str, probe) -> None:
    """Probes until the Conductor has a batch: a SUB socket misses what is
    sent before its subscription reaches the PUB socket."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        probe()
        if any(s["instance_id"] == instance and s["batches"] > 0 for s in c.instances()):
            return
        time.sleep(0.1)
    pytest.fail(f"{instance}: no batch reached the conductor")


def eventually(what: str, cond, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"never happened: {what}")


def test_vllm_and_sglang_frames(conductor):
    c = conductor
    ctx = zmq.Context()
    vllm, sgl = Publisher(ctx), Publisher(ctx)
    try:
        r = c.register(endpoint=vllm.endpoint, type="vLLM", modelname="qwen", instance_id="vllm-1", block_size=2, dp_rank=0)
        assert r == {"status": "registered successfully", "instance_id": "vllm-1"}
        c.register(endpoint=sgl.endpoint, type="SGLang", modelname="qwen", instance_id="sgl-1", block_size=2, dp_rank=1)
        heard(c, "vllm-1", lambda: vllm.publish(VllmBatch(ts=time.time(), events=[], data_parallel_rank=0)))
        heard(c, "sgl-1", lambda: sgl.publish(SglBatch(ts=time.time(), events=[], attn_dp_rank=1)))

        # vLLM: 3 blocks on GPU (SHA-256 hashes), 2 of them offloaded to CPU
        # (an offload event carries hashes only).
        hs = [sha("b", i) for i in range(4)]
        vllm.publish(VllmBatch(ts=time.time(), data_parallel_rank=0, events=[
            VllmStored(block_hashes=hs[:2], parent_block_hash=None, token_ids=PROMPT[:4], block_size=2,
                       lora_id=None, medium="GPU", lora_name=None),
            VllmStored(block_hashes=[hs[2]], parent_block_hash=hs[1], token_ids=PROMPT[4:6], block_size=2,
                       lora_id=None, medium="GPU", lora_name=None, extra_keys=[None], group_idx=0,
                       kv_cache_spec_kind="full_attention"),
            VllmStored(block_hashes=hs[:2], parent_block_hash=None, token_ids=[], block_size=2,
                       lora_id=None, medium="CPU", lora_name=None),
        ]))
        # SGLang: the whole prompt on GPU, signed hashes, under a cache salt;
        # and the first block once more without it.
        sh = [signed(0xF000_0000_0000_0000 + i) for i in range(4)]
        sgl.publish(SglBatch(ts=time.time(), attn_dp_rank=1, events=[
            SglStoredWithMetadata(block_hashes=sh, parent_block_hash=None, token_ids=PROMPT, block_size=2,
                                  lora_id=None, medium="GPU", metadata=BlockStoredMetadata(cache_salt="s1")),
            SglStored(block_hashes=[123], parent_block_hash=None, token_ids=PROMPT[:2], block_size=2,
                      lora_id=None, medium="CPU_PINNED"),
        ]))
        want_vllm = {"longest_matched": 6, "GPU": 6, "CPU": 4, "DISK": 0, "DP": {"0": 6}}
        eventually("vLLM's blocks", lambda: c.query("qwen", PROMPT, 2).get("vllm-1") == want_vllm)
        hits = eventually("SGLang's blocks", lambda: c.query("qwen", PROMPT, 2)["sgl-1"]["longest_matched"] == 2 and c.query("qwen", PROMPT, 2))
        assert hits["sgl-1"] == {"longest_matched": 2, "GPU": 0, "CPU": 2, "DISK": 0, "DP": {"1": 0}}
        salted = c.query("qwen", PROMPT, 2, cache_salt="s1")
        assert salted["sgl-1"] == {"longest_matched": 8, "GPU": 8, "CPU": 0, "DISK": 0, "DP": {"1": 8}}
        assert salted["vllm-1"]["longest_matched"] == 0
        # A router hashing as the standard says asks the same by hash.
        assert c.query_by_hash("qwen", seq_hashes(PROMPT, 2), 2) == c.query("qwen", PROMPT, 2)
        assert c.best_instance("qwen", PROMPT, 2) == ("vllm-1", want_vllm)
        assert c.best_instance("qwen", PROMPT, 2, cache_salt="s1")[0] == "sgl-1"

        # Removals name the engines' own hashes.
        vllm.publish(VllmBatch(ts=time.time(), events=[VllmRemoved(block_hashes=[hs[0]], medium="GPU")]))
        sgl.publish(SglBatch(ts=time.time(), events=[SglRemoved(block_hashes=[sh[1]], medium="GPU")]))
        eventually("vLLM's removal", lambda: c.query("qwen", PROMPT, 2)["vllm-1"]["GPU"] == 4)
        eventually("SGLang's removal", lambda: c.query("qwen", PROMPT, 2, cache_salt="s1")["sgl-1"]["longest_matched"] == 2)

        with pytest.raises(ConductorError) as e:
            c.query("qwen", PROMPT, 0)
        assert e.value.status == 400 and "block_size" in str(e.value)
        with pytest.raises(ConductorError) as e:
            c.register(endpoint=vllm.endpoint, type="vLLM", modelname="qwen", instance_id="vllm-1", block_size=2)
        assert e.value.status == 409
        metrics = c.metrics()
        assert 'conductor_events_total{publisher="vllm-1|default|0|vLLM",kind="stored"} 3' in metrics, metrics
        assert c.unregister("vllm-1") == ["vllm-1|default|0"]
        assert "vllm-1" not in c.query("qwen", PROMPT, 2)
    finally:
        vllm.sock.close(linger=0)
        sgl.sock.close(linger=0)
        ctx.destroy(linger=0)  # closes what a failed assertion left open


def test_seq_hashes_are_the_standard():
    # Dynamo's published vector: one block of [1, 2, 3, 4], seed 1337.
    assert seq_hashes([1, 2, 3, 4], 4) == [14643705804678351452]
    two = seq_hashes([1, 2, 3, 4, 5, 6], 2)
    assert len(two) == 3 and seq_hashes([1, 2, 3, 4, 5], 2) == two[:2]
    assert seq_hashes([1, 2, 3, 4], 4, seed=7) != seq_hashes([1, 2, 3, 4], 4)
    with pytest.raises(ValueError):
        seq_hashes([1, -2], 2)
    with pytest.raises(ValueError):
        seq_hashes([1, 2], 0)


def master_with_events(*flags: str):
    port = procs.free_port()
    cluster = Cluster(
        "--enable_kv_events=true",
        f"--kv_events_bind_endpoint=tcp://{procs.LOOPBACK}:{port}",
        "--kv_events_backend_id=pool-test",
        *flags,
    )
    return cluster, f"tcp://{procs.LOOPBACK}:{port}"


def until_heard(c: ConductorClient, store) -> None:
    """Puts probe keys until the Conductor has one of their batches."""
    n = [0]

    def probe():
        n[0] += 1
        assert store.put(f"{900000 + n[0]}", b"p") == 0

    heard(c, "pool", probe)


def test_master_events_end_to_end(conductor):
    """A put of the block a prompt's hash names shows as CPU in the
    Conductor's answer to the prompt's tokens; a remove takes it away."""
    c = conductor
    cluster, endpoint = master_with_events()
    store = new_store(cluster)
    try:
        c.register(endpoint=endpoint, type="Mooncake", modelname="qwen", instance_id="pool",
                   block_size=16, dp_rank=0)
        until_heard(c, store)
        prompt = list(range(1000, 1048))
        h = seq_hashes(prompt, 16)
        # The object keys are the blocks' hashes: decimal, and 0x hex.
        assert store.put(str(h[0]), b"x" * 4096) == 0
        assert store.put(hex(h[1]), b"y" * 4096) == 0
        want = {"longest_matched": 32, "GPU": 0, "CPU": 32, "DISK": 0, "DP": {}}
        eventually("the puts", lambda: c.query("qwen", prompt, 16).get("pool") == want)
        assert c.query_by_hash("qwen", h, 16)["pool"] == want
        # Another block size is another namespace.
        assert c.query("qwen", prompt, 8).get("pool", {}).get("longest_matched", 0) == 0
        assert store.remove(str(h[0])) == 0
        eventually("the remove", lambda: c.query("qwen", prompt, 16)["pool"]["longest_matched"] == 0)
        assert c.query_by_hash("qwen", h[1:], 16)["pool"]["CPU"] == 16
    finally:
        store.close()
        assert cluster.stop() == 0, cluster.proc.output()


def test_master_disk_tier_end_to_end(conductor, tmp_path):
    """Blocks written to the shared-filesystem tier under memory pressure show
    as DISK; removing one whose memory copy was evicted takes it off DISK."""
    from mooncake.store import MooncakeDistributedStore

    c = conductor
    cluster, endpoint = master_with_events(f"--root_fs_dir={tmp_path}", "--default_kv_lease_ttl=50")
    owner, writer = MooncakeDistributedStore(), MooncakeDistributedStore()
    try:
        mib = 1 << 20
        assert owner.setup("127.0.0.1", cluster.metadata, 4 * mib, 16 * mib, "tcp", "", cluster.master) == 0
        assert writer.setup("127.0.0.1", cluster.metadata, 0, 16 * mib, "tcp", "", cluster.master) == 0
        c.register(endpoint=endpoint, type="Mooncake", modelname="qwen", instance_id="pool",
                   block_size=16, dp_rank=0)
        until_heard(c, writer)
        blocks = 48  # 12 MiB of values through a 4 MiB segment
        prompt = [7 + i for i in range(blocks * 16)]
        h = seq_hashes(prompt, 16)
        for i, key in enumerate(h):
            deadline = time.monotonic() + 60
            # -200: memory is full of objects whose file is not written yet.
            while (rc := writer.put(str(key), bytes([i]) * (256 << 10))) == -200 and time.monotonic() < deadline:
                time.sleep(0.005)
            assert rc == 0, (i, rc)
        hit = eventually(
            "blocks on disk",
            lambda: (a := c.query("qwen", prompt, 16)["pool"])["longest_matched"] == blocks * 16
            and a["DISK"] >= 16 and a,
        )
        assert hit["CPU"] >= 16 and hit["GPU"] == 0, hit
        # The master's own view agrees: a block the Conductor counts on disk
        # is one the master reports as a disk replica.
        descs = writer.batch_get_replica_desc([str(k) for k in h])
        on_disk = [i for i, k in enumerate(h) if any(r.is_disk_replica() for r in descs[str(k)])]
        assert on_disk, "no object reached the shared filesystem"
        # The segment holds at most 16 of them: the others left memory.
        only_disk = [i for i in on_disk if all(r.is_disk_replica() for r in descs[str(h[i])])]
        assert len(only_disk) >= blocks - 16, (on_disk, only_disk)
        # A removal names the tier the block left.
        i = only_disk[0]
        before = c.query_by_hash("qwen", [h[i]], 16)["pool"]
        assert before["DISK"] == 16, before
        assert writer.remove(str(h[i])) == 0
        eventually("the disk removal", lambda: c.query_by_hash("qwen", [h[i]], 16)["pool"]["DISK"] == 0)
    finally:
        writer.close()
        owner.close()
        assert cluster.stop() == 0, cluster.proc.output()


def backend(name: str) -> ThreadingHTTPServer:
    """An engine stand-in answering every POST with its name and the body."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            out = json.dumps({"served_by": name, "path": self.path, "body": json.loads(body)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((procs.LOOPBACK, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_cache_aware_proxy_example(conductor):
    """examples/conductor_proxy.py sends a prompt to the instance holding its
    prefix, and one nobody holds to either."""
    c = conductor
    ctx = zmq.Context()
    pub = Publisher(ctx)
    servers = {name: backend(name) for name in ("vllm-1", "vllm-2")}
    proxy = None
    try:
        c.register(endpoint=pub.endpoint, type="vLLM", modelname="qwen", instance_id="vllm-2", block_size=2, dp_rank=0)
        heard(c, "vllm-2", lambda: pub.publish(VllmBatch(ts=time.time(), events=[], data_parallel_rank=0)))
        pub.publish(VllmBatch(ts=time.time(), events=[
            VllmStored(block_hashes=[11, 12, 13], parent_block_hash=None, token_ids=PROMPT[:6], block_size=2,
                       lora_id=None, medium="GPU", lora_name=None),
        ]))
        eventually("the blocks", lambda: c.query("qwen", PROMPT, 2)["vllm-2"]["longest_matched"] == 6)

        port = procs.free_port()
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "conductor_proxy.py")
        argv = [sys.executable, "-u", script, "--conductor", c.url, "--model", "qwen", "--block-size", "2",
                "--conductor-timeout", "30", "--host", procs.LOOPBACK, "--port", str(port)]
        for name, srv in sorted(servers.items()):
            argv += ["--backend", f"{name}=http://{procs.LOOPBACK}:{srv.server_address[1]}"]
        proxy = procs.Proc(argv)
        proxy.wait_for_line(r"conductor proxy listening")

        def send(prompt):
            req = urllib.request.Request(f"http://{procs.LOOPBACK}:{port}/v1/completions",
                                         data=json.dumps({"model": "qwen", "prompt": prompt}).encode(), method="POST")
            req.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.headers["X-Routed-To"], json.loads(r.read())

        routed, answer = send(PROMPT)
        assert routed == "vllm-2" and answer["served_by"] == "vllm-2", answer
        assert answer["path"] == "/v1/completions" and answer["body"]["prompt"] == PROMPT
        # Nobody holds this one: round robin over both.
        seen = {send([9, 9, 9, 9])[0] for _ in range(4)}
        assert seen == {"vllm-1", "vllm-2"}
    finally:
        if proxy is not None:
            proxy.stop()
        for srv in servers.values():
            srv.shutdown()
            srv.server_close()
        pub.sock.close(linger=0)
        ctx.destroy(linger=0)  # closes what a failed assertion left open
