"""The handlers of `mooncake.mooncake_store_service`, as the reference's
`test_mooncake_store_service_api.py` drives them (its cases that pass on the
reference): the same calls, with a recording store in place of the real one,
and the same assertions. The service as a process, over a real master, is
test_store_service.py."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from types import SimpleNamespace
from unittest import mock

import pytest

from mooncake import mooncake_store_service as svc
from mooncake.mooncake_store_service import (
    MooncakeStoreService,
    _install_shutdown_signal_handlers,
    _shm_name_to_path,
)

SEG1 = "00000000-0000-0000-0000-000000000001"
SEG2 = "00000000-0000-0000-0000-000000000002"


class RecordingStore:
    """Answers the segment calls the way a store would, recording each."""

    def __init__(self):
        self.mounted = {}
        self.mount_calls = []
        self.unmount_calls = []
        self.fail_mount = False
        self.unmount_failures = set()
        self.allocated_mount_calls = []
        self.free_unmount_calls = []
        self.unmount_local_disk_calls = []
        self.fail_unmount_local_disk = False
        self.setup_calls = []

    def setup(self, *args):
        self.setup_calls.append(args)
        return 0

    def mount_segment(self, path, size, offset, protocol, location):
        self.mount_calls.append((path, size, offset, protocol, location))
        if self.fail_mount:
            return {"ret": -1, "segment_ids": []}
        self.mounted[SEG1] = path
        return {"ret": 0, "segment_ids": [SEG1]}

    def unmount_segment(self, segment_ids, grace_period_seconds=0):
        self.unmount_calls.append((list(segment_ids), grace_period_seconds))
        if any(s in self.unmount_failures for s in segment_ids):
            return -1
        for s in segment_ids:
            self.mounted.pop(s, None)
        return 0

    def allocate_and_mount_segment(self, size, protocol, location):
        self.allocated_mount_calls.append((size, protocol, location))
        return {"ret": 0, "segment_ids": [SEG2], "allocated_size": 4096}

    def unmount_and_free_segment(self, segment_ids, grace_period_seconds=0):
        self.free_unmount_calls.append((list(segment_ids), grace_period_seconds))
        return 0

    def unmount_local_disk_segment(self, grace_period_seconds=0):
        self.unmount_local_disk_calls.append(grace_period_seconds)
        return -1 if self.fail_unmount_local_disk else 0


class Req:
    """What a handler reads of a request: ``json()`` and ``match_info``."""

    def __init__(self, body=None, json_error=None, key=None):
        self.body, self.json_error = body, json_error
        self.match_info = {"key": key}

    async def json(self):
        if self.json_error is not None:
            raise self.json_error
        return self.body


def call(coro):
    return asyncio.run(coro)


def body(resp):
    return json.loads(resp.text)


def new_service(store=None):
    """A service around `store` without a config file or a store setup."""
    s = MooncakeStoreService.__new__(MooncakeStoreService)
    s.store = store
    s.config = SimpleNamespace(protocol="tcp")
    s.current_mode = "prefill"
    s.mounted_segment_ids = []
    s.last_mount_info = {}
    s._state_lock = asyncio.Lock()
    return s


@pytest.fixture
def fake():
    return RecordingStore()


@pytest.fixture
def service(fake):
    return new_service(fake)


def old_decode(service, ids, path="/dev/shm/old"):
    service.current_mode = "decode"
    service.mounted_segment_ids = list(ids)
    service.last_mount_info = {"path": path, "offset": 0, "size": 4096, "protocol": "tcp", "location": ""}


# --- configuration and startup ----------------------------------------------


def full_config(**over):
    c = dict(
        local_hostname="localhost", metadata_server="P2PHANDSHAKE", global_segment_size=1024,
        local_buffer_size=2048, protocol="tcp", device_name="", master_server_address="127.0.0.1:50051",
        enable_ssd_offload=False, ssd_offload_path="", tenant_id="tenant-a",
        enable_client_http_server=False, client_http_port=9300,
    )
    c.update(over)
    return SimpleNamespace(**c)


def test_start_store_service_passes_tenant_id_to_setup(service):
    store = RecordingStore()
    service.config = full_config()
    with mock.patch("mooncake.mooncake_store_service.MooncakeDistributedStore", return_value=store):
        assert call(service.start_store_service(max_wait_time=1))
    assert store.setup_calls == [({
        "local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE", "global_segment_size": 1024,
        "local_buffer_size": 2048, "protocol": "tcp", "rdma_devices": "",
        "master_server_addr": "127.0.0.1:50051", "enable_ssd_offload": False, "ssd_offload_path": "",
        "tenant_id": "tenant-a", "enable_client_http_server": False, "client_http_port": 9300,
    },)]


def write_config(tmp_path, **fields):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
        "master_server_address": "127.0.0.1:50051", **fields,
    }))
    return str(path)


def test_cli_config_can_override_tenant_id(tmp_path):
    s = MooncakeStoreService(write_config(tmp_path, tenant_id="tenant-from-file"), {"tenant_id": "tenant-from-cli"})
    assert s.config.tenant_id == "tenant-from-cli"


def test_cli_config_values_are_parsed_and_checked(tmp_path):
    path = write_config(tmp_path)
    s = MooncakeStoreService(path, {"global_segment_size": "64MB", "enable_ssd_offload": "true"})
    assert (s.config.global_segment_size, s.config.enable_ssd_offload) == (64 << 20, True)
    with pytest.raises(ValueError, match="no_such_field"):
        MooncakeStoreService(path, {"no_such_field": "1"})
    with pytest.raises(ValueError, match="size"):
        MooncakeStoreService(path, {"local_buffer_size": "lots"})


def test_shutdown_event_stops_startup_retry_sleep(caplog):
    service = new_service()
    service.config = full_config(global_segment_size=1, local_buffer_size=0, tenant_id="")

    class FailingStore:
        def setup(self, *_args):
            raise RuntimeError("setup failed")

    async def scenario():
        event = asyncio.Event()

        async def trigger():
            await asyncio.sleep(0)
            event.set()

        with mock.patch("mooncake.mooncake_store_service.MooncakeDistributedStore", FailingStore):
            task = asyncio.create_task(trigger())
            began = time.perf_counter()
            result = await service.start_store_service(max_wait_time=2, shutdown_event=event)
            elapsed = time.perf_counter() - began
            await task
        return result, elapsed

    with caplog.at_level(logging.WARNING):
        result, elapsed = call(scenario())
    assert result is False
    assert elapsed < 0.5
    assert any(r.levelno >= logging.WARNING for r in caplog.records)


def test_shutdown_during_setup_is_observed_before_success():
    service = new_service()
    service.config = full_config()

    async def scenario():
        event = asyncio.Event()
        loop = asyncio.get_running_loop()

        class SchedulingStore(RecordingStore):
            close_calls = 0

            def setup(self, *args):
                loop.call_soon(event.set)
                return super().setup(*args)

            def close(self):
                SchedulingStore.close_calls += 1
                return 0

        store = SchedulingStore()
        with mock.patch("mooncake.mooncake_store_service.MooncakeDistributedStore", return_value=store):
            return await service.start_store_service(max_wait_time=1, shutdown_event=event), store

    result, store = call(scenario())
    assert result is False
    assert store.close_calls == 1
    assert service.store is None


def test_stop_logs_nonzero_close_return(caplog):
    service = new_service(mock.Mock())
    store = service.store
    store.close.return_value = 7
    with caplog.at_level(logging.WARNING):
        call(service.stop())
    assert service.store is None
    assert any("close returned 7" in r.getMessage() for r in caplog.records)
    call(service.stop())
    store.close.assert_called_once_with()


def test_signal_handler_requests_shutdown():
    loop = mock.Mock()
    event = asyncio.Event()
    _install_shutdown_signal_handlers(loop, event)
    sigterm = next(c for c in loop.add_signal_handler.call_args_list if c.args[0] == signal.SIGTERM)
    sigterm.args[1](sigterm.args[2])
    assert event.is_set()


def test_main_closes_store_when_shutdown_requested_during_startup():
    args = SimpleNamespace(config=None, define=[], max_wait_time=60, port=8080)
    service = mock.Mock()
    service.start_store_service = mock.AsyncMock(return_value=False)
    service.start_http_service = mock.AsyncMock(return_value=True)
    service.stop = mock.AsyncMock()
    calls = []

    def install(_loop, event):
        calls.append("install")
        event.set()

    with mock.patch.object(svc, "parse_arguments", return_value=args), \
            mock.patch.object(svc, "MooncakeStoreService", return_value=service), \
            mock.patch.object(svc, "_unblock_shutdown_signals", side_effect=lambda: calls.append("unblock")), \
            mock.patch.object(svc, "_install_shutdown_signal_handlers", side_effect=install):
        call(svc.main())
    service.start_store_service.assert_awaited_once()
    service.start_http_service.assert_not_awaited()
    service.stop.assert_awaited_once()
    assert calls == ["install", "unblock"]


# --- /api/mount_shm, /api/unmount_shm ---------------------------------------


def test_mount_shm_then_unmount_shm_api(service, fake):
    resp = call(service.handle_mount_shm(Req({
        "name": "mooncake-segment", "size": 4096, "offset": 128, "protocol": "tcp", "location": "cpu:0",
    })))
    assert resp.status == 200
    b = body(resp)
    assert b["status"] == "success"
    assert b["segment_ids"] == [SEG1]
    assert fake.mount_calls == [("/dev/shm/mooncake-segment", 4096, 128, "tcp", "cpu:0")]

    resp = call(service.handle_unmount_shm(Req({"segment_ids": b["segment_ids"]})))
    assert resp.status == 200
    assert body(resp)["status"] == "success"
    assert fake.unmount_calls == [([SEG1], 0)]
    assert service.current_mode == "prefill"


def test_unmount_shm_passes_grace_period(service, fake):
    service.current_mode, service.mounted_segment_ids = "decode", [SEG1]
    resp = call(service.handle_unmount_shm(Req({"segment_ids": [SEG1], "grace_period_seconds": 3})))
    assert resp.status == 200
    assert fake.unmount_calls == [([SEG1], 3)]
    assert service.mounted_segment_ids == []
    assert service.current_mode == "prefill"


def test_unmount_shm_updates_state_for_partial_success(service, fake):
    service.current_mode, service.mounted_segment_ids = "decode", [SEG1, SEG2]
    fake.unmount_failures = {SEG2}
    resp = call(service.handle_unmount_shm(Req({"segment_ids": [SEG1, SEG2]})))
    assert resp.status == 500
    assert body(resp)["failed_segment_ids"] == [SEG2]
    assert fake.unmount_calls == [([SEG1], 0), ([SEG2], 0)]
    assert service.mounted_segment_ids == [SEG2]
    assert service.current_mode == "decode"


def test_mount_shm_requires_name_and_size(service):
    resp = call(service.handle_mount_shm(Req({"name": "mooncake-segment"})))
    assert resp.status == 400
    assert "name or size" in body(resp)["error"]


def test_mount_shm_rejects_path_like_name(service):
    resp = call(service.handle_mount_shm(Req({"name": "../foo", "size": 4096})))
    assert resp.status == 400
    assert "name or size" in body(resp)["error"]


def test_unmount_shm_requires_segment_ids(service):
    resp = call(service.handle_unmount_shm(Req({})))
    assert resp.status == 400
    assert "Missing segment_ids" in body(resp)["error"]


def test_mount_shm_store_failure(service, fake):
    fake.fail_mount = True
    resp = call(service.handle_mount_shm(Req({"name": "test-seg", "size": 4096})))
    assert resp.status == 500
    assert "Mount failed" in body(resp)["error"]


def test_mount_shm_with_defaults(service, fake):
    resp = call(service.handle_mount_shm(Req({"name": "minimal-seg", "size": 2048})))
    assert resp.status == 200
    assert fake.mount_calls == [("/dev/shm/minimal-seg", 2048, 0, "tcp", "")]


@pytest.mark.parametrize("name", ["", ".", ".."])
def test_mount_shm_rejects_empty_and_dot_names(service, name):
    assert call(service.handle_mount_shm(Req({"name": name, "size": 4096}))).status == 400


def test_unmount_shm_empty_list(service):
    assert call(service.handle_unmount_shm(Req({"segment_ids": []}))).status == 400


@pytest.mark.parametrize("grace", [-1, 1.5, "3", True])
def test_unmount_calls_reject_a_bad_grace_period(service, fake, grace):
    for handler in (service.handle_unmount_shm, service.handle_unmount):
        resp = call(handler(Req({"segment_ids": [SEG1], "grace_period_seconds": grace})))
        assert resp.status == 400, grace
        assert "grace_period_seconds" in body(resp)["error"]
    assert fake.unmount_calls == fake.free_unmount_calls == []


# --- /api/reconfigure ---------------------------------------------------------


def test_reconfigure_decode_mount_failure_rolls_back_to_prefill(service, fake):
    fake.fail_mount = True
    resp = call(service.handle_reconfigure(Req({"mode": "decode", "path": "/dev/shm/new", "size": 4096})))
    assert resp.status == 500
    b = body(resp)
    assert b["mode"] == "prefill"
    assert "rolled back to prefill" in b["error"]
    assert fake.unmount_calls == []
    assert service.mounted_segment_ids == []
    assert service.current_mode == "prefill"
    assert service.last_mount_info == {}


@pytest.mark.parametrize("old_path,new_path", [("/dev/shm/old", "/dev/shm/new"), ("/dev/shm/same", "/dev/shm/same")])
def test_reconfigure_decode_remount_failure_keeps_previous_segments(service, fake, old_path, new_path):
    old_decode(service, [SEG1], old_path)
    fake.fail_mount = True
    resp = call(service.handle_reconfigure(Req({"mode": "decode", "path": new_path, "size": 4096})))
    assert resp.status == 500
    b = body(resp)
    assert b["mode"] == "decode"
    assert "keeping previous decode segments" in b["error"]
    assert fake.unmount_calls == []
    assert service.mounted_segment_ids == [SEG1]
    assert service.current_mode == "decode"
    assert service.last_mount_info["path"] == old_path


def test_reconfigure_decode_remount_success_is_make_before_break(service, fake):
    old_decode(service, [SEG1])
    seen = {}

    def mount_new(path, size, offset, protocol, location):
        seen["old_still_mounted"] = SEG1 in service.mounted_segment_ids
        return {"ret": 0, "segment_ids": [SEG2]}

    fake.mount_segment = mount_new
    resp = call(service.handle_reconfigure(Req({"mode": "decode", "path": "/dev/shm/new", "size": 8192})))
    assert resp.status == 200
    assert body(resp)["mode"] == "decode"
    assert seen["old_still_mounted"] is True
    assert fake.unmount_calls == [([SEG1], 0)]
    assert service.mounted_segment_ids == [SEG2]
    assert service.current_mode == "decode"
    assert service.last_mount_info["path"] == "/dev/shm/new"


def test_reconfigure_decode_partial_unmount_failure_keeps_only_failed_ids(service, fake):
    old_ok, old_fail = "00000000-0000-0000-0000-0000000000a1", "00000000-0000-0000-0000-0000000000a2"
    new_id = "00000000-0000-0000-0000-0000000000b1"
    old_decode(service, [old_ok, old_fail])
    fake.unmount_failures = {old_fail}
    fake.mount_segment = lambda *a: {"ret": 0, "segment_ids": [new_id]}
    resp = call(service.handle_reconfigure(Req({"mode": "decode", "path": "/dev/shm/new", "size": 8192})))
    assert resp.status == 200
    assert fake.unmount_calls == [([old_ok], 0), ([old_fail], 0)]
    assert service.mounted_segment_ids == [new_id, old_fail]
    assert service.current_mode == "decode"


def test_reconfigure_decode_success(service):
    resp = call(service.handle_reconfigure(Req({"mode": "decode", "path": "/dev/shm/test", "size": 4096})))
    assert resp.status == 200
    b = body(resp)
    assert (b["mode"], b["status"]) == ("decode", "success")
    assert "segment_ids" in b
    assert service.current_mode == "decode"


@pytest.mark.parametrize("req", [{"mode": "decode", "size": 4096}, {"mode": "decode", "path": "/dev/shm/test"}])
def test_reconfigure_decode_missing_path_or_size(service, req):
    resp = call(service.handle_reconfigure(Req(req)))
    assert resp.status == 400
    assert "Missing path or size" in body(resp)["error"]


def test_reconfigure_prefill_success(service):
    service.current_mode = "decode"
    resp = call(service.handle_reconfigure(Req({"mode": "prefill"})))
    assert resp.status == 200
    assert body(resp)["mode"] == "prefill"
    assert service.current_mode == "prefill"


def test_reconfigure_prefill_unmount_failure(service, fake):
    service.current_mode, service.mounted_segment_ids = "decode", [SEG2]
    fake.unmount_failures = {SEG2}
    resp = call(service.handle_reconfigure(Req({"mode": "prefill"})))
    assert resp.status == 500
    assert "Unmount failed" in body(resp)["error"]


@pytest.mark.parametrize("req", [{"mode": "invalid"}, {}])
def test_reconfigure_invalid_or_empty_mode(service, req):
    resp = call(service.handle_reconfigure(Req(req)))
    assert resp.status == 400
    assert "Invalid mode" in body(resp)["error"]


# --- /api/mount, /api/unmount -------------------------------------------------


def test_mount_allocates_and_frees_on_unmount(service, fake):
    resp = call(service.handle_mount(Req({"size": 1, "protocol": "tcp", "location": "cpu:0"})))
    assert resp.status == 200
    b = body(resp)
    assert b["status"] == "success"
    assert b["segment_ids"] == [SEG2]
    assert b["allocated_size"] == 4096
    assert fake.allocated_mount_calls == [(1, "tcp", "cpu:0")]

    resp = call(service.handle_unmount(Req({"segment_ids": b["segment_ids"]})))
    assert resp.status == 200
    assert body(resp)["status"] == "success"
    assert fake.free_unmount_calls == [([SEG2], 0)]


def test_unmount_allocated_passes_grace_period(service, fake):
    resp = call(service.handle_unmount(Req({"segment_ids": [SEG2], "grace_period_seconds": 4})))
    assert resp.status == 200
    assert fake.free_unmount_calls == [([SEG2], 4)]


@pytest.mark.parametrize("size", [0, -1, 1.5, "1024", True])
def test_mount_requires_a_positive_integer_size(service, size):
    resp = call(service.handle_mount(Req({"size": size})))
    assert resp.status == 400
    assert "Invalid size" in body(resp)["error"]


def test_mount_missing_size(service):
    assert call(service.handle_mount(Req({}))).status == 400


@pytest.mark.parametrize("req", [{}, {"segment_ids": []}])
def test_unmount_requires_segment_ids(service, req):
    resp = call(service.handle_unmount(Req(req)))
    assert resp.status == 400
    assert "Missing segment_ids" in body(resp)["error"]


def test_unmount_success(service):
    resp = call(service.handle_unmount(Req({"segment_ids": [SEG2]})))
    assert resp.status == 200
    assert body(resp)["status"] == "success"


# --- /api/unmount_local_disk --------------------------------------------------


@pytest.mark.parametrize("req", [
    Req(None, json_error=json.JSONDecodeError("bad", "doc", 0)),
    Req([1, 2, 3]),
    Req({"grace_period_seconds": True}),
    Req({"grace_period_seconds": "30"}),
    Req({"grace_period_seconds": 1.5}),
    Req({"grace_period_seconds": -1}),
    Req({"grace_period_seconds": 3601}),
])
def test_unmount_local_disk_rejects_bad_bodies(service, fake, req):
    assert call(service.handle_unmount_local_disk(req)).status == 400
    assert fake.unmount_local_disk_calls == []


@pytest.mark.parametrize("req,grace", [({"grace_period_seconds": 3600}, 3600), ({}, 0), ({"grace_period_seconds": 30}, 30)])
def test_unmount_local_disk_passes_the_grace_period(service, fake, req, grace):
    resp = call(service.handle_unmount_local_disk(Req(req)))
    assert resp.status == 200
    assert body(resp)["status"] == "success"
    assert fake.unmount_local_disk_calls == [grace]


def test_unmount_local_disk_store_failure(service, fake):
    fake.fail_unmount_local_disk = True
    assert call(service.handle_unmount_local_disk(Req({}))).status == 500
    assert fake.unmount_local_disk_calls == [0]


# --- data calls -----------------------------------------------------------------


def test_handle_put(service, fake):
    fake.put = lambda key, value: 0
    resp = call(service.handle_put(Req({"key": "test_key", "value": "test_value"})))
    assert (resp.status, body(resp)["status"]) == (200, "success")
    for req in ({"value": "test_value"}, {"key": "", "value": "v"}, {"key": "k"}):
        resp = call(service.handle_put(Req(req)))
        assert resp.status == 400, req
        assert "Missing key or value" in body(resp)["error"]
    fake.put = lambda key, value: -1
    resp = call(service.handle_put(Req({"key": "k", "value": "v"})))
    assert resp.status == 500
    assert "PUT operation failed" in body(resp)["error"]


def get(service, key="k"):
    return call(service.handle_get(Req(key=key)))


def test_handle_get(service, fake):
    fake.is_exist = lambda key: True
    fake.get = lambda key: b"payload_bytes"
    resp = get(service)
    assert (resp.status, resp.body) == (200, b"payload_bytes")

    fake.get = lambda key: b""
    resp = get(service)
    assert (resp.status, resp.body) == (200, b"")

    fake.get = lambda key: None
    resp = get(service)
    assert resp.status == 500
    assert "GET operation failed" in body(resp)["error"]

    def crash(key):
        raise RuntimeError("store crashed")

    fake.get = crash
    resp = get(service)
    assert resp.status == 500
    assert "store crashed" in body(resp)["error"]


def test_handle_get_missing_and_failing_exist(service, fake):
    fake.get = lambda key: b""
    fake.is_exist = lambda key: 0
    resp = get(service)
    assert resp.status == 404
    assert "Key not found" in body(resp)["error"]
    fake.is_exist = lambda key: -1
    resp = get(service)
    assert resp.status == 500
    assert "Exist check failed" in body(resp)["error"]
    # Removed between the exist check and the read.
    answers = iter([1, 0])
    fake.is_exist = lambda key: next(answers)
    resp = get(service)
    assert resp.status == 404
    assert "Key not found" in body(resp)["error"]


def test_handle_exist(service, fake):
    for answer, exists in ((True, True), (False, False)):
        fake.is_exist = lambda key: answer
        resp = call(service.handle_exist(Req(key="k")))
        assert resp.status == 200
        assert body(resp)["exists"] is exists
    fake.is_exist = lambda key: -1
    resp = call(service.handle_exist(Req(key="k")))
    assert resp.status == 500
    assert body(resp)["error"] == "Exist check failed"

    def crash(key):
        raise RuntimeError("exist check crashed")

    fake.is_exist = crash
    resp = call(service.handle_exist(Req(key="k")))
    assert resp.status == 500
    assert "exist check crashed" in body(resp)["error"]


def test_handle_remove(service, fake):
    fake.remove = lambda key: 0
    resp = call(service.handle_remove(Req(key="k")))
    assert (resp.status, body(resp)["status"]) == (200, "success")
    fake.remove = lambda key: -1
    resp = call(service.handle_remove(Req(key="k")))
    assert resp.status == 500
    assert "Remove operation failed" in body(resp)["error"]

    def crash(key):
        raise RuntimeError("remove crashed")

    fake.remove = crash
    resp = call(service.handle_remove(Req(key="k")))
    assert resp.status == 500
    assert "remove crashed" in body(resp)["error"]


def test_handle_remove_all(service, fake):
    for n in (5, 0):
        fake.remove_all = lambda: n
        resp = call(service.handle_remove_all(Req({})))
        assert resp.status == 200
        assert str(n) in body(resp)["status"]
    fake.remove_all = lambda: -1
    resp = call(service.handle_remove_all(Req({})))
    assert resp.status == 500
    assert "RemoveAll operation failed" in body(resp)["error"]

    def crash():
        raise RuntimeError("remove_all crashed")

    fake.remove_all = crash
    resp = call(service.handle_remove_all(Req({})))
    assert resp.status == 500
    assert "remove_all crashed" in body(resp)["error"]


@pytest.mark.parametrize("name,path", [("my-segment", "/dev/shm/my-segment"), ("/my-segment", "/dev/shm/my-segment")])
def test_shm_name_to_path(name, path):
    assert _shm_name_to_path(name) == path


@pytest.mark.parametrize("name", ["", None, 123, ".", "..", "../etc/passwd", "subdir/file", "/", "/.", "/.."])
def test_shm_name_to_path_rejects(name):
    assert _shm_name_to_path(name) is None
