"""``mooncake.p2p_store``: the P2P Store, for large immutable objects
(checkpoints, model weights) shared between many nodes without a central
copy (docs/p2p-store.md).

A publisher registers named buffers; consumers pull every shard from any
node that already holds it and serve it to the others from then on::

    from mooncake.p2p_store import P2PStore

    store = P2PStore("127.0.0.1:2379", "10.0.0.2:12345")   # etcd, this node
    store.register("ckpt/step-100", [arr.ctypes.data], [arr.nbytes])
    ...
    other = P2PStore("127.0.0.1:2379", "10.0.0.3:12346")
    report = other.get_replica("ckpt/step-100", [out.ctypes.data], [out.nbytes])
    other.delete_replica("ckpt/step-100")

The calls are the reference's Go API (``Register``, ``Unregister``,
``GetReplica``, ``DeleteReplica``, ``List``) with the same arguments;
failures raise :class:`P2PStoreError` with ``(message, code)``.
"""

from ._mooncake import p2p_store as _native

P2PStore = _native.P2PStore
P2PStoreError = _native.P2PStoreError
DEFAULT_SHARD_SIZE = _native.DEFAULT_SHARD_SIZE

__all__ = ["P2PStore", "P2PStoreError", "DEFAULT_SHARD_SIZE"]
