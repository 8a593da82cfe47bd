"""Drain jobs on the master's HTTP port, the scenarios of the reference's
`scripts/test_drain_http_api.py` plus its error answers (checked on the
reference master): a drained segment's objects move to the target, puts
meanwhile avoid it, and it ends DRAINED."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import procs
import pytest
from conftest import Cluster
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def drain_cluster():
    c = Cluster()
    try:
        yield c
    finally:
        assert c.stop() == 0, c.proc.output()


def control(c):
    return f"http://{procs.LOOPBACK}:{c.metrics_port}"


def call(url, body=None, method=None):
    """(HTTP status, parsed JSON body)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def store(c, name):
    s = MooncakeDistributedStore()
    assert s.setup(name, c.metadata, 64 * MiB, 16 * MiB, "tcp", "", c.master) == 0
    return s


def put(s, key, value, segment, hard_pin=False):
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    cfg.preferred_segment = segment
    cfg.with_hard_pin = hard_pin
    assert s.put(key, value, cfg) == 0


def endpoints(s, key):
    return sorted(d.get_memory_descriptor().buffer_descriptor.transport_endpoint
                  for d in s.get_replica_desc(key) if d.is_memory_replica)


def wait_for(what, fn, timeout=60):
    deadline = time.time() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def status_of(c, segment):
    code, body = call(f"{control(c)}/api/v1/segments/status?segment={segment}")
    assert code == 200 and body["success"], body
    return body["status_name"]


def job(c, job_id):
    code, body = call(f"{control(c)}/api/v1/drain_jobs/query?job_id={job_id}")
    assert code == 200 and body["success"], body
    return body


def test_drain_moves_every_object_to_the_target(drain_cluster):
    c = drain_cluster
    src, dst = f"127.0.0.1:{procs.free_port()}", f"127.0.0.1:{procs.free_port()}"
    source, target = store(c, src), store(c, dst)
    try:
        preload = [(f"drain/pre/{i}", os.urandom(256 * KiB)) for i in range(24)]
        for k, v in preload:
            put(source, k, v, src)
            assert endpoints(target, k) == [src]
        assert status_of(c, src) == "OK"
        code, body = call(f"{control(c)}/api/v1/drain_jobs",
                          {"segments": [src], "target_segments": [dst], "max_concurrency": 1})
        assert code == 200 and body["success"] and body["status"] == "CREATED", body
        job_id = body["job_id"]
        assert status_of(c, src) in ("DRAINING", "DRAINED")
        # Puts that prefer the draining segment land on the target.
        redirected = [(f"drain/redir/{i}", os.urandom(64 * KiB)) for i in range(8)]
        for k, v in redirected:
            put(source, k, v, src)
            assert endpoints(target, k) == [dst]
        final = wait_for("the job to finish",
                         lambda: (j := job(c, job_id))["status_name"] in ("SUCCEEDED", "FAILED", "CANCELED") and j)
        assert final["status_name"] == "SUCCEEDED", final
        assert final["active_units"] == 0 and final["succeeded_units"] >= len(preload), final
        assert final["segments"] == [src] and final["type_name"] == "DRAIN"
        assert final["migrated_bytes"] >= 24 * 256 * KiB
        assert status_of(c, src) == "DRAINED"
        for k, v in preload + redirected:
            assert target.get(k) == v
            assert endpoints(target, k) == [dst]
        # A drained segment takes no new objects.
        put(target, "drain/after", b"x" * 4096, src)
        assert endpoints(target, "drain/after") == [dst]
    finally:
        source.close()
    try:
        for k, v in preload + redirected:
            assert target.get(k) == v, "data survives the drained host leaving"
    finally:
        target.close()


def test_cancel_restores_the_segment(drain_cluster):
    c = drain_cluster
    src, dst = f"127.0.0.1:{procs.free_port()}", f"127.0.0.1:{procs.free_port()}"
    source, target = store(c, src), store(c, dst)
    try:
        # A hard-pinned object is never moved: the job waits, no task in flight.
        put(source, "drain/pinned", b"p" * 4096, src, hard_pin=True)
        code, body = call(f"{control(c)}/api/v1/drain_jobs", {"segments": [src], "target_segments": [dst]})
        assert code == 200, body
        job_id = body["job_id"]
        wait_for("the job to see its blocked unit", lambda: job(c, job_id)["blocked_units"] == 1)
        assert job(c, job_id)["status_name"] == "RUNNING"
        # A second job on a segment already draining: 409.
        code, body = call(f"{control(c)}/api/v1/drain_jobs", {"segments": [src]})
        assert (code, body["error_code"]) == (409, -1010), body
        code, body = call(f"{control(c)}/api/v1/drain_jobs/cancel?job_id={job_id}", b"")
        assert code == 200 and body["status"] == "CANCELED", body
        assert status_of(c, src) == "OK"
        assert job(c, job_id)["status_name"] == "CANCELED"
        code, body = call(f"{control(c)}/api/v1/drain_jobs/cancel?job_id={job_id}", b"")
        assert (code, body["error_code"]) == (409, -1010), body
        assert endpoints(target, "drain/pinned") == [src]
    finally:
        source.close()
        target.close()


def test_error_answers(drain_cluster):
    c = drain_cluster
    base = control(c)
    seg = f"127.0.0.1:{procs.free_port()}"
    s = store(c, seg)
    try:
        unknown_job = "00000000-0000-0000-0000-000000000001"
        cases = [
            (f"{base}/api/v1/segments/status", None, 400, -600, "Missing segment query parameter"),
            (f"{base}/api/v1/segments/status?segment=nope", None, 404, -101, "SEGMENT_NOT_FOUND"),
            (f"{base}/api/v1/drain_jobs/query", None, 400, -600, "Missing or invalid job_id"),
            (f"{base}/api/v1/drain_jobs/query?job_id=abc", None, 400, -600, "Missing or invalid job_id"),
            (f"{base}/api/v1/drain_jobs/query?job_id={unknown_job}", None, 404, -1402, "JOB_NOT_FOUND"),
            (f"{base}/api/v1/drain_jobs/cancel?job_id={unknown_job}", b"", 404, -1402, "JOB_NOT_FOUND"),
            (f"{base}/api/v1/drain_jobs", {"segments": []}, 400, -600, "INVALID_PARAMS"),
            (f"{base}/api/v1/drain_jobs", {"segments": [seg, seg]}, 400, -600, "INVALID_PARAMS"),
            (f"{base}/api/v1/drain_jobs", {"segments": [seg], "max_concurrency": 0}, 400, -600, "INVALID_PARAMS"),
            (f"{base}/api/v1/drain_jobs", {"segments": ["nope"]}, 404, -101, "SEGMENT_NOT_FOUND"),
            (f"{base}/api/v1/drain_jobs", {"segments": [seg], "target_segments": [seg]}, 400, -600, "INVALID_PARAMS"),
            (f"{base}/api/v1/drain_jobs", {"segments": [seg], "target_segments": ["nope"]}, 404, -101,
             "SEGMENT_NOT_FOUND"),
        ]
        for url, body, status, code, message in cases:
            got_status, got = call(url, body)
            assert (got_status, got) == (status, {"success": False, "error_code": code,
                                                  "error_message": message}), url
        got_status, got = call(f"{base}/api/v1/drain_jobs", b"{not json")
        assert (got_status, got["error_code"]) == (400, -600)
        assert got["error_message"].startswith("Invalid JSON body")
        assert status_of(c, seg) == "OK", "refused requests change nothing"
    finally:
        s.close()
