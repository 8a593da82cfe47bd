"""A complete address-free placement of one weight generation, and its
canonical identity."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..contracts import (
    ParticipantId,
    PlacementId,
    PlacementSetId,
    ResourceId,
    ResourceKind,
    RevisionId,
    TensorId,
)
from .part import WeightPlacementPart
from .topology import ParallelTopology
from .types import (
    OwnershipAxis,
    PlacementFragment,
    ReplicatedAxis,
    SplitAxis,
    TensorDescriptor,
    _require_nonempty_string,
    _require_u64,
    canonical_digest,
    require_manifest_items,
)
from .validation import _validate_complete_weight_placement, _validate_fragments


def _axis_identity(axis: object) -> dict[str, object]:
    if isinstance(axis, SplitAxis):
        return {"semantics": "split", "kind": axis.kind, "dim": axis.dim}
    if isinstance(axis, ReplicatedAxis):
        return {"semantics": "replicated", "kind": axis.kind}
    if isinstance(axis, OwnershipAxis):
        return {"semantics": "ownership", "kind": axis.kind}
    raise ValueError("unsupported parallel axis value")


def _fragment_identity(f: PlacementFragment) -> dict[str, object]:
    out: dict[str, object] = {
        "placement_fragment_id": f.placement_fragment_id,
        "tensor_id": f.tensor_id,
        "global_offset": f.global_offset,
        "local_shape": f.local_shape,
        "nbytes": f.nbytes,
        "rank": asdict(f.rank),
        "aliases": f.aliases,
    }
    if f.pipeline_stage_id is not None:
        out["pipeline_stage_id"] = f.pipeline_stage_id
    return out


def _tensor_identity(t: TensorDescriptor) -> dict[str, object]:
    return {
        "tensor_id": t.tensor_id,
        "global_shape": t.global_shape,
        "dtype": t.dtype,
        "itemsize": t.itemsize,
        "shard_dims": t.shard_dims,
        "layout_fingerprint": t.layout_fingerprint,
        "parallel_axes": [_axis_identity(a) for a in t.parallel_axes],
        "layer_id": t.layer_id,
        "expert_id": t.expert_id,
    }


def _check_parts(
    parts: tuple[WeightPlacementPart, ...],
    topology: ParallelTopology,
    identity: dict[str, object],
) -> None:
    ids = [p.participant_id for p in parts]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate placement participant")
    expected = {p.participant_id: p for p in topology.participants}
    missing = sorted(set(expected) - set(ids))
    if missing:
        raise ValueError(f"missing topology participant: {missing[0]}")
    unknown = sorted(set(ids) - set(expected))
    if unknown:
        raise ValueError(f"unknown topology participant: {unknown[0]}")
    for part in parts:
        for name, value in identity.items():
            if getattr(part, name) != value:
                raise ValueError(f"placement part {name} differs")
        if part.topology_id != topology.topology_id:
            raise ValueError("placement part topology_id differs")
        if part.rank != expected[part.participant_id].rank:
            raise ValueError("placement part rank differs from topology")


@dataclass(frozen=True, init=False)
class WeightPlacementManifest:
    """Every selected participant's part, validated together: logical
    coverage per parallel axis, alias groups, and a content-derived
    ``placement_id`` and ``digest``."""

    resource_id: ResourceId
    placement_id: PlacementId
    revision: RevisionId
    weight_generation: int
    placement_set_id: PlacementSetId
    topology: ParallelTopology
    parts: tuple[WeightPlacementPart, ...]
    tensors: tuple[TensorDescriptor, ...]
    fragments: tuple[PlacementFragment, ...]
    _digest_cache: Optional[str] = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        *,
        resource_id: ResourceId,
        revision: RevisionId,
        weight_generation: int,
        placement_set_id: PlacementSetId,
        topology: ParallelTopology,
        parts: tuple[WeightPlacementPart, ...],
        placement_id: Optional[PlacementId] = None,
    ) -> None:
        _require_nonempty_string(resource_id, "resource_id")
        _require_nonempty_string(revision, "revision")
        _require_u64(weight_generation, "weight_generation")
        _require_nonempty_string(placement_set_id, "placement_set_id")
        if not isinstance(topology, ParallelTopology):
            raise ValueError("topology must be a ParallelTopology")
        if placement_id is not None:
            _require_nonempty_string(placement_id, "placement_id")
        ordered = tuple(
            sorted(
                require_manifest_items(parts, "WeightPlacementManifest parts", WeightPlacementPart),
                key=lambda p: p.participant_id,
            )
        )
        _check_parts(
            ordered,
            topology,
            {
                "resource_id": resource_id,
                "revision": revision,
                "weight_generation": weight_generation,
                "placement_set_id": placement_set_id,
            },
        )
        catalog: dict[TensorId, TensorDescriptor] = {}
        collected: list[PlacementFragment] = []
        for part in ordered:
            for tensor in part.tensors:
                if catalog.setdefault(tensor.tensor_id, tensor) != tensor:
                    raise ValueError(
                        f"placement part tensor descriptor mismatch: {tensor.tensor_id}"
                    )
            collected.extend(part.fragments)
        tensors = tuple(sorted(catalog.values(), key=lambda t: t.tensor_id))
        fragments = tuple(sorted(collected, key=lambda f: f.placement_fragment_id))
        _validate_fragments(tensors, fragments, require_complete_alias_groups=True)
        _validate_complete_weight_placement(tensors, fragments, topology=topology)
        content = {
            "schema": "complete-weight-placement",
            "resource_id": resource_id,
            "revision": revision,
            "weight_generation": weight_generation,
            "placement_set_id": placement_set_id,
            "topology": {
                "tp_size": topology.tp_size,
                "pp_size": topology.pp_size,
                "ep_size": topology.ep_size,
                "dp_size": topology.dp_size,
                "topology_id": topology.topology_id,
                "participants": [asdict(p) for p in topology.participants],
            },
            "tensors": [_tensor_identity(t) for t in tensors],
            "parts": [
                {
                    "participant_id": part.participant_id,
                    "rank": asdict(part.rank),
                    "fragments": [_fragment_identity(f) for f in part.fragments],
                }
                for part in ordered
            ],
        }
        canonical = PlacementId(f"sha256:{canonical_digest(content)}")
        if placement_id is not None and placement_id != canonical:
            raise ValueError("placement_id does not match canonical logical content")
        for name, value in (
            ("resource_id", resource_id),
            ("placement_id", canonical),
            ("revision", revision),
            ("weight_generation", weight_generation),
            ("placement_set_id", placement_set_id),
            ("topology", topology),
            ("parts", ordered),
            ("tensors", tensors),
            ("fragments", fragments),
            ("_digest_cache", None),
        ):
            object.__setattr__(self, name, value)

    @property
    def resource_kind(self) -> ResourceKind:
        return ResourceKind.MODEL_WEIGHT

    @property
    def digest(self) -> str:
        """SHA-256 of the canonical JSON form, computed once."""

        if self._digest_cache is None:
            from . import serde

            encoded = serde.weight_placement_to_json(self).encode()
            object.__setattr__(self, "_digest_cache", hashlib.sha256(encoded).hexdigest())
        return self._digest_cache  # type: ignore[return-value]

    @classmethod
    def from_fragments(
        cls,
        *,
        resource_id: ResourceId,
        revision: RevisionId,
        weight_generation: int,
        placement_set_id: PlacementSetId,
        topology: ParallelTopology,
        tensors: Sequence[TensorDescriptor],
        fragments: Sequence[PlacementFragment],
        placement_id: Optional[PlacementId] = None,
    ) -> WeightPlacementManifest:
        """Build the parts from a flat inventory, one per participant, by rank."""

        tensor_items = require_manifest_items(tensors, "placement tensors", TensorDescriptor)
        fragment_items = require_manifest_items(fragments, "placement fragments", PlacementFragment)
        by_id = {t.tensor_id: t for t in tensor_items}
        if len(by_id) != len(tensor_items):
            raise ValueError("duplicate tensor_id in placement tensors")
        used = {f.tensor_id for f in fragment_items}
        unknown = sorted(used - set(by_id))
        if unknown:
            raise ValueError(f"unknown tensor_id: {unknown[0]}")
        unused = sorted(set(by_id) - used)
        if unused:
            raise ValueError(f"global placement contains an unreferenced tensor: {unused[0]}")
        participant_of = {p.rank: p.participant_id for p in topology.participants}
        held: dict[ParticipantId, list[PlacementFragment]] = {
            p.participant_id: [] for p in topology.participants
        }
        for f in fragment_items:
            owner = participant_of.get(f.rank)
            if owner is None:
                raise ValueError(
                    f"placement fragment rank has no topology participant: {f.fragment_id}"
                )
            held[owner].append(f)
        parts = tuple(
            WeightPlacementPart(
                resource_id=resource_id,
                revision=revision,
                weight_generation=weight_generation,
                placement_set_id=placement_set_id,
                topology_id=topology.topology_id,
                participant_id=p.participant_id,
                rank=p.rank,
                tensors=tuple(by_id[t] for t in sorted({f.tensor_id for f in held[p.participant_id]})),
                fragments=tuple(held[p.participant_id]),
            )
            for p in topology.participants
        )
        return cls(
            resource_id=resource_id,
            revision=revision,
            weight_generation=weight_generation,
            placement_set_id=placement_set_id,
            topology=topology,
            parts=parts,
            placement_id=placement_id,
        )
