#!/usr/bin/env python3
"""Runs the reference's own Python acceptance tests against an installed
``mooncake`` package and tabulates every case.

    run_reference_tests.py run --source <Mooncake checkout> --venv <venv> --out <dir> [--only NAME ...]
    run_reference_tests.py compare <reference results dir> <our results dir>

``--source`` is a checkout of kvcache-ai/Mooncake (its ``mooncake-wheel/tests``
and ``scripts/test_*.py`` are read from there at run time; none is copied into
this repository). ``--venv`` is a venv with the package under test, torch and
safetensors installed; its ``bin/`` provides ``mooncake_master`` and
``mooncake_http_metadata_server``. Each file runs as the reference's CI runs it
(``python <file> [args]`` with the same master flags and environment) with two
differences: every file gets fresh servers, and the ports come from
``--port-base`` instead of 8080/50051/9003 so that runs do not collide.
``compare`` prints the side-by-side table kept in docs/reference-behaviour.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (path in the checkout, args, servers, timeout in seconds)
SUITES = {
    "test_import_structure.py": ("mooncake-wheel/tests/test_import_structure.py", [], None, 120),
    "test_mooncake_config.py": ("mooncake-wheel/tests/test_mooncake_config.py", [], None, 120),
    "test_http_metadata_server.py": ("mooncake-wheel/tests/test_http_metadata_server.py", [], None, 120),
    "test_cli.py": ("mooncake-wheel/tests/test_cli.py", [], None, 120),
    "test_put_get_tensor.py": ("mooncake-wheel/tests/test_put_get_tensor.py", [], "wheel", 600),
    "test_safetensor_functions.py": ("mooncake-wheel/tests/test_safetensor_functions.py", [], "wheel", 600),
    "test_batch_replica_clear.py": ("mooncake-wheel/tests/test_batch_replica_clear.py", [], "wheel", 600),
    "test_meta_server.py": ("mooncake-wheel/tests/test_meta_server.py", ["127.0.0.1", "2"], "wheel", 300),
    "test_tensor_api.py": ("scripts/test_tensor_api.py", ["-n", "1"], "scripts", 2400),
    "test_async_store.py": ("scripts/test_async_store.py", [], "scripts", 900),
    "test_copy_move_api.py": ("scripts/test_copy_move_api.py", [], "scripts", 900),
    "test_upsert_api.py": ("scripts/test_upsert_api.py", [], "scripts", 900),
    "test_drain_http_api.py": ("scripts/test_drain_http_api.py", ["--timeout-sec", "90"], "scripts", 600),
    # Not run by the reference's CI (it needs a master at the address below).
    "test_buffer_pool_native.py": ("mooncake-wheel/tests/test_buffer_pool_native.py", [], "wheel", 300),
    "test_distributed_object_store.py": ("mooncake-wheel/tests/test_distributed_object_store.py", [], "wheel", 900),
    "test_replicated_distributed_object_store.py": (
        "mooncake-wheel/tests/test_replicated_distributed_object_store.py", [], "wheel", 900),
    "test_fast_copy.py": ("mooncake-wheel/tests/test_fast_copy.py", [], None, 120),
    "test_structured_object_store.py": (
        "mooncake-wheel/tests/test_structured_object_store.py", [], "wheel", 900),
    "session_ranges_tcp_e2e.py": ("mooncake-store/tests/e2e/session_ranges_tcp_e2e.py", [], "scripts", 300),
    "test_engram_store.py": ("scripts/test_engram_store.py", [], "scripts", 300),
    "test_dummy_client.py": ("mooncake-wheel/tests/test_dummy_client.py", [], "wheel_client", 900),
    "test_multi_dummy_clients.py": ("mooncake-wheel/tests/test_multi_dummy_clients.py", [], "wheel_client", 300),
    "test_ssd_offload_in_evict.py": ("mooncake-wheel/tests/test_ssd_offload_in_evict.py", [], "wheel", 900),
    "test_offload_on_eviction.py": ("mooncake-wheel/tests/test_offload_on_eviction.py", [], "wheel", 600),
    "test_promotion_on_hit.py": ("mooncake-wheel/tests/test_promotion_on_hit.py", [], "wheel", 900),
    # Drives the store service's handlers over a stand-in store (no servers).
    "test_mooncake_store_service_api.py": (
        "mooncake-wheel/tests/test_mooncake_store_service_api.py", [], None, 300),
}

# Files the reference runs with pytest (no main of their own): a one-line
# main beside the copy runs them through ``pytest.main``.
PYTEST_FILES = {"test_structured_object_store.py"}
# Files that name the master's address in their code instead of reading the
# environment: the copy that runs names the master started for it instead.
MASTER_LITERALS = {"test_buffer_pool_native.py": "127.0.0.1:50051"}
# Extra master flags and client environment of the files run_tests.sh runs
# over a master of their own ({fsdir}: a fresh directory for the file).
MASTER_FLAGS = {
    "test_ssd_offload_in_evict.py": ["--root_fs_dir={fsdir}"],
    "test_offload_on_eviction.py": ["--root_fs_dir={fsdir}", "--enable_offload=true",
                                    "--offload_on_evict=true"],
    "test_promotion_on_hit.py": ["--root_fs_dir={fsdir}", "--enable_offload=true",
                                 "--offload_on_evict=true", "--promotion_on_hit=true",
                                 "--promotion_admission_threshold=1"],
}
CLIENT_ENV = {
    "test_offload_on_eviction.py": {"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": "{fsdir}"},
    "test_promotion_on_hit.py": {"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": "{fsdir}",
                                 "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": "10",
                                 "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES": "10485760"},
}
# The `mooncake_client` address a file names in code (run_tests.sh starts the
# client on its default port).
CLIENT_LITERALS = {"test_dummy_client.py": "127.0.0.1:50052",
                   "test_multi_dummy_clients.py": "127.0.0.1:50052"}
# Files run_tests.sh runs as several processes at once, one per argument list
# (each process's cases are recorded under its first argument's value).
CONCURRENT = {"test_multi_dummy_clients.py": [["--client-id", "client1"], ["--client-id", "client2"]]}
# Files that import the build tree's `store` module (the extension a CMake
# build leaves in build/mooncake-integration): a one-line module standing for
# it re-exports the installed package's `mooncake.store`.
STORE_SHIM = {"session_ranges_tcp_e2e.py", "test_engram_store.py"}
# Variables the wheel's tests would read differently from how the reference's
# CI runs them (run_tests.sh sets none of these for mooncake-wheel/tests).
SCRIPTS_ONLY_ENV = {"LOCAL_HOSTNAME"}


def wait_port(port: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Ends a process group this script started."""
    if proc.poll() is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class Servers:
    """The servers the reference's CI starts before a group of tests."""

    def __init__(self, kind: str, venv: Path, base: int, log: Path, extra: list[str] = ()):
        self.meta, self.rpc, self.metrics = base + 80, base + 51, base + 3
        self.client = base + 52
        self.procs: list[subprocess.Popen] = []
        self.log = open(log, "w")
        b = venv / "bin"
        if kind in ("wheel", "wheel_client"):
            # run_tests.sh: a standalone metadata server, then a master with a
            # short lease (and, for the dummy-client files, `mooncake_client`
            # with its defaults but the ports).
            self._start([b / "mooncake_http_metadata_server", "--port", str(self.meta)], self.meta)
            self._start([b / "mooncake_master", "--default_kv_lease_ttl=500", f"--port={self.rpc}",
                         f"--metrics_port={self.metrics}", *extra], self.rpc)
            if kind == "wheel_client":
                self._start([b / "mooncake_client", f"--master_server_address=127.0.0.1:{self.rpc}",
                             f"--metadata_server=http://127.0.0.1:{self.meta}/metadata",
                             f"--port={self.client}"], self.client)
        else:
            # ci.yml "Start Mooncake Master": the embedded metadata server.
            self._start([b / "mooncake_master", "--default_kv_lease_ttl=500",
                         "--eviction_high_watermark_ratio=0.95", "--cluster_id=ci_test_cluster",
                         "--port", str(self.rpc), "--enable_http_metadata_server=true",
                         f"--http_metadata_server_port={self.meta}", f"--metrics_port={self.metrics}"],
                        self.rpc, self.meta)

    def _start(self, argv, *ports):
        p = subprocess.Popen([str(a) for a in argv], stdout=self.log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append(p)
        for port in ports:
            if not wait_port(port, 15):
                raise RuntimeError(f"{argv[0]} did not listen on {port}")

    def env(self) -> dict:
        meta = f"http://127.0.0.1:{self.meta}/metadata"
        master = f"127.0.0.1:{self.rpc}"
        return {
            # mooncake-wheel/tests (run_tests.sh)
            "MC_METADATA_SERVER": meta, "METADATA_ADDR": meta, "MASTER_SERVER": master,
            "DEFAULT_KV_LEASE_TTL": "500",
            # scripts/test_*.py (ci.yml)
            "MOONCAKE_MASTER": master, "MOONCAKE_TE_META_DATA_SERVER": meta,
            "MOONCAKE_PROTOCOL": "tcp", "LOCAL_HOSTNAME": "127.0.0.1",
            "MOONCAKE_MASTER_CONTROL_BASE": f"http://127.0.0.1:{self.metrics}",
        }

    def close(self):
        for p in reversed(self.procs):
            stop(p)
        self.log.close()


def run_one(name: str, source: Path, venv: Path, out: Path, base: int) -> dict:
    rel, args, kind, timeout = SUITES[name]
    work = Path(tempfile.mkdtemp(prefix="mc-reftest-"))
    # The file is copied out of the checkout (as test_installation.sh does) so
    # that `sys.path` tricks in it cannot pick up the checkout's own sources.
    sub = work / Path(rel).parent.name
    sub.mkdir()
    shutil.copy(source / rel, sub / name)
    fsdir = work / "fs"
    fsdir.mkdir()
    extra = [f.format(fsdir=fsdir) for f in MASTER_FLAGS.get(name, [])]
    servers = Servers(kind, venv, base, out / f"{name}.servers.log", extra) if kind else None
    if name in STORE_SHIM:
        for d in (sub, work / "build" / "mooncake-integration"):
            d.mkdir(parents=True, exist_ok=True)
            (d / "store.py").write_text("from mooncake.store import *  # noqa: F401,F403\n")
    if name in MASTER_LITERALS and servers:
        text = (sub / name).read_text()
        (sub / name).write_text(text.replace(MASTER_LITERALS[name], f"127.0.0.1:{servers.rpc}"))
    if name in CLIENT_LITERALS and servers:
        text = (sub / name).read_text()
        (sub / name).write_text(text.replace(CLIENT_LITERALS[name], f"127.0.0.1:{servers.client}"))
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    env["PYTHONUNBUFFERED"] = "1"
    if servers:
        env.update(servers.env())
        if kind.startswith("wheel"):
            for k in SCRIPTS_ONLY_ENV:
                env.pop(k, None)
    env.update({k: v.format(fsdir=fsdir) for k, v in CLIENT_ENV.get(name, {}).items()})
    target = sub / name
    if name in PYTEST_FILES:
        target = sub / f"run_{name}"
        target.write_text("import sys\nimport pytest\n\n"
                          f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {name!r}]))\n")
    result_file = out / f"{name}.json"
    result_file.unlink(missing_ok=True)
    runs = [args + extra for extra in CONCURRENT.get(name, [[]])]
    parts = [out / f"{name}.{i}.json" for i in range(len(runs))] if len(runs) > 1 else [result_file]
    started = time.time()
    with open(out / f"{name}.log", "w") as log:
        procs = [subprocess.Popen([str(venv / "bin" / "python"), str(HERE / "reference_case_runner.py"),
                                   str(part), str(target), *argv],
                                  cwd=sub, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
                 for part, argv in zip(parts, runs)]
        deadline = started + timeout
        timed_out = False
        for p in procs:
            try:
                p.wait(max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
        for p in procs:
            stop(p)
    elapsed = time.time() - started
    if servers:
        servers.close()
    shutil.rmtree(work, ignore_errors=True)
    cases = []
    for part, argv, p in zip(parts, runs, procs):
        prefix = f"{argv[-1]}: " if len(runs) > 1 else ""
        if part.exists():
            got = json.loads(part.read_text())["cases"]
        else:
            got = [{"id": name, "outcome": "timeout" if timed_out else "crashed",
                    "message": f"no result (exit {p.returncode})"}]
        cases += [dict(c, id=prefix + c["id"]) for c in got]
        if part != result_file:
            part.unlink(missing_ok=True)
    if len(runs) == 1 and result_file.exists():
        res = json.loads(result_file.read_text())
    else:
        res = {"file": name, "exit_code": max(abs(p.returncode or 0) for p in procs), "cases": cases}
    res["seconds"] = round(elapsed, 1)
    res["timed_out"] = timed_out
    result_file.write_text(json.dumps(res, indent=1))
    return res


def cmd_run(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in a.only or list(SUITES):
        res = run_one(name, Path(a.source).resolve(), Path(a.venv).absolute(), out.resolve(), a.port_base)
        counts: dict = {}
        for c in res["cases"]:
            counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
        print(f"{name}: {counts} in {res['seconds']} s", flush=True)
    return 0


# Why a case does not pass on both: (file, case id prefix, note key). The
# notes themselves are in docs/reference-behaviour.md.
REASONS = [
    ("test_put_get_tensor.py", "TestDistributedObjectStore.test_cuda_", "cuda"),
    ("test_drain_http_api.py", "", "drain"),
    ("test_batch_replica_clear.py", "TestBatchReplicaClearSingleStore.", "name-reuse"),
    ("test_structured_object_store.py", "", "structured"),
    ("test_mooncake_store_service_api.py", "", "store-service-api"),
    ("test_promotion_on_hit.py", "BenchPromotionLatency.", "opt-in-benchmark"),
]


def reason_for(name: str, case: str) -> str:
    for f, prefix, why in REASONS:
        if f == name and case.startswith(prefix):
            return why
    return "?"


def load_cases(path: Path) -> dict:
    return {c["id"]: c for c in json.loads(path.read_text())["cases"]} if path.exists() else {}


def cmd_compare(a) -> int:
    ref_dir, our_dir = Path(a.reference), Path(a.ours)
    summary, differing, same = [], [], []
    for name in SUITES:
        ref, ours = load_cases(ref_dir / f"{name}.json"), load_cases(our_dir / f"{name}.json")
        if not ref and not ours:
            continue
        # A file that fails to import or run has no cases of its own: it is
        # shown with the other side's cases, marked as not run.
        broken = {side: "<import/run>" in cases and len(cases) <= 2 for side, cases in (("ref", ref), ("ours", ours))}
        skip = {"<import/run>", name, "<exit code>"}
        ids = [i for i in ref if not (broken["ref"] and i in skip)]
        ids += [i for i in ours if i not in ref and not (broken["ours"] and i in skip)]
        n = rp = op = 0
        passed_both = []
        for i in ids:
            r = ref.get(i, {}).get("outcome", "not run (import failed)" if broken["ref"] else "—")
            o = ours.get(i, {}).get("outcome", "not run (import failed)" if broken["ours"] else "—")
            n, rp, op = n + 1, rp + (r == "passed"), op + (o == "passed")
            if r == o == "passed":
                passed_both.append(i)
            else:
                differing.append((name, i, r, o, reason_for(name, i)))
        summary.append((name, n, rp, op))
        same.append((name, passed_both))
    print("| file | cases | reference passes | ours passes |")
    print("|---|---|---|---|")
    for name, n, rp, op in summary:
        print(f"| `{name}` | {n} | {rp} | {op} |")
    tn, trp, top = (sum(x[i] for x in summary) for i in (1, 2, 3))
    print(f"| all | {tn} | {trp} | {top} |")
    print("\nCases that do not pass on both:\n")
    print("| file | case | reference | ours | note |")
    print("|---|---|---|---|---|")
    for name, i, r, o, why in differing:
        print(f"| `{name}` | `{i}` | {r} | {o} | [{why}](#{why}) |")
    print("\nCases that pass on both:\n")
    for name, ids in same:
        if ids:
            print(f"- `{name}` ({len(ids)}): " + ", ".join(f"`{i}`" for i in ids))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = ap.add_subparsers(dest="cmd", required=True)
    r = sp.add_parser("run")
    r.add_argument("--source", required=True)
    r.add_argument("--venv", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--only", nargs="*")
    r.add_argument("--port-base", type=int, default=int(os.getenv("REFTEST_PORT_BASE", "28600")))
    c = sp.add_parser("compare")
    c.add_argument("reference")
    c.add_argument("ours")
    a = ap.parse_args()
    return cmd_run(a) if a.cmd == "run" else cmd_compare(a)


if __name__ == "__main__":
    sys.exit(main())
