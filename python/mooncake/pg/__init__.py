"""``mooncake.pg``: the ``mooncake-cpu`` torch.distributed backend.

Importing this module registers the backend with torch::

    import torch.distributed as dist
    from mooncake import pg

    dist.init_process_group("mooncake-cpu", rank=rank, world_size=world)

Ranks of one group live on one host and move tensors through shared
memory (see docs/pg.md). The CUDA backend (``mooncake``) needs a GPU build
and is not part of this package.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
    import torch.distributed as _dist
except ImportError as _exc:  # pragma: no cover - exercised without torch
    raise ImportError(
        "mooncake.pg needs PyTorch: install torch (pip install torch) to use "
        "the mooncake-cpu process group"
    ) from _exc

from ._backend import MooncakeProcessGroup
from ._elastic import (
    ProposalResponse,
    ProposalStatus,
    SyncAfterFailureResponse,
    SyncAfterFailureStatus,
    activate_ranks,
    deactivate_ranks,
    get_active_ranks,
    get_current_epoch,
    get_peer_state,
    join_group,
    recover_ranks,
    set_device_filter,
    sync_after_failure,
)
from ._options import MooncakeBackendOptions
from ._work import MooncakeWork

BACKEND_NAME = "mooncake-cpu"

__all__ = [
    "BACKEND_NAME",
    "MooncakeBackendOptions",
    "MooncakeProcessGroup",
    "MooncakeWork",
    "ProposalResponse",
    "ProposalStatus",
    "SyncAfterFailureResponse",
    "SyncAfterFailureStatus",
    "activate_ranks",
    "deactivate_ranks",
    "get_active_ranks",
    "get_current_epoch",
    "get_failed_ranks_hint",
    "get_local_success",
    "get_peer_state",
    "join_group",
    "recover_ranks",
    "set_device_filter",
    "sync_after_failure",
]


def _create(dist_opts, backend_options=None):
    if backend_options is not None and not isinstance(backend_options, MooncakeBackendOptions):
        raise TypeError(
            f"pg_options for {BACKEND_NAME} must be mooncake.pg.MooncakeBackendOptions, "
            f"not {type(backend_options).__name__}"
        )
    return MooncakeProcessGroup(
        dist_opts.store,
        dist_opts.group_rank,
        dist_opts.group_size,
        dist_opts.timeout.total_seconds(),
        backend_options,
        dist_opts.global_ranks_in_group,
    )


def _register() -> None:
    if BACKEND_NAME.upper() in _dist.Backend._plugins:
        return
    _dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])


_register()


def _work(work) -> MooncakeWork:
    if not isinstance(work, MooncakeWork):
        raise TypeError(f"not a work of the {BACKEND_NAME} backend: {type(work).__name__}")
    return work


def get_local_success(work) -> bool:
    """Whether the operation completed on this rank with every peer alive."""
    return _work(work).local_success()


def get_failed_ranks_hint(work) -> torch.Tensor:
    """A 0/1 int32 tensor over the group's ranks: 1 for the ranks this
    operation found dead."""
    return _work(work).failed_ranks_hint()
