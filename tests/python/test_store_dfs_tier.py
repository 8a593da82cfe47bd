"""The shared-filesystem tier (`mooncake_master --root_fs_dir`) from
Python: a store holding a segment writes objects beyond memory to files
under the directory, another store reads them back, and replica
descriptors report them as disk replicas with their file paths."""

from __future__ import annotations

import os

from conftest import Cluster
from mooncake.store import MooncakeDistributedStore

MiB = 1 << 20
KEYS = 48
VALUE = 256 << 10


def put_retrying(store, key, value):
    # -200 (NO_AVAILABLE_HANDLE): memory is full of objects whose file is
    # not durable yet; retry.
    for _ in range(20000):
        rc = store.put(key, value)
        if rc != -200:
            return rc
    return rc


def test_objects_beyond_memory_live_in_files_readable_by_others(tmp_path):
    c = Cluster(f"--root_fs_dir={tmp_path}", "--default_kv_lease_ttl=50")
    owner = MooncakeDistributedStore()
    reader = MooncakeDistributedStore()
    try:
        assert owner.setup("127.0.0.1", c.metadata, 4 * MiB, 16 * MiB, "tcp", "", c.master) == 0
        assert reader.setup("127.0.0.1", c.metadata, 0, 16 * MiB, "tcp", "", c.master) == 0
        values = {f"py-dfs-{i}": os.urandom(VALUE) for i in range(KEYS)}
        for k, v in values.items():
            assert put_retrying(reader, k, v) == 0, k
        for k, v in values.items():
            assert reader.get(k) == v, k
        descs = reader.batch_get_replica_desc(list(values))
        in_files = [k for k, reps in descs.items()
                    if reps and all(r.is_disk_replica() for r in reps)]
        assert len(in_files) > KEYS // 3
        d = descs[in_files[0]][0].get_disk_descriptor()
        assert d.object_size == VALUE
        assert d.file_path.startswith(f"{tmp_path}/mooncake_cluster/")
        assert os.path.isfile(d.file_path)
        assert not descs[in_files[0]][0].is_local_disk_replica()
    finally:
        reader.close()
        owner.close()
        assert c.stop() == 0, c.proc.output()
