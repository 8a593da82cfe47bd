"""Probe `mooncake.engine.TransferEngine` return values with normal and bad input.

Two engines in one interpreter ("a" initiates, "b" is the target) share the
HTTP metadata server embedded in a fresh `mooncake_master`; a third group uses
P2PHANDSHAKE. Crashes are recorded and skipped as in probe_store.py. Usage:

    /work/refvenv/bin/python benchmarks/reference_probe/probe_engine.py --out ref_engine.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import mcproc  # noqa: E402
from probe_lib import Prober, dump, run_groups  # noqa: E402

GROUPS = ["engine", "engine_p2p", "engine_crashy"]


class Servers:
    def __init__(self, system: mcproc.System, workdir: Path):
        self.master = mcproc.start_master(system, workdir / "m1")

    def stop(self) -> None:
        self.master.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--groups", default=",".join(GROUPS))
    ap.add_argument("--child")
    ap.add_argument("--jsonl")
    ap.add_argument("--skip", default="")
    ap.add_argument("--meta")
    args = ap.parse_args()
    if args.child:
        skip = {int(x) for x in args.skip.split(",") if x}
        probe(args.child, Prober(args.child, {}, Path(args.jsonl), skip), args.meta)
        return 0
    system = mcproc.System("self", Path(sys.executable).parent)
    work = Path(tempfile.mkdtemp(prefix="probe_engine_"))

    def child_argv(group: str, jsonl: Path, skip: set[int], srv: Servers) -> list[str]:
        return [sys.executable, __file__, "--child", group, "--jsonl", str(jsonl),
                "--skip", ",".join(map(str, sorted(skip))), "--meta", srv.master.metadata_server]

    dump(run_groups(args.groups.split(","), child_argv, lambda group: Servers(system, work), work), args.out)
    return 0


def probe(group: str, p: Prober, meta: str) -> None:
    import ctypes
    import urllib.parse

    import mooncake.engine as me

    p.ns.update({"me": me, "ctypes": ctypes, "META": meta, "TransferEngine": me.TransferEngine,
                 "quote": urllib.parse.quote, "http_get": mcproc.http_get})
    if group == "engine":
        p.run("[x for x in dir(me) if not x.startswith('_')]")
        p.run("(me.TransferOpcode.Read, me.TransferOpcode.Write, int(me.TransferOpcode.Read), int(me.TransferOpcode.Write))")
        p.run("(me.TransferEngine.TransferOpcode.Read, me.TransferOpcode.__members__)")
        p.run("(n.name, n.msg)", pre="n = me.TransferNotify('peer', 'hello')")
        p.run("(me.TransferNotify().name, me.TransferNotify().msg)")
        p.run("a.initialize('127.0.0.1:16001', META, 'tcp', '')", pre="a = TransferEngine()")
        p.run("a.get_rpc_port()")
        p.run("a.initialize('127.0.0.1:16001', META, 'tcp', '')", note="initialize twice")
        p.run("b.initialize('127.0.0.1:16002', META, 'tcp', 'mlx5_0')", pre="b = TransferEngine()",
              note="device name with tcp is ignored")
        p.run("b.get_rpc_port() != a.get_rpc_port()")
        p.run("http_get(META + '?key=' + quote('mooncake/rpc_meta/127.0.0.1:16002', safe=''))")
        p.run("http_get(META + '?key=' + quote('mooncake/ram/127.0.0.1:16002', safe=''))",
              note="before any buffer is registered")
        p.run("b.get_first_buffer_address('127.0.0.1:16002')", note="no buffer registered yet")
        p.run("ba != 0", pre="ba = a.allocate_managed_buffer(1 << 20)")
        p.run("bb != 0", pre="bb = b.allocate_managed_buffer(1 << 20)")
        p.run("a.allocate_managed_buffer(0)")
        p.run("a.allocate_managed_buffer(1 << 45)", note="32 TiB")
        p.run("fb == bb", pre="fb = a.get_first_buffer_address('127.0.0.1:16002')",
              note="first buffer address of b, seen from a, vs b's managed buffer")
        p.run("fb != 0")
        p.run("http_get(META + '?key=' + quote('mooncake/ram/127.0.0.1:16002', safe=''))",
              note="segment descriptor after allocate_managed_buffer")
        p.run("a.get_first_buffer_address('nosuch:1')", note="unknown segment")
        p.run("a.write_bytes_to_buffer(ba, b'hello world', 11)")
        p.run("a.write_bytes_to_buffer(ba, b'hi', 100)", note="length larger than the data")
        p.run("a.read_bytes_from_buffer(ba, 11)")
        p.run("a.read_bytes_from_buffer(ba, 0)")
        p.run("a.transfer_sync_write('127.0.0.1:16002', ba, bb, 11)")
        p.run("b.read_bytes_from_buffer(bb, 11)")
        p.run("a.transfer_sync_read('127.0.0.1:16002', ba + 4096, bb, 11)")
        p.run("a.read_bytes_from_buffer(ba + 4096, 11)")
        p.run("a.transfer_sync_write('127.0.0.1:16002', ba, fb, 11)", note="to b's first buffer address")
        p.run("a.transfer_sync_write('127.0.0.1:16002', ba, 4096, 11)", note="remote address not registered")
        p.run("a.transfer_sync_read('127.0.0.1:16002', ba, 4096, 11)", note="remote address not registered")
        p.run("a.transfer_sync_write('127.0.0.1:16002', ba, bb + (1 << 20) - 4, 11)",
              note="remote range runs past the buffer end")
        p.run("a.transfer_sync_write('127.0.0.1:16002', ba, bb, 0)", note="length 0")
        p.run("a.transfer_sync_write('127.0.0.1:16002', ba, bb, -1)", note="negative length")
        p.run("a.transfer_sync_write('nosuch:1', ba, bb, 11)", note="unknown target")
        p.run("a.transfer_sync_write('127.0.0.1:16002', ubufp, bb, 11)",
              pre="ubuf = (ctypes.c_char * 4096)(); ubufp = ctypes.addressof(ubuf); ctypes.memset(ubufp, 0x55, 4096)",
              note="local buffer not registered")
        p.run("b.read_bytes_from_buffer(bb, 4)")
        p.run("a.transfer_sync('127.0.0.1:16002', ba, bb, 11, me.TransferOpcode.Write)")
        p.run("a.transfer_sync('127.0.0.1:16002', ba, bb, 11, me.TransferOpcode.Write, me.TransferNotify('n1', 'm1'))",
              note="with notify")
        p.run("[(x.name, x.msg) for x in b.get_notifies()]")
        p.run("b.get_notifies()", note="second call")
        p.run("bid", pre="import time; bid = a.transfer_submit_write('127.0.0.1:16002', ba, bb, 11)")
        p.run("[a.transfer_check_status(bid) for _ in range(1)]")
        p.run("time.sleep(0.2) or a.transfer_check_status(bid)")
        p.run("a.transfer_check_status(bid)", note="after done, again")
        p.run("bid2", pre="bid2 = a.transfer_submit_write('127.0.0.1:16002', ba, 4096, 11)", note="bad remote address")
        p.run("time.sleep(0.5) or a.transfer_check_status(bid2)")
        p.run("a.transfer_submit_write('nosuch:1', ba, bb, 11)", note="unknown target")
        p.run("a.batch_transfer_sync_write('127.0.0.1:16002', [ba, ba + 100], [bb, bb + 100], [10, 20])")
        p.run("a.batch_transfer_sync_read('127.0.0.1:16002', [ba, ba + 100], [bb, bb + 100], [10, 20])")
        p.run("a.batch_transfer_sync_write('127.0.0.1:16002', [ba], [bb, bb + 100], [10, 20])", note="mismatched lengths")
        p.run("a.batch_transfer_sync_write('127.0.0.1:16002', [], [], [])")
        p.run("a.batch_transfer_sync_write('127.0.0.1:16002', [ba, ba], [bb, 4096], [10, 10])",
              note="one bad remote address")
        p.run("abid != 0", pre="abid = a.batch_transfer_async_write('127.0.0.1:16002', [ba], [bb], [10])")
        p.run("time.sleep(0.2) or a.get_batch_transfer_status([abid])")
        p.run("a.batch_transfer_async_read('127.0.0.1:16002', [ba], [bb], [10]) != 0")
        p.run("a.batch_transfer_async_write('nosuch:1', [ba], [bb], [10])", note="unknown target")
        p.run("a.batch_transfer_async_write('127.0.0.1:16002', [ba], [4096], [10])", note="bad remote address")
        p.run("a.get_batch_transfer_status([])")
        p.run("a.get_batch_transfer_status([abid])", note="after the batch completed, again")
        p.run("a.get_batch_transfer_status([123456])", note="unknown batch id")
        p.run("a.register_memory(rp, 65536)", pre="rbuf = (ctypes.c_char * 65536)(); rp = ctypes.addressof(rbuf)")
        p.run("a.register_memory(rp, 65536)", note="twice")
        p.run("a.unregister_memory(rp)")
        p.run("a.unregister_memory(rp)", note="twice")
        p.run("a.unregister_memory(12345)", note="never registered")
        p.run("a.register_memory(rp, 0)", note="size 0")
        p.run("a.register_memory(0, 4096)", note="null pointer")
        p.run("a.batch_register_memory([rp, rp + 4096], [4096, 4096])")
        p.run("a.batch_unregister_memory([rp, rp + 4096])")
        p.run("a.batch_register_memory([rp], [4096, 4096])", note="mismatched lengths")
        p.run("a.free_managed_buffer(ba, 1 << 20)")
        p.run("a.free_managed_buffer(12345, 10)", note="never allocated")
        p.run("len(a.get_local_topology()) > 0 and a.get_local_topology()[:200]")
        p.run("a.get_engine_ptr() != 0")
        p.run("a.send_probe('127.0.0.1:16002')")
        p.run("a.send_probe('nosuch:1')")
    if group == "engine_p2p":
        p.run("a.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '')", pre="a = TransferEngine()")
        p.run("a.get_rpc_port()")
        p.run("b.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '')", pre="b = TransferEngine()")
        p.run("bname", pre="bname = f'127.0.0.1:{b.get_rpc_port()}'", note="P2P segment name is host:rpc_port")
        p.run("ba != 0 and bb != 0", pre="ba = a.allocate_managed_buffer(1 << 20); bb = b.allocate_managed_buffer(1 << 20)")
        p.run("a.get_first_buffer_address(bname) != 0")
        p.run("a.write_bytes_to_buffer(ba, b'p2p!', 4)")
        p.run("a.transfer_sync_write(bname, ba, bb, 4)")
        p.run("b.read_bytes_from_buffer(bb, 4)")
        p.run("a.transfer_sync_write('127.0.0.1', ba, bb, 4)", note="target name without port")
        p.run("a.transfer_sync_write('127.0.0.1:1', ba, bb, 4)", note="nobody listening")
    if group == "engine_crashy":
        init = ("a = TransferEngine(); a.initialize('127.0.0.1:16011', META, 'tcp', ''); "
                "ba = a.allocate_managed_buffer(1 << 20)")
        p.run("TransferEngine().get_rpc_port()", note="before initialize")
        p.run("TransferEngine().allocate_managed_buffer(4096)", note="before initialize")
        p.run("TransferEngine().transfer_sync_write('x:1', 0, 0, 1)", note="before initialize")
        p.run("TransferEngine().initialize('127.0.0.1', 'http://127.0.0.1:1/metadata', 'tcp', '')",
              note="metadata server unreachable")
        p.run("TransferEngine().initialize('127.0.0.1', META, 'bogus', '')", note="unknown protocol")
        p.run("TransferEngine().initialize('127.0.0.1', META, 'rdma', '')", note="rdma on a host without RDMA")
        p.run("a.transfer_sync_write('127.0.0.1:16011', 0, ba, 8)", pre=init, note="local pointer 0")
        p.run("a.write_bytes_to_buffer(16, b'x', 1)", pre=init, note="write to address 16")
        p.run("a.read_bytes_from_buffer(16, 1)", pre=init, note="read from address 16")
        p.run("a.transfer_check_status(987654321)", pre=init, note="unknown batch id")


if __name__ == "__main__":
    sys.exit(main())
