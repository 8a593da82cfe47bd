"""A storage process made of plain `mooncake.store` calls: set up a store that
mounts a segment, then sleep until SIGTERM/SIGINT. Used as the "remote"
segment owner when a system ships no `mooncake_client`."""

import argparse
import signal
import sys
import threading

from mooncake.store import MooncakeDistributedStore


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--metadata", required=True)
    ap.add_argument("--segment", type=int, required=True)
    ap.add_argument("--local-buffer", type=int, default=16 << 20)
    ap.add_argument("--protocol", default="tcp")
    ap.add_argument("--ready-file", required=True)
    args = ap.parse_args()

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", args.metadata, args.segment, args.local_buffer,
                     args.protocol, "", args.master)
    if rc != 0:
        print(f"setup failed: {rc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with open(args.ready_file, "w") as f:
        f.write(store.get_hostname())
    while not stop.wait(0.5):
        pass
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
