"""The parallel sizes of a placement and the participants it selects."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from ..contracts import ParticipantId, TopologyId
from .types import (
    ParallelRank,
    _require_integer,
    _require_nonempty_string,
    canonical_digest,
    require_manifest_items,
)


@dataclass(frozen=True)
class TopologyParticipant:
    """One runtime participant (a worker) and its parallel coordinates."""

    participant_id: ParticipantId
    rank: ParallelRank

    def __post_init__(self) -> None:
        _require_nonempty_string(self.participant_id, "participant_id")
        if not isinstance(self.rank, ParallelRank):
            raise ValueError("topology participant rank must be a ParallelRank")


@dataclass(frozen=True, init=False)
class ParallelTopology:
    """TP/PP/EP/DP sizes plus the selected participants.

    ``world_size`` counts participants; it is not the product of the sizes,
    since TP and EP may share workers and a placement may select one DP
    replica of a runtime that keeps its declared ``dp_size``.
    """

    tp_size: int
    pp_size: int
    ep_size: int
    dp_size: int
    participants: tuple[TopologyParticipant, ...]
    topology_id: TopologyId

    def __init__(
        self,
        *,
        tp_size: int,
        pp_size: int,
        ep_size: int,
        dp_size: int,
        participants: tuple[TopologyParticipant, ...],
        topology_id: Optional[TopologyId] = None,
    ) -> None:
        sizes = {"tp": tp_size, "pp": pp_size, "ep": ep_size, "dp": dp_size}
        for axis, size in sizes.items():
            _require_integer(size, f"{axis}_size", minimum=1)
        members = require_manifest_items(
            participants, "ParallelTopology participants", TopologyParticipant
        )
        if not members:
            raise ValueError("parallel topology participants must not be empty")
        members = tuple(sorted(members, key=lambda p: p.participant_id))
        if len({p.participant_id for p in members}) != len(members):
            raise ValueError("duplicate topology participant_id")
        if len({p.rank for p in members}) != len(members):
            raise ValueError("duplicate topology parallel rank")
        for p in members:
            for axis, size in sizes.items():
                if getattr(p.rank, axis) >= size:
                    raise ValueError(
                        f"{axis} rank is out of range for participant {p.participant_id}"
                    )
        canonical = TopologyId(
            "sha256:"
            + canonical_digest(
                {
                    "schema": "weight-parallel-topology",
                    "tp_size": tp_size,
                    "pp_size": pp_size,
                    "ep_size": ep_size,
                    "dp_size": dp_size,
                    "participants": [asdict(p) for p in members],
                }
            )
        )
        if topology_id is not None and topology_id != canonical:
            raise ValueError("topology_id does not match canonical topology")
        for name, value in (
            ("tp_size", tp_size),
            ("pp_size", pp_size),
            ("ep_size", ep_size),
            ("dp_size", dp_size),
            ("participants", members),
            ("topology_id", canonical),
        ):
            object.__setattr__(self, name, value)

    @property
    def world_size(self) -> int:
        return len(self.participants)

    def participant(self, participant_id: ParticipantId) -> TopologyParticipant:
        for p in self.participants:
            if p.participant_id == participant_id:
                return p
        raise ValueError(f"unknown topology participant: {participant_id}")


__all__ = ["ParallelTopology", "TopologyParticipant"]
