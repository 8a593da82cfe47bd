"""``mooncake.engine``: the Transfer Engine.

A :class:`TransferEngine` registers local memory and moves bytes between it
and registered memory of other engines (other processes or hosts), found
through a metadata service (``P2PHANDSHAKE``, ``http://host:port/metadata``,
``etcd://host:port`` or ``redis://host:port``). Remote locations are the
target process's virtual addresses inside its registered buffers, exactly as
in the reference.
"""

from ._mooncake import InnerTransferEngine, TransferEngine, TransferNotify, TransferOpcode

# The reference binding exports the opcodes at module level and on the class.
Read = TransferOpcode.Read
Write = TransferOpcode.Write
TransferEngine.TransferOpcode = TransferOpcode

__all__ = [
    "InnerTransferEngine",
    "Read",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
]
