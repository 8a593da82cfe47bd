"""Mooncake: a Transfer Engine and a distributed KV-cache store.

``mooncake.engine`` holds :class:`~mooncake.engine.TransferEngine`;
``mooncake.store`` holds :class:`~mooncake.store.MooncakeDistributedStore`;
``mooncake.mooncake_config`` reads the integrations' config file and
``MOONCAKE_*`` environment variables.
"""

from ._mooncake import __version__

__all__ = ["__version__"]
