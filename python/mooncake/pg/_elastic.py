"""The elastic-membership calls of ``mooncake.pg``, on a group whose
backend is ``mooncake-cpu``.

Membership here follows from what every rank can observe by itself: a
rank's process has exited or it has not. Every survivor finds the same
ranks dead at the same point of a collective, so the survivors change
their active sets alike without a coordinator; ``deactivate_ranks`` and
``sync_after_failure`` apply that shared view. Growing the group is a
decision of the active ranks together: ``recover_ranks`` (which every
active rank calls) votes in one collective, and the joiner, blocked in
``join_group``, takes the group's round before it is counted in.
"""

from __future__ import annotations

import enum

import torch
import torch.distributed as dist

from ._backend import MooncakeProcessGroup


class ProposalStatus(enum.Enum):
    Applied = 0
    AppliedWithDroppedRanks = 1
    Rejected = 2


class SyncAfterFailureStatus(enum.Enum):
    Reconciled = 0
    NoPending = 1
    Rejected = 2


class ProposalResponse:
    """What a membership change did: ``status``, ``reject_reason`` (empty
    unless rejected) and ``dropped_ranks``."""

    def __init__(self, status: ProposalStatus, reject_reason: str = "", dropped_ranks=()):
        self.status = status
        self.reject_reason = reject_reason
        self.dropped_ranks = list(dropped_ranks)

    def __repr__(self) -> str:
        return (
            f"ProposalResponse(status={self.status}, reject_reason={self.reject_reason!r}, "
            f"dropped_ranks={self.dropped_ranks})"
        )


class SyncAfterFailureResponse:
    def __init__(self, status: SyncAfterFailureStatus, reject_reason: str = ""):
        self.status = status
        self.reject_reason = reject_reason

    def __repr__(self) -> str:
        return f"SyncAfterFailureResponse(status={self.status}, reject_reason={self.reject_reason!r})"


def backend_of(group) -> MooncakeProcessGroup:
    """The ``mooncake-cpu`` backend of ``group`` (a ProcessGroup, or the
    backend itself); None means the default group."""
    if group is None:
        group = dist.group.WORLD
    if isinstance(group, MooncakeProcessGroup):
        return group
    try:
        backend = group._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError) as exc:
        raise TypeError(f"{group!r} has no mooncake-cpu backend: {exc}") from None
    if not isinstance(backend, MooncakeProcessGroup):
        raise TypeError(f"the group's CPU backend is {type(backend).__name__}, not mooncake-cpu")
    return backend


def _ranks(ranks) -> list[int]:
    if isinstance(ranks, torch.Tensor):
        ranks = ranks.tolist()
    return [int(r) for r in ranks]


def get_peer_state(group, ranks) -> list[bool]:
    """For each of ``ranks``: whether it can take part: an active rank
    whose process runs, or an inactive one for which a live process has
    published itself (``is_extension=True``), ready to be activated."""
    b = backend_of(group)
    return [b.peer_ready(r) for r in _ranks(ranks)]


def get_active_ranks(group) -> torch.Tensor:
    """A 0/1 int32 tensor over the group's ``max_group_size`` ranks: 1 for
    the active ones (a rank waiting in ``join_group`` sees itself only)."""
    b = backend_of(group)
    out = torch.zeros(b.max_group_size, dtype=torch.int32)
    for r in b.active_ranks():
        out[r] = 1
    return out


def get_current_epoch(group) -> int:
    """The membership view's epoch: it grows with every change."""
    return backend_of(group).epoch()


def deactivate_ranks(group, ranks) -> ProposalResponse:
    """Removes dead ``ranks`` from the active set. Rejected (with the
    reason) for a live rank or a rank outside the group."""
    b = backend_of(group)
    try:
        removed, reason = b.deactivate(_ranks(ranks))
    except ValueError as exc:
        return ProposalResponse(ProposalStatus.Rejected, str(exc))
    if reason:
        return ProposalResponse(ProposalStatus.Rejected, reason)
    return ProposalResponse(ProposalStatus.Applied, dropped_ranks=removed)


def activate_ranks(group, ranks) -> ProposalResponse:
    """Activates inactive ``ranks`` whose new processes are ready (see
    ``get_peer_state``); every active rank calls it with the same ranks.
    ``Applied`` once they joined (the group's size covers them), or
    ``AppliedWithDroppedRanks`` naming those that were not ready on every
    active rank or died before joining; ``Rejected`` with the reason for a
    rank out of range, already active, or proposals that differ."""
    b = backend_of(group)
    reason, dropped = b.activate(_ranks(ranks))
    if reason:
        return ProposalResponse(ProposalStatus.Rejected, reason)
    if dropped:
        return ProposalResponse(ProposalStatus.AppliedWithDroppedRanks, dropped_ranks=dropped)
    return ProposalResponse(ProposalStatus.Applied)


def recover_ranks(group, ranks) -> ProposalResponse:
    """``activate_ranks``: brings back ranks whose replacement processes
    are ready, or adds the extension ranks of a group made with a larger
    ``max_group_size``."""
    return activate_ranks(group, ranks)


def join_group(group) -> None:
    """On an ``is_extension`` rank: blocks until the active ranks activate
    it (``recover_ranks``), at most the group's timeout; its operations
    then run with them. Returns at once on an active rank."""
    backend_of(group).join()


def set_device_filter(filters) -> None:
    """The reference's choice of RDMA devices for its transfer engine.
    ``mooncake-cpu`` moves tensors through same-host shared memory and
    uses no network device, so an empty filter (every device) is all it
    can honour; any other is refused rather than ignored."""
    if isinstance(filters, str):
        raise TypeError("set_device_filter takes a list of device names, not a string")
    names = [str(f) for f in filters]
    if names:
        raise ValueError(
            f"mooncake-cpu uses no network device (its ranks share memory on one host): "
            f"cannot restrict it to {names}"
        )


def sync_after_failure(group) -> SyncAfterFailureResponse:
    """Applies the failures this rank has seen to its membership view
    (they leave the active set with auto-deactivation; the view is kept
    without it)."""
    pending = backend_of(group).sync_after_failure()
    return SyncAfterFailureResponse(
        SyncAfterFailureStatus.Reconciled if pending else SyncAfterFailureStatus.NoPending
    )
