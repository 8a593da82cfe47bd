"""Options of a ``mooncake-cpu`` group, as ``pg_options``."""

from __future__ import annotations


class MooncakeBackendOptions:
    """``MooncakeBackendOptions(max_group_size[, is_extension[,
    auto_deactivate_on_failure[, auto_sync_on_failure]]])``.

    ``max_group_size`` is the number of rank slots the group reserves (at
    least its initial size); ``is_extension`` marks a rank that starts
    alone and waits in ``join_group`` to be activated; with
    ``auto_deactivate_on_failure`` a rank found dead leaves the active set
    by itself, and with ``auto_sync_on_failure`` the survivors agree on it
    before their next operation.
    """

    def __init__(
        self,
        max_group_size: int = 0,
        is_extension: bool = False,
        auto_deactivate_on_failure: bool = True,
        auto_sync_on_failure: bool = True,
    ):
        if int(max_group_size) < 0:
            raise ValueError(f"max_group_size must not be negative, got {max_group_size}")
        self.max_group_size = int(max_group_size)
        self.is_extension = bool(is_extension)
        self.auto_deactivate_on_failure = bool(auto_deactivate_on_failure)
        self.auto_sync_on_failure = bool(auto_sync_on_failure)

    def __repr__(self) -> str:
        return (
            f"MooncakeBackendOptions(max_group_size={self.max_group_size}, "
            f"is_extension={self.is_extension}, "
            f"auto_deactivate_on_failure={self.auto_deactivate_on_failure}, "
            f"auto_sync_on_failure={self.auto_sync_on_failure})"
        )
