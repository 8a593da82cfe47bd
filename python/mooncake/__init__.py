"""Mooncake: a Transfer Engine and a distributed KV-cache store.

``mooncake.engine`` holds :class:`~mooncake.engine.TransferEngine`;
``mooncake.store`` holds :class:`~mooncake.store.MooncakeDistributedStore`;
:class:`~mooncake.BufferPool` (``RegisteredBufferPool``) lends a store's
memory for its zero-copy calls; ``mooncake.mooncake_config`` reads the
integrations' config file and ``MOONCAKE_*`` environment variables.
"""

from ._mooncake import __version__
from .buffer_pool import BufferPool, RegisteredBufferPool

__all__ = ["BufferPool", "RegisteredBufferPool", "__version__"]
