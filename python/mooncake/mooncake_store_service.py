"""The standalone store service: a ``MooncakeDistributedStore`` that holds a
segment for the cluster, with a REST API (aiohttp) for data calls and for
mounting and unmounting segments at run time.

    python -m mooncake.mooncake_store_service --config mooncake.json --port 8080
    mc_store_rest_server -Dmaster_server_address=10.0.0.1:50051 --port 8080

The routes, bodies, status codes and flags are the reference's
(``docs/store-service.md``). The settings come from ``--config`` (a JSON file)
or, without it, from the environment (``MooncakeConfig.load_from_env``);
``-Dkey=value`` overrides one field.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from dataclasses import asdict, fields

from aiohttp import web

from mooncake.mooncake_config import MooncakeConfig
from mooncake.store import MooncakeDistributedStore

logger = logging.getLogger(__name__)

# The longest /api/unmount_local_disk wait: a value given in milliseconds by
# mistake then fails with 400 instead of holding a preStop hook for hours.
MAX_LOCAL_DISK_GRACE_SECONDS = 3600
# Largest request body (a /api/put value travels in it).
MAX_REQUEST_BYTES = 100 * 1024 * 1024
# Pause between two store start attempts.
_RETRY_INTERVAL = 1.0

_CONFIG_FIELDS = {f.name for f in fields(MooncakeConfig)}


def _json(status: int, body: dict) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def _error(status: int, message: str, **extra) -> web.Response:
    return _json(status, {"error": message, **extra})


def _ok(**extra) -> web.Response:
    return _json(200, {"status": "success", **extra})


def _timed_handler(name: str, handler):
    """Logs how long each call of ``handler`` took."""

    async def timed(request):
        began = time.perf_counter()
        try:
            return await handler(request)
        finally:
            logger.info("%s operation completed in %.2f ms", name, (time.perf_counter() - began) * 1000)

    return timed


def _shm_name_to_path(name):
    """``/dev/shm/<name>`` for a POSIX shared-memory name (one leading ``/``
    allowed), or ``None`` for anything that is not a plain file name."""
    if not isinstance(name, str):
        return None
    base = name[1:] if name.startswith("/") else name
    if base in ("", ".", "..") or "/" in base:
        return None
    return "/dev/shm/" + base


def _segment_ids(data: dict):
    """The ``segment_ids`` of a body as a list (one id may come as a string)."""
    ids = data.get("segment_ids", [])
    return [ids] if isinstance(ids, str) else ids


def _bad_grace(value) -> bool:
    return type(value) is not int or value < 0


def _unblock_shutdown_signals():
    """Lets SIGINT and SIGTERM reach this thread (a parent may have blocked them)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _install_shutdown_signal_handlers(loop, shutdown_event):
    """SIGINT and SIGTERM set ``shutdown_event`` (the service then closes its store)."""

    def on_signal(signum):
        logger.info("Received signal %s, shutting down", signum)
        shutdown_event.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError):
            # No loop signal support here: a plain handler hands over to the loop.
            signal.signal(sig, lambda signum, _frame: loop.call_soon_threadsafe(on_signal, signum))


def _config_with(config: MooncakeConfig, overrides: dict) -> MooncakeConfig:
    """``config`` with ``overrides`` (strings from ``-D``) parsed and checked
    as a config file's fields are."""
    unknown = sorted(set(overrides) - _CONFIG_FIELDS)
    if unknown:
        raise ValueError(f"Unknown config field(s) {unknown}; known: {sorted(_CONFIG_FIELDS)}")
    return MooncakeConfig.from_dict({**asdict(config), **overrides})


