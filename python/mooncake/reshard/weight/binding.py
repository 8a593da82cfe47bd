"""Checking runtime bindings against the placement they claim to realize."""

from __future__ import annotations

from ..contracts import RuntimeInstanceId, validate_resource_binding_identity
from .placement import WeightPlacementManifest
from .runtime import WeightRuntimeBindingManifest
from .types import canonical_strides_bytes, require_manifest_items
from .validation import _validate_runtime_binding_address_ranges


def validate_runtime_binding(
    placement: WeightPlacementManifest,
    binding: WeightRuntimeBindingManifest,
) -> None:
    """One participant's binding must name this exact placement and give
    every fragment of its part a canonical contiguous view, without
    overlapping views or allocations."""

    if not isinstance(placement, WeightPlacementManifest):
        raise ValueError("placement must be a WeightPlacementManifest")
    if not isinstance(binding, WeightRuntimeBindingManifest):
        raise ValueError("binding must be a WeightRuntimeBindingManifest")
    validate_resource_binding_identity(placement, binding)
    if placement.revision != binding.revision:
        raise ValueError("placement and runtime binding revision differ")
    part = next((p for p in placement.parts if p.participant_id == binding.participant_id), None)
    if part is None:
        raise ValueError(f"unknown runtime binding participant: {binding.participant_id}")
    logical = {f.placement_fragment_id: f for f in part.fragments}
    physical = {f.placement_fragment_id: f for f in binding.fragments}
    unknown = sorted(set(physical) - set(logical))
    if unknown:
        raise ValueError(f"unknown placement fragment in runtime binding: {unknown[0]}")
    missing = sorted(set(logical) - set(physical))
    if missing:
        raise ValueError(f"missing placement fragment in runtime binding: {missing[0]}")
    tensors = {t.tensor_id: t for t in placement.tensors}
    for fragment in part.fragments:
        fid = fragment.placement_fragment_id
        view = physical[fid]
        itemsize = tensors[fragment.tensor_id].itemsize
        if view.nbytes != fragment.nbytes:
            raise ValueError(f"runtime binding byte size does not match placement: {fid}")
        if view.local_shape != fragment.local_shape:
            raise ValueError(f"runtime binding local_shape does not match placement: {fid}")
        if view.itemsize != itemsize:
            raise ValueError(f"runtime binding itemsize does not match placement: {fid}")
        if view.strides_bytes != canonical_strides_bytes(fragment.local_shape, itemsize):
            raise ValueError(
                f"runtime binding stride does not describe a canonical contiguous view: {fid}"
            )
    _validate_runtime_binding_address_ranges(
        instance_id=binding.instance_id,
        tensors=placement.tensors,
        placements=part.fragments,
        bindings=binding.fragments,
    )


def _validate_runtime_binding_subset(
    placement: WeightPlacementManifest,
    bindings: object,
) -> tuple[WeightRuntimeBindingManifest, ...]:
    items = require_manifest_items(bindings, "runtime bindings", WeightRuntimeBindingManifest)
    if len({b.participant_id for b in items}) != len(items):
        raise ValueError("duplicate runtime binding participant")
    for binding in items:
        validate_runtime_binding(placement, binding)
    # Participants of one runtime instance share address spaces.
    parts = {p.participant_id: p for p in placement.parts}
    by_instance: dict[RuntimeInstanceId, list[WeightRuntimeBindingManifest]] = {}
    for binding in items:
        by_instance.setdefault(binding.instance_id, []).append(binding)
    for instance_id, group in by_instance.items():
        _validate_runtime_binding_address_ranges(
            instance_id=instance_id,
            tensors=placement.tensors,
            placements=tuple(f for b in group for f in parts[b.participant_id].fragments),
            bindings=tuple(f for b in group for f in b.fragments),
        )
    return items


def validate_runtime_bindings(placement: WeightPlacementManifest, bindings: object) -> None:
    """The bindings of every participant that holds fragments, and no other."""

    items = _validate_runtime_binding_subset(placement, bindings)
    expected = {p.participant_id for p in placement.parts if p.fragments}
    actual = {b.participant_id for b in items}
    missing = sorted(expected - actual)
    if missing:
        raise ValueError(f"missing runtime binding participant: {missing[0]}")
    unknown = sorted(actual - expected)
    if unknown:
        raise ValueError(f"unknown runtime binding participant: {unknown[0]}")
