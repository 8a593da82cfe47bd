"""A second process with a TransferEngine, driven over stdin/stdout (one JSON
object per line) by test_engine.py: it reports its segment name and buffer,
then runs the transfers it is told to and reports the results."""

import json
import sys

from mooncake.engine import TransferEngine, TransferOpcode

BUF = 1 << 20


def main():
    metadata = sys.argv[1]
    e = TransferEngine()
    local = "127.0.0.1" if metadata == "P2PHANDSHAKE" else f"127.0.0.1:{sys.argv[2]}"
    rc = e.initialize(local, metadata, "tcp", "")
    buf = e.allocate_managed_buffer(BUF) if rc == 0 else 0
    name = f"127.0.0.1:{e.get_rpc_port()}" if metadata == "P2PHANDSHAKE" else local
    print(json.dumps({"rc": rc, "name": name, "addr": buf}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "exit":
            break
        if op == "fill":
            data = bytes.fromhex(cmd["hex"])
            out = {"rc": e.write_bytes_to_buffer(buf + cmd["off"], data, len(data))}
        elif op == "dump":
            out = {"hex": e.read_bytes_from_buffer(buf + cmd["off"], cmd["len"]).hex()}
        elif op == "transfer":
            opcode = TransferOpcode.Write if cmd["write"] else TransferOpcode.Read
            out = {"rc": e.transfer_sync(cmd["target"], buf + cmd["off"], cmd["remote"], cmd["len"], opcode)}
        elif op == "first":
            out = {"addr": e.get_first_buffer_address(cmd["target"])}
        else:
            out = {"error": f"unknown op {op}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