class MooncakeStoreService:
    """A store client holding a segment, served over REST.

    ``current_mode`` is ``"prefill"`` (only the startup segment) or
    ``"decode"`` (``/api/reconfigure`` mounted ``mounted_segment_ids`` from a
    file or shared memory; ``last_mount_info`` says what).
    """

    def __init__(self, config_path: str | None = None, cli_config: dict | None = None):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
        self.store = None
        self.current_mode = "prefill"
        self.mounted_segment_ids: list = []
        self.last_mount_info: dict = {}
        # Reconfigure, mount and unmount change the state above one at a time.
        self._state_lock = asyncio.Lock()
        self._runner = None
        try:
            config = MooncakeConfig.from_file(config_path) if config_path else MooncakeConfig.load_from_env()
            self.config = _config_with(config, cli_config) if cli_config else config
        except Exception as e:
            logger.error("Configuration load failed: %s", e)
            raise
        logger.info("Mooncake configuration loaded")

    def _setup_config(self) -> dict:
        c = self.config
        return {
            "local_hostname": c.local_hostname,
            "metadata_server": c.metadata_server,
            "global_segment_size": c.global_segment_size,
            "local_buffer_size": c.local_buffer_size,
            "protocol": c.protocol,
            "rdma_devices": c.device_name,
            "master_server_addr": c.master_server_address,
            "enable_ssd_offload": getattr(c, "enable_ssd_offload", False),
            "ssd_offload_path": getattr(c, "ssd_offload_path", ""),
            "tenant_id": getattr(c, "tenant_id", "default"),
            "enable_client_http_server": getattr(c, "enable_client_http_server", False),
            "client_http_port": getattr(c, "client_http_port", 9300),
        }

    async def start_store_service(self, max_wait_time: float = 60, shutdown_event=None) -> bool:
        """Sets the store up, retrying every second (the master may not be
        up yet) for at most ``max_wait_time`` seconds. False when that time
        ran out or ``shutdown_event`` was set first."""

        def stopping() -> bool:
            if shutdown_event is not None and shutdown_event.is_set():
                logger.info("Store startup cancelled by shutdown request")
                return True
            return False

        began = time.perf_counter()
        attempt = 0
        if shutdown_event is not None:
            # A signal that arrived just before this call is handled first.
            await asyncio.sleep(0)
        while not stopping():
            elapsed = time.perf_counter() - began
            if elapsed >= max_wait_time:
                logger.error("Store startup failed: no success in %ss (%d attempts)", max_wait_time, attempt)
                return False
            attempt += 1
            logger.info("Attempting to start store service (attempt %d, elapsed: %.1fs/%ss)", attempt, elapsed, max_wait_time)
            try:
                self.store = MooncakeDistributedStore()
                ret = self.store.setup(self._setup_config())
                if shutdown_event is not None:
                    # setup() blocked the loop: a signal it delayed counts now.
                    await asyncio.sleep(0)
                    if stopping():
                        await self.stop()
                        return False
                if ret != 0:
                    raise RuntimeError(f"Store initialization failed, ret={ret}")
                logger.info("Store service started successfully on %s", self.config.local_hostname)
                return True
            except Exception as e:
                self.store = None
                left = max_wait_time - (time.perf_counter() - began)
                pause = max(0.0, min(_RETRY_INTERVAL, left))
                logger.warning("Store startup failed (attempt %d): %s. Retrying in %.1fs (%.1fs left)", attempt, e, pause, left)
                if pause <= 0:
                    continue
                if shutdown_event is None:
                    await asyncio.sleep(pause)
                    continue
                try:
                    await asyncio.wait_for(shutdown_event.wait(), timeout=pause)
                except asyncio.TimeoutError:
                    pass
        return False

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        routes = [
            (web.post, "/api/reconfigure", "RECONFIGURE", self.handle_reconfigure),
            (web.post, "/api/mount_shm", "MOUNT_SHM", self.handle_mount_shm),
            (web.post, "/api/unmount_shm", "UNMOUNT_SHM", self.handle_unmount_shm),
            (web.post, "/api/mount", "MOUNT", self.handle_mount),
            (web.post, "/api/unmount", "UNMOUNT", self.handle_unmount),
            (web.post, "/api/unmount_local_disk", "UNMOUNT_LOCAL_DISK", self.handle_unmount_local_disk),
            (web.put, "/api/put", "PUT", self.handle_put),
            (web.get, "/api/get/{key}", "GET", self.handle_get),
            (web.get, "/api/exist/{key}", "EXIST", self.handle_exist),
            (web.delete, "/api/remove/{key}", "REMOVE", self.handle_remove),
            (web.delete, "/api/remove_all", "REMOVE_ALL", self.handle_remove_all),
        ]
        app.add_routes([method(path, _timed_handler(name, h)) for method, path, name, h in routes])
        return app

    async def start_http_service(self, port: int = 8080, host: str = "0.0.0.0") -> bool:
        self._runner = web.AppRunner(self.make_app())
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        logger.info("REST API started on %s:%d", host, port)
        return True

    def _store_call(self, name: str):
        """The store's method ``name``; NotImplementedError where this
        build's binding lacks it (answered 501)."""
        call = getattr(self.store, name, None)
        if call is None:
            raise NotImplementedError(f"this store has no {name}()")
        return call

    # --- segments -------------------------------------------------------

    async def handle_reconfigure(self, request):
        """``{"mode": "decode", "path", "size", ["offset", "protocol",
        "location"]}`` mounts a file as the serving segments, replacing those
        of an earlier decode mount only once the new one is up;
        ``{"mode": "prefill"}`` unmounts them."""
        try:
            data = await request.json()
            mode = str(data.get("mode", "")).lower()
            if mode == "decode":
                return await self._reconfigure_decode(data)
            if mode == "prefill":
                return await self._reconfigure_prefill()
            return _error(400, "Invalid mode. Use 'decode' or 'prefill'")
        except NotImplementedError as e:
            return _error(501, str(e))
        except Exception as e:
            logger.error("RECONFIGURE error: %s", e)
            return _error(500, str(e))

    async def _reconfigure_decode(self, data):
        path, size = data.get("path"), data.get("size")
        if not path or size is None:
            return _error(400, "Missing path or size for decode mode")
        info = {
            "path": path,
            "offset": data.get("offset", 0),
            "size": size,
            "protocol": data.get("protocol", self.config.protocol),
            "location": data.get("location", ""),
        }
        async with self._state_lock:
            mount = self._store_call("mount_segment")
            unmount = self._store_call("unmount_segment")
            previous = list(self.mounted_segment_ids)
            result = mount(info["path"], info["size"], info["offset"], info["protocol"], info["location"])
            ret = result["ret"]
            if ret != 0:
                if previous:
                    # The segments mounted before still serve: keep them.
                    logger.warning("Reconfigure decode: mount of %s failed (ret=%s); keeping previous decode segments", path, ret)
                    return _error(500, f"Mount failed, ret={ret}; keeping previous decode segments", mode=self.current_mode)
                self.current_mode = "prefill"
                self.mounted_segment_ids.clear()
                self.last_mount_info.clear()
                return _error(500, f"Mount failed, ret={ret}; rolled back to prefill", mode=self.current_mode)
            # One id at a time: a batch answers only its first error, and an
            # id that failed to unmount must stay tracked for a later retry.
            stuck = [sid for sid in previous if unmount([sid]) != 0]
            if stuck:
                logger.warning("Reconfigure decode: the new mount serves but unmounting %s failed; they stay tracked", stuck)
            self.mounted_segment_ids = list(result["segment_ids"]) + stuck
            self.current_mode = "decode"
            self.last_mount_info = info
            return _ok(mode=self.current_mode, segment_ids=self.mounted_segment_ids)

    async def _reconfigure_prefill(self):
        async with self._state_lock:
            if self.mounted_segment_ids:
                ret = self._store_call("unmount_segment")(self.mounted_segment_ids)
                if ret != 0:
                    return _error(500, f"Unmount failed, ret={ret}")
                self.mounted_segment_ids.clear()
            self.current_mode = "prefill"
            self.last_mount_info.clear()
        return _ok(mode=self.current_mode)

    async def handle_mount_shm(self, request):
        """Mounts ``/dev/shm/<name>`` (``size`` bytes from ``offset``) as segments."""
        try:
            data = await request.json()
            path, size = _shm_name_to_path(data.get("name")), data.get("size")
            if not path or size is None:
                return _error(400, "Missing or invalid name or size")
            result = self._store_call("mount_segment")(
                path, size, data.get("offset", 0), data.get("protocol", self.config.protocol), data.get("location", "")
            )
            if result["ret"] != 0:
                return _error(500, f"Mount failed, ret={result['ret']}")
            return _ok(segment_ids=list(result["segment_ids"]))
        except NotImplementedError as e:
            return _error(501, str(e))
        except Exception as e:
            logger.error("MOUNT_SHM error: %s", e)
            return _error(500, str(e))

    async def handle_unmount_shm(self, request):
        """Unmounts each of ``segment_ids`` (after ``grace_period_seconds``);
        says which failed."""
        try:
            data = await request.json()
            ids = _segment_ids(data)
            if not ids:
                return _error(400, "Missing segment_ids")
            grace = data.get("grace_period_seconds", 0)
            if _bad_grace(grace):
                return _error(400, "Invalid grace_period_seconds, must be a non-negative integer")
            failed = []
            async with self._state_lock:
                unmount = self._store_call("unmount_segment")
                for sid in ids:
                    if unmount([sid], grace) != 0:
                        failed.append(sid)
                    elif sid in self.mounted_segment_ids:
                        self.mounted_segment_ids.remove(sid)
                if not self.mounted_segment_ids:
                    self.current_mode = "prefill"
            if failed:
                return _error(500, "Unmount failed for one or more segments", failed_segment_ids=failed)
            return _ok()
        except NotImplementedError as e:
            return _error(501, str(e))
        except Exception as e:
            logger.error("UNMOUNT_SHM error: %s", e)
            return _error(500, str(e))

    async def handle_mount(self, request):
        """Allocates ``size`` bytes in this process and mounts them as segments."""
        try:
            data = await request.json()
            size = data.get("size")
            if type(size) is not int or size <= 0:
                return _error(400, "Invalid size, must be a positive integer")
            result = self._store_call("allocate_and_mount_segment")(
                size, data.get("protocol", self.config.protocol), data.get("location", "")
            )
            if result["ret"] != 0:
                return _error(500, f"Allocate and mount failed, ret={result['ret']}")
            return _ok(segment_ids=list(result["segment_ids"]), allocated_size=result["allocated_size"])
        except NotImplementedError as e:
            return _error(501, str(e))
        except Exception as e:
            logger.error("MOUNT error: %s", e)
            return _error(500, str(e))

    async def handle_unmount(self, request):
        """Unmounts segments ``/api/mount`` allocated and frees their memory."""
        try:
            data = await request.json()
            ids = _segment_ids(data)
            if not ids:
                return _error(400, "Missing segment_ids")
            grace = data.get("grace_period_seconds", 0)
            if _bad_grace(grace):
                return _error(400, "Invalid grace_period_seconds, must be a non-negative integer")
            ret = self._store_call("unmount_and_free_segment")(ids, grace)
            if ret != 0:
                return _error(500, f"Unmount and free failed, ret={ret}")
            return _ok()
        except NotImplementedError as e:
            return _error(501, str(e))
        except Exception as e:
            logger.error("UNMOUNT error: %s", e)
            return _error(500, str(e))

    async def handle_unmount_local_disk(self, request):
        """Withdraws this store's SSD tier from the master before it exits (a
        preStop hook), then waits ``grace_period_seconds`` for the reads
        already handed out to finish. The wait runs off the event loop."""
        try:
            data = await request.json()
        except Exception:
            return _error(400, "Malformed JSON body")
        if not isinstance(data, dict):
            return _error(400, "Request body must be a JSON object")
        grace = data.get("grace_period_seconds", 0)
        if _bad_grace(grace) or grace > MAX_LOCAL_DISK_GRACE_SECONDS:
            return _error(
                400,
                f"Invalid grace_period_seconds, must be a non-negative integer no greater than {MAX_LOCAL_DISK_GRACE_SECONDS}",
            )
        try:
            ret = await asyncio.to_thread(self._store_call("unmount_local_disk_segment"), grace)
            if ret != 0:
                return _error(500, f"Unmount local disk failed, ret={ret}")
            return _ok()
        except NotImplementedError as e:
            return _error(501, str(e))
        except Exception as e:
            logger.error("UNMOUNT_LOCAL_DISK error: %s", e)
            return _error(500, str(e))

    # --- data -----------------------------------------------------------

    async def handle_put(self, request):
        """``{"key": K, "value": text}``: stores the text's UTF-8 bytes."""
        try:
            data = await request.json()
            key, value = data.get("key"), data.get("value")
            if not key or value is None:
                return _error(400, "Missing key or value")
            if not isinstance(key, str) or not isinstance(value, str):
                return _error(400, "key and value must be strings")
            if self.store.put(key, value.encode()) != 0:
                return _error(500, "PUT operation failed")
            return _ok()
        except Exception as e:
            logger.error("PUT error: %s", e)
            return _error(500, str(e))

    async def handle_get(self, request):
        """The value's bytes (``application/octet-stream``); 404 when absent."""
        try:
            key = request.match_info["key"]
            missing = self._exist_error(self.store.is_exist(key))
            if missing:
                return missing
            value = self.store.get(key)
            if value is None:
                return _error(500, "GET operation failed")
            if value == b"":
                # get() answers b"" for a missing key too: removed meanwhile?
                missing = self._exist_error(self.store.is_exist(key))
                if missing:
                    return missing
            return web.Response(status=200, body=value, content_type="application/octet-stream")
        except Exception as e:
            logger.error("GET error: %s", e)
            return _error(500, str(e))

    @staticmethod
    def _exist_error(exists):
        if exists == 0:
            return _error(404, "Key not found")
        if exists < 0:
            return _error(500, "Exist check failed")
        return None

    async def handle_exist(self, request):
        try:
            exists = self.store.is_exist(request.match_info["key"])
            if exists < 0:
                return _error(500, "Exist check failed")
            return _json(200, {"exists": exists > 0})
        except Exception as e:
            logger.error("EXIST error: %s", e)
            return _error(500, str(e))

    async def handle_remove(self, request):
        try:
            if self.store.remove(request.match_info["key"]) != 0:
                return _error(500, "Remove operation failed")
            return _ok()
        except Exception as e:
            logger.error("REMOVE error: %s", e)
            return _error(500, str(e))

    async def handle_remove_all(self, request):
        try:
            removed = self.store.remove_all()
            if removed < 0:
                return _error(500, "RemoveAll operation failed")
            return _json(200, {"status": f"success removed {removed} keys"})
        except Exception as e:
            logger.error("REMOVE_ALL error: %s", e)
            return _error(500, str(e))

    async def stop(self):
        """Stops serving and closes the store (its segment leaves the cluster)."""
        runner, self._runner = getattr(self, "_runner", None), None
        if runner is not None:
            await runner.cleanup()
        if self.store is None:
            return
        store, self.store = self.store, None
        ret = store.close()
        if ret != 0:
            logger.warning("Mooncake service close returned %s", ret)
        else:
            logger.info("Mooncake service stopped")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description="Mooncake Store Service with REST API")
    parser.add_argument("--config", type=str, help="Path to a Mooncake config file (JSON); default: the environment")
    parser.add_argument(
        "-D", "--define", action="append", default=[],
        help="Override one config field, e.g. -Dlocal_hostname=example.com (repeatable)",
    )
    parser.add_argument("--port", type=int, default=8080, help="HTTP API port (default: 8080)")
    parser.add_argument("--host", type=str, default="0.0.0.0", help="HTTP API address (default: 0.0.0.0)")
    parser.add_argument(
        "--max-wait-time", type=float, default=60,
        help="How long to keep retrying the store's setup, in seconds (default: 60)",
    )
    args = parser.parse_args(argv)
    for item in args.define:
        if "=" not in item:
            parser.error(f"-D {item!r}: expected key=value")
    return args


async def main():
    args = parse_arguments()
    cli_config = dict(item.split("=", 1) for item in args.define)
    service = MooncakeStoreService(args.config, cli_config)
    shutdown_event = asyncio.Event()
    _install_shutdown_signal_handlers(asyncio.get_running_loop(), shutdown_event)
    _unblock_shutdown_signals()
    try:
        started = await service.start_store_service(max_wait_time=args.max_wait_time, shutdown_event=shutdown_event)
        if not started:
            if shutdown_event.is_set():
                return
            raise RuntimeError("Failed to start store service")
        if shutdown_event.is_set():
            return
        await service.start_http_service(args.port, getattr(args, "host", "0.0.0.0"))
        logger.info("Mooncake Store Service is running")
        await shutdown_event.wait()
    finally:
        await service.stop()


def sync_main():
    """The ``mc_store_rest_server`` program."""
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except (RuntimeError, ValueError, OSError) as e:
        logger.error("Service error: %s", e)
        sys.exit(1)


if __name__ == "__main__":
    sync_main()
