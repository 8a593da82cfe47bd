"""The canonical JSON wire form of a placement.

The only untyped boundary of the package: decoding accepts exactly the
canonical fields (no alternate names, no unknown or duplicate keys, no
NaN/Infinity) and rebuilds the typed values, which re-run every check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Optional

from ..contracts import ResourceKind
from .part import WeightPlacementPart
from .placement import WeightPlacementManifest
from .topology import ParallelTopology, TopologyParticipant
from .types import (
    OwnershipAxis,
    ParallelAxis,
    ParallelRank,
    PlacementFragment,
    ReplicatedAxis,
    SplitAxis,
    TensorDescriptor,
)

_PLACEMENT_FIELDS = {
    "resource_kind", "resource_id", "revision", "weight_generation",
    "placement_set_id", "placement_id", "topology", "tensors", "parts",
}
_TENSOR_FIELDS = {
    "tensor_id", "global_shape", "dtype", "itemsize", "shard_dims",
    "layout_fingerprint", "parallel_axes", "layer_id", "expert_id",
}
_FRAGMENT_FIELDS = {
    "placement_fragment_id", "tensor_id", "global_offset", "local_shape",
    "nbytes", "rank", "aliases",
}


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _rank_to_wire(rank: ParallelRank) -> dict[str, int]:
    return {"dp": rank.dp, "tp": rank.tp, "pp": rank.pp, "ep": rank.ep}


def _axis_to_wire(axis: ParallelAxis) -> dict[str, object]:
    if isinstance(axis, SplitAxis):
        return {"semantics": "split", "kind": axis.kind, "dim": axis.dim}
    if isinstance(axis, ReplicatedAxis):
        return {"semantics": "replicated", "kind": axis.kind}
    if isinstance(axis, OwnershipAxis):
        return {"semantics": "ownership", "kind": axis.kind}
    raise ValueError("unsupported parallel axis value")


def _tensor_to_wire(t: TensorDescriptor) -> dict[str, object]:
    return {
        "tensor_id": t.tensor_id,
        "global_shape": list(t.global_shape),
        "dtype": t.dtype,
        "itemsize": t.itemsize,
        "shard_dims": list(t.shard_dims),
        "layout_fingerprint": t.layout_fingerprint,
        "parallel_axes": [_axis_to_wire(a) for a in t.parallel_axes],
        "layer_id": t.layer_id,
        "expert_id": t.expert_id,
    }


def _fragment_to_wire(f: PlacementFragment) -> dict[str, object]:
    out: dict[str, object] = {
        "placement_fragment_id": f.placement_fragment_id,
        "tensor_id": f.tensor_id,
        "global_offset": list(f.global_offset),
        "local_shape": list(f.local_shape),
        "nbytes": f.nbytes,
        "rank": _rank_to_wire(f.rank),
        "aliases": list(f.aliases),
    }
    if f.pipeline_stage_id is not None:
        out["pipeline_stage_id"] = f.pipeline_stage_id
    return out


def weight_placement_to_json(placement: WeightPlacementManifest) -> str:
    """The canonical JSON of ``placement`` (compact, keys sorted)."""

    if not isinstance(placement, WeightPlacementManifest):
        raise ValueError("placement must be a WeightPlacementManifest")
    topology = placement.topology
    return _dumps(
        {
            "resource_kind": placement.resource_kind.value,
            "resource_id": placement.resource_id,
            "revision": placement.revision,
            "weight_generation": placement.weight_generation,
            "placement_set_id": placement.placement_set_id,
            "placement_id": placement.placement_id,
            "topology": {
                "tp_size": topology.tp_size,
                "pp_size": topology.pp_size,
                "ep_size": topology.ep_size,
                "dp_size": topology.dp_size,
                "topology_id": topology.topology_id,
                "participants": [
                    {"participant_id": p.participant_id, "rank": _rank_to_wire(p.rank)}
                    for p in topology.participants
                ],
            },
            "tensors": [_tensor_to_wire(t) for t in placement.tensors],
            "parts": [
                {
                    "participant_id": part.participant_id,
                    "rank": _rank_to_wire(part.rank),
                    "fragments": [_fragment_to_wire(f) for f in part.fragments],
                }
                for part in placement.parts
            ],
        }
    )


# -- decoding ---------------------------------------------------------------


def _object(value: object, label: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping) or any(type(k) is not str for k in value):
        raise ValueError(f"{label} must be a JSON object")
    return value


def _exact(value: object, fields: AbstractSet[str], label: str) -> Mapping[str, object]:
    mapping = _object(value, label)
    if set(mapping) != set(fields):
        raise ValueError(f"{label} schema fields do not match contract")
    return mapping


def _list(value: object, label: str) -> Sequence[object]:
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
        raise ValueError(f"{label} must be a sequence")
    return value


def _text(value: object, label: str) -> str:
    if type(value) is not str or not value:
        raise ValueError(f"{label} must be a non-empty string")
    return value


def _integer(value: object, label: str, minimum: int) -> int:
    if type(value) is not int or value < minimum:
        raise ValueError(f"{label} must be an integer at least {minimum}")
    return value


def _maybe_integer(value: object, label: str, minimum: int) -> Optional[int]:
    return None if value is None else _integer(value, label, minimum)


def _integers(value: object, label: str, minimum: int) -> tuple[int, ...]:
    return tuple(_integer(v, label, minimum) for v in _list(value, label))


def _kind(value: object) -> str:
    kind = _text(value, "parallel axis kind")
    if kind not in ("dp", "pp", "ep", "tp"):
        raise ValueError(f"unsupported parallel axis kind: {kind}")
    return kind


def _axis_from_wire(value: object, index: int) -> ParallelAxis:
    label = f"placement tensor parallel axis {index}"
    semantics = _text(_object(value, label).get("semantics"), "axis semantics")
    if semantics == "split":
        axis = _exact(value, {"semantics", "kind", "dim"}, label)
        kind = _kind(axis["kind"])
        if kind not in ("ep", "tp"):
            raise ValueError(f"{kind} cannot use split semantics")
        return SplitAxis(kind=kind, dim=_integer(axis["dim"], "split axis dim", 0))  # type: ignore[arg-type]
    if semantics in ("replicated", "ownership"):
        axis = _exact(value, {"semantics", "kind"}, label)
        cls = ReplicatedAxis if semantics == "replicated" else OwnershipAxis
        return cls(kind=_kind(axis["kind"]))  # type: ignore[arg-type]
    raise ValueError(f"unsupported parallel axis semantics: {semantics}")


def _rank_from_wire(value: object, label: str) -> ParallelRank:
    rank = _exact(value, {"dp", "tp", "pp", "ep"}, label)
    return ParallelRank(**{k: _integer(rank[k], f"rank {k}", 0) for k in ("dp", "tp", "pp", "ep")})


def _tensor_from_wire(value: object, index: int) -> TensorDescriptor:
    t = _exact(value, _TENSOR_FIELDS, f"placement tensor {index}")
    return TensorDescriptor(
        tensor_id=_text(t["tensor_id"], "tensor_id"),
        global_shape=_integers(t["global_shape"], "global_shape", 1),
        dtype=_text(t["dtype"], "dtype"),
        itemsize=_integer(t["itemsize"], "itemsize", 1),
        shard_dims=_integers(t["shard_dims"], "shard_dims", 0),
        layout_fingerprint=_text(t["layout_fingerprint"], "layout_fingerprint"),
        parallel_axes=tuple(
            _axis_from_wire(a, i)
            for i, a in enumerate(_list(t["parallel_axes"], "placement tensor parallel_axes"))
        ),
        layer_id=_maybe_integer(t["layer_id"], "layer_id", 0),
        expert_id=_maybe_integer(t["expert_id"], "expert_id", 0),
    )


def _fragment_from_wire(value: object, index: int) -> PlacementFragment:
    f = _object(value, f"placement fragment {index}")
    # pipeline_stage_id is optional: absent on placements without stages.
    if set(f) not in (_FRAGMENT_FIELDS, _FRAGMENT_FIELDS | {"pipeline_stage_id"}):
        raise ValueError(f"placement fragment {index} has an invalid schema")
    return PlacementFragment(
        placement_fragment_id=_text(f["placement_fragment_id"], "placement_fragment_id"),
        tensor_id=_text(f["tensor_id"], "tensor_id"),
        global_offset=_integers(f["global_offset"], "global_offset", 0),
        local_shape=_integers(f["local_shape"], "local_shape", 1),
        nbytes=_integer(f["nbytes"], "nbytes", 1),
        rank=_rank_from_wire(f["rank"], f"placement rank {index}"),
        pipeline_stage_id=_maybe_integer(f.get("pipeline_stage_id"), "pipeline_stage_id", 0),
        aliases=tuple(_text(a, "alias") for a in _list(f["aliases"], "aliases")),
    )


def _topology_from_wire(value: object) -> ParallelTopology:
    topo = _exact(
        value,
        {"tp_size", "pp_size", "ep_size", "dp_size", "topology_id", "participants"},
        "parallel topology",
    )
    participants = []
    for i, item in enumerate(_list(topo["participants"], "parallel topology participants")):
        p = _exact(item, {"participant_id", "rank"}, f"parallel topology participant {i}")
        participants.append(
            TopologyParticipant(
                participant_id=_text(p["participant_id"], "participant_id"),
                rank=_rank_from_wire(p["rank"], f"parallel topology rank {i}"),
            )
        )
    return ParallelTopology(
        tp_size=_integer(topo["tp_size"], "tp_size", 1),
        pp_size=_integer(topo["pp_size"], "pp_size", 1),
        ep_size=_integer(topo["ep_size"], "ep_size", 1),
        dp_size=_integer(topo["dp_size"], "dp_size", 1),
        participants=tuple(participants),
        topology_id=_text(topo["topology_id"], "topology_id"),
    )


def _load_object(value: object, label: str) -> Mapping[str, object]:
    def no_constants(name: str) -> None:
        raise ValueError(f"non-finite JSON number is unsupported: {name}")

    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, item in pairs:
            if key in out:
                raise ValueError(f"duplicate JSON field: {key}")
            out[key] = item
        return out

    try:
        raw = json.loads(value, parse_constant=no_constants, object_pairs_hook=no_duplicates)  # type: ignore[arg-type]
    except (TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"{label} is not valid JSON") from error
    return _object(raw, label)


def weight_placement_from_json(value: str) -> WeightPlacementManifest:
    """Decode the canonical wire form; anything else is a ValueError."""

    m = _exact(_load_object(value, "placement manifest"), _PLACEMENT_FIELDS, "placement manifest")
    if _text(m["resource_kind"], "resource_kind") != ResourceKind.MODEL_WEIGHT.value:
        raise ValueError("placement manifest resource_kind must be model_weight")
    resource_id = _text(m["resource_id"], "resource_id")
    revision = _text(m["revision"], "revision")
    generation = _integer(m["weight_generation"], "weight_generation", 0)
    placement_set_id = _text(m["placement_set_id"], "placement_set_id")
    placement_id = _text(m["placement_id"], "placement_id")
    topology = _topology_from_wire(m["topology"])
    tensors = tuple(_tensor_from_wire(t, i) for i, t in enumerate(_list(m["tensors"], "placement tensors")))
    by_id = {t.tensor_id: t for t in tensors}
    if len(by_id) != len(tensors):
        raise ValueError("duplicate tensor_id in placement JSON")
    parts = []
    used: set[str] = set()
    for i, item in enumerate(_list(m["parts"], "placement parts")):
        p = _exact(item, {"participant_id", "rank", "fragments"}, f"placement part {i}")
        participant_id = _text(p["participant_id"], "participant_id")
        rank = _rank_from_wire(p["rank"], f"placement part rank {i}")
        fragments = tuple(
            _fragment_from_wire(f, j)
            for j, f in enumerate(_list(p["fragments"], "placement part fragments"))
        )
        local = {f.tensor_id for f in fragments}
        used |= local
        unknown = sorted(local - set(by_id))
        if unknown:
            raise ValueError(f"unknown tensor_id in placement part: {unknown[0]}")
        parts.append(
            WeightPlacementPart(
                resource_id=resource_id,
                revision=revision,
                weight_generation=generation,
                placement_set_id=placement_set_id,
                topology_id=topology.topology_id,
                participant_id=participant_id,
                rank=rank,
                tensors=tuple(by_id[t] for t in sorted(local)),
                fragments=fragments,
            )
        )
    unused = sorted(set(by_id) - used)
    if unused:
        raise ValueError(f"placement JSON contains an unreferenced tensor: {unused[0]}")
    return WeightPlacementManifest(
        resource_id=resource_id,
        revision=revision,
        weight_generation=generation,
        placement_set_id=placement_set_id,
        placement_id=placement_id,
        topology=topology,
        parts=tuple(parts),
    )
