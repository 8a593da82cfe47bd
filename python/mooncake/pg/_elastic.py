"""The elastic-membership calls of ``mooncake.pg``, on a group whose
backend is ``mooncake-cpu``.

Membership here follows from what every rank can observe by itself: a
rank's process has exited or it has not. Every survivor finds the same
ranks dead at the same point of a collective, so the survivors change
their active sets alike without a coordinator; ``deactivate_ranks`` and
``sync_after_failure`` apply that shared view.
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
    """For each of ``ranks``: whether it can take part (its process is
    alive and mapped)."""
    b = backend_of(group)
    return [b.peer_alive(r) for r in _ranks(ranks)]


def get_active_ranks(group) -> torch.Tensor:
    """A 0/1 int32 tensor over the group's ranks: 1 for the active ones."""
    b = backend_of(group)
    out = torch.zeros(b.size(), dtype=torch.int32)
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


def sync_after_failure(group) -> SyncAfterFailureResponse:
    """Applies the failures this rank has seen to its membership view
    (they leave the active set with auto-deactivation; the view is kept
    without it)."""
    pending = backend_of(group).sync_after_failure()
    return SyncAfterFailureResponse(
        SyncAfterFailureStatus.Reconciled if pending else SyncAfterFailureStatus.NoPending
    )
