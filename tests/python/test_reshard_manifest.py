"""mooncake.reshard: geometry, placement manifests, the JSON wire form,
stored manifests and runtime bindings."""

from __future__ import annotations

import json
import pickle
import random
import time
from dataclasses import replace

import pytest

import mooncake.reshard as reshard
import mooncake.reshard.geometry as geometry
import mooncake.reshard.weight.serde as serde
from mooncake.reshard._compat import _strict_zip
from mooncake.reshard.contracts import ResourceKind
from mooncake.reshard.geometry import boxes_exactly_cover, boxes_overlap, regions_exactly_cover
from mooncake.reshard.weight import (
    OwnershipAxis,
    ParallelRank,
    ParallelTopology,
    PlacementFragment,
    ReplicatedAxis,
    RuntimeBindingFragment,
    SplitAxis,
    StoredFragment,
    TensorDescriptor,
    TopologyParticipant,
    WeightManifest,
    WeightPlacementManifest,
    WeightPlacementPart,
    WeightRuntimeBindingManifest,
    validate_runtime_binding,
    validate_runtime_bindings,
    weight_placement_from_json,
    weight_placement_to_json,
)

from reshard_cases import GENERATION, RESOURCE, REVISION, Spec, placement

SPECS = (Spec("layers.0.qkv", (8, 4)), Spec("layers.0.out", (4, 8), tp_dim=1), Spec("norm", (4,), tp_dim=None))


def test_public_surface() -> None:
    assert reshard.__all__ == ["ResourceKind", "ResourceManifest", "PlacementManifest", "RuntimeBindingManifest"]
    assert ResourceKind.MODEL_WEIGHT.value == "model_weight"
    assert tuple(_strict_zip((1, 2), "ab")) == ((1, "a"), (2, "b"))
    with pytest.raises(ValueError, match="different lengths"):
        tuple(_strict_zip((1,), (1, 2)))


def _brute_overlap(boxes) -> bool:
    return any(
        all(a < c + z and c < a + x for a, x, c, z in zip(o1, s1, o2, s2))
        for i, (o1, s1) in enumerate(boxes)
        for o2, s2 in boxes[i + 1 :]
    )


def test_box_overlap_matches_pairwise_check() -> None:
    rng = random.Random(11)
    for _ in range(400):
        ndim = rng.randint(1, 3)
        boxes = [
            (tuple(rng.randint(0, 6) for _ in range(ndim)), tuple(rng.randint(1, 4) for _ in range(ndim)))
            for _ in range(rng.randint(0, 8))
        ]
        assert boxes_overlap(boxes) is _brute_overlap(boxes)


def test_exact_cover_needs_bounds_volume_and_no_overlap() -> None:
    halves = (((8, 4), (1, 6)), ((9, 4), (1, 6)))
    assert boxes_exactly_cover((8, 4), (2, 6), halves)
    assert not boxes_exactly_cover((8, 4), (2, 6), halves[:1])
    assert not boxes_exactly_cover((8, 4), (2, 6), (halves[0], halves[0]))
    assert not boxes_exactly_cover((8, 4), (2, 6), ())

    class Box:
        global_offset = (0,)
        local_shape = (4,)

    class Region:
        def __init__(self, o, s):
            self.overlap_offset, self.overlap_shape = o, s

    assert regions_exactly_cover(Box(), [Region((0,), (1,)), Region((1,), (3,))])
    assert not regions_exactly_cover(Box(), [Region((0,), (2,)), Region((1,), (3,))])


def test_two_dimensional_cover_is_fast_and_high_rank_has_a_budget(monkeypatch) -> None:
    # Every row split at a different column: the worst case for pairwise sweeps.
    n = 4096
    boxes = [b for r in range(n) for b in (((0, r), (r + 1, 1)), ((r + 1, r), (n - r, 1)))]
    started = time.perf_counter()
    assert boxes_exactly_cover((0, 0), (n + 1, n), boxes)
    assert time.perf_counter() - started < 5.0
    cube = [((0, r, 0), (r + 1, 1, 1)) for r in range(3)] + [((r + 1, r, 0), (3 - r, 1, 1)) for r in range(3)]
    assert not boxes_overlap(cube)
    monkeypatch.setattr(geometry, "_MAX_HIGH_DIMENSIONAL_PAIRWISE_COMPARISONS", 0)
    with pytest.raises(ValueError, match="high-dimensional overlap budget"):
        boxes_overlap(cube)


def test_descriptor_and_axis_validation() -> None:
    good = dict(
        tensor_id="w", global_shape=(4, 4), dtype="float16", itemsize=2, shard_dims=(0,),
        layout_fingerprint="fp", parallel_axes=(SplitAxis("tp", 0),),
    )
    t = TensorDescriptor(**good)
    assert t.global_shape == (4, 4)
    for change, message in (
        ({"global_shape": (4, "4")}, "integer"),
        ({"global_shape": ()}, "must not be empty"),
        ({"shard_dims": (1,)}, "conflict with shard_dims"),
        ({"shard_dims": (0, 0)}, "duplicates"),
        ({"parallel_axes": (SplitAxis("tp", 0), ReplicatedAxis("tp"))}, "duplicate kinds"),
        ({"parallel_axes": ("tp",)}, "explicit axis values"),
        ({"layout_fingerprint": ""}, "layout_fingerprint"),
        ({"expert_id": 3, "parallel_axes": (SplitAxis("ep", 0),)}, "individually allocated expert"),
    ):
        with pytest.raises(ValueError, match=message):
            TensorDescriptor(**{**good, **change})
    with pytest.raises(ValueError, match="EP must split the leading"):
        SplitAxis("ep", 1)
    with pytest.raises(ValueError, match="cannot use split semantics"):
        SplitAxis("dp", 0)
    with pytest.raises(ValueError, match="unsupported parallel axis kind"):
        OwnershipAxis("sp")
    # Axes are kept in dp, pp, ep, tp order whatever the input order.
    t = TensorDescriptor(**{**good, "parallel_axes": (SplitAxis("tp", 0), ReplicatedAxis("dp"))})
    assert [a.kind for a in t.parallel_axes] == ["dp", "tp"]


def test_fragment_ids_are_content_derived() -> None:
    a = PlacementFragment("w", (0, 0), (2, 4), 16, ParallelRank(tp=1))
    b = PlacementFragment("w", [0, 0], [2, 4], 16, ParallelRank(tp=1))
    assert a == b and a.fragment_id.startswith("sha256:")
    assert PlacementFragment("w", (0, 0), (2, 4), 16, ParallelRank(tp=0)).fragment_id != a.fragment_id
    staged = PlacementFragment("w", (0, 0), (2, 4), 16, ParallelRank(tp=1), pipeline_stage_id=2)
    assert staged.fragment_id != a.fragment_id
    with pytest.raises(ValueError, match="alias group must contain the fragment"):
        PlacementFragment("w", (0,), (2,), 4, ParallelRank(), aliases=("x", "y"))
    with pytest.raises(ValueError, match="64-bit"):
        PlacementFragment("w", (0,), (2,), 1 << 64, ParallelRank())


def test_topology_is_canonical() -> None:
    parts = (TopologyParticipant("b", ParallelRank(tp=1)), TopologyParticipant("a", ParallelRank(tp=0)))
    topo = ParallelTopology(tp_size=2, pp_size=1, ep_size=1, dp_size=1, participants=parts)
    assert [p.participant_id for p in topo.participants] == ["a", "b"]
    assert topo.world_size == 2
    same = ParallelTopology(tp_size=2, pp_size=1, ep_size=1, dp_size=1, participants=parts[::-1], topology_id=topo.topology_id)
    assert same == topo
    with pytest.raises(ValueError, match="does not match canonical"):
        ParallelTopology(tp_size=2, pp_size=1, ep_size=1, dp_size=1, participants=parts, topology_id="sha256:00")
    with pytest.raises(ValueError, match="tp rank is out of range"):
        ParallelTopology(tp_size=1, pp_size=1, ep_size=1, dp_size=1, participants=parts)
    with pytest.raises(ValueError, match="duplicate topology parallel rank"):
        ParallelTopology(tp_size=2, pp_size=1, ep_size=1, dp_size=1,
                         participants=(parts[0], TopologyParticipant("c", ParallelRank(tp=1))))
    with pytest.raises(ValueError, match="unknown topology participant"):
        topo.participant("z")


def test_placement_round_trip_and_identity(monkeypatch) -> None:
    p = placement(SPECS, tp=2)
    encoded = weight_placement_to_json(p)
    assert weight_placement_from_json(encoded) == p
    assert weight_placement_from_json(encoded).digest == p.digest
    assert p.placement_id.startswith("sha256:") and len(p.digest) == 64
    assert p.resource_kind is ResourceKind.MODEL_WEIGHT
    for absent in ("address", "endpoint", "worker_id", "lease_id", "owner", '"generation":'):
        assert absent not in encoded
    # Same content, different order or set: same/different identity.
    assert placement(tuple(reversed(SPECS)), tp=2).placement_id == p.placement_id
    assert placement(SPECS, tp=2, set_id="other").placement_id != p.placement_id
    # The digest is computed once.
    calls = []
    original = serde.weight_placement_to_json
    monkeypatch.setattr(serde, "weight_placement_to_json", lambda x: calls.append(1) or original(x))
    fresh = placement(SPECS, tp=4)
    assert fresh.digest == fresh.digest and len(calls) == 1


def test_wire_form_is_strict() -> None:
    encoded = weight_placement_to_json(placement(SPECS, tp=2))
    raw = json.loads(encoded)
    cases = [
        ("{", "not valid JSON"),
        ("[]", "JSON object"),
        (encoded[:-1] + ',"extra":1}', "schema fields"),
        (encoded.replace('"weight_generation":3', '"weight_generation":NaN'), "non-finite"),
        (encoded[:-1] + ',"revision":"x"}', "duplicate JSON field"),
        (encoded.replace('"weight_generation":3', '"weight_generation":3.0'), "integer"),
        (json.dumps({**raw, "resource_kind": "kv_cache"}), "model_weight"),
        (json.dumps({**raw, "placement_id": "sha256:" + "0" * 64}), "placement_id does not match"),
    ]
    for text, message in cases:
        with pytest.raises(ValueError, match=message):
            weight_placement_from_json(text)
    raw["parts"][0]["fragments"][0]["owner"] = "w0"
    with pytest.raises(ValueError, match="invalid schema"):
        weight_placement_from_json(json.dumps(raw))


def test_pipeline_stage_is_serialized_only_when_set() -> None:
    f = PlacementFragment("norm", (0,), (4,), 8, ParallelRank(), pipeline_stage_id=3)
    t = TensorDescriptor("norm", (4,), "float16", 2, (), "fp", (ReplicatedAxis("tp"),))
    topo = ParallelTopology(tp_size=1, pp_size=1, ep_size=1, dp_size=1,
                            participants=(TopologyParticipant("w", ParallelRank()),))
    p = WeightPlacementManifest.from_fragments(resource_id=RESOURCE, revision=REVISION, weight_generation=1,
                                               placement_set_id="s", topology=topo, tensors=(t,), fragments=(f,))
    encoded = weight_placement_to_json(p)
    assert '"pipeline_stage_id":3' in encoded
    assert weight_placement_from_json(encoded) == p
    assert "pipeline_stage_id" not in weight_placement_to_json(placement(SPECS, tp=1))


def _parts(p: WeightPlacementManifest) -> dict[str, WeightPlacementPart]:
    return {part.participant_id: part for part in p.parts}


def test_placement_refuses_gaps_overlaps_and_strangers() -> None:
    p = placement(SPECS, tp=2)
    parts = list(p.parts)
    kwargs = dict(resource_id=RESOURCE, revision=REVISION, weight_generation=GENERATION,
                  placement_set_id=p.placement_set_id, topology=p.topology)
    with pytest.raises(ValueError, match="missing topology participant"):
        WeightPlacementManifest(**kwargs, parts=tuple(parts[:1]))
    with pytest.raises(ValueError, match="duplicate placement participant"):
        WeightPlacementManifest(**kwargs, parts=(parts[0], parts[0], parts[1]))
    # Drop one shard of a split tensor from a part: the tensor has a gap.
    first = parts[0]
    keep = tuple(f for f in first.fragments if f.tensor_id != "layers.0.qkv")
    holed = replace(first, fragments=keep, tensors=tuple(t for t in first.tensors if t.tensor_id != "layers.0.qkv"))
    with pytest.raises(ValueError, match="not fully covered"):
        WeightPlacementManifest(**kwargs, parts=(holed, parts[1]))
    with pytest.raises(ValueError, match="generation"):
        WeightPlacementManifest(**{**kwargs, "weight_generation": GENERATION + 1}, parts=tuple(parts))
    tensor = first.tensors[0]
    box = next(f for f in first.fragments if f.tensor_id == tensor.tensor_id)
    overlapping = PlacementFragment(box.tensor_id, box.global_offset, box.local_shape, box.nbytes, box.rank,
                                    placement_fragment_id="twin")
    with pytest.raises(ValueError, match="duplicate logical fragment"):
        replace(first, fragments=first.fragments + (overlapping,))
    with pytest.raises(ValueError, match="unreferenced tensor"):
        replace(first, fragments=keep)
    with pytest.raises(ValueError, match="fragment rank differs"):
        replace(first, fragments=parts[1].fragments, tensors=parts[1].tensors)


def test_undeclared_active_axis_is_refused() -> None:
    # A DP-2 topology whose tensors do not declare the DP axis.
    spec = Spec("w", (4, 4))
    good = placement((spec,), tp=1, dp=2)
    t = replace(good.tensors[0], parallel_axes=(SplitAxis("tp", 0),))
    with pytest.raises(ValueError, match="explicit parallel semantics for active undeclared dp axis"):
        WeightPlacementManifest.from_fragments(resource_id=RESOURCE, revision=REVISION, weight_generation=GENERATION,
                                               placement_set_id="s", topology=good.topology, tensors=(t,),
                                               fragments=good.fragments)


def test_alias_groups_must_be_declared_by_every_member() -> None:
    topo = ParallelTopology(tp_size=1, pp_size=1, ep_size=1, dp_size=1,
                            participants=(TopologyParticipant("w", ParallelRank()),))
    tensors = tuple(TensorDescriptor(n, (4,), "float16", 2, (), "fp", (ReplicatedAxis("tp"),)) for n in ("embed", "lm_head"))
    tied = tuple(PlacementFragment(t.tensor_id, (0,), (4,), 8, ParallelRank(), aliases=("embed", "lm_head")) for t in tensors)
    kwargs = dict(resource_id=RESOURCE, revision=REVISION, weight_generation=1, placement_set_id="s", topology=topo, tensors=tensors)
    assert WeightPlacementManifest.from_fragments(**kwargs, fragments=tied).fragments[0].aliases == ("embed", "lm_head")
    untied = (tied[0], PlacementFragment("lm_head", (0,), (4,), 8, ParallelRank()))
    with pytest.raises(ValueError, match="alias group is not declared consistently"):
        WeightPlacementManifest.from_fragments(**kwargs, fragments=untied)


def _binding_for(p: WeightPlacementManifest, participant: str, base: int, **changes) -> WeightRuntimeBindingManifest:
    part = _parts(p)[participant]
    fragments = []
    at = base
    for f in part.fragments:
        tensor = next(t for t in p.tensors if t.tensor_id == f.tensor_id)
        strides = [tensor.itemsize] * len(f.local_shape)
        for d in range(len(strides) - 2, -1, -1):
            strides[d] = strides[d + 1] * f.local_shape[d + 1]
        fragments.append(RuntimeBindingFragment(
            placement_fragment_id=f.placement_fragment_id, fragment_id=f"rt-{at}", address=at, nbytes=f.nbytes,
            worker_id=participant, endpoint="127.0.0.1:1", device="cpu", itemsize=tensor.itemsize,
            local_shape=f.local_shape, strides_bytes=tuple(strides), storage_address=at, storage_nbytes=f.nbytes,
            storage_offset_bytes=0, owner=object(),
        ))
        at += f.nbytes + changes.get("gap", 64)
    return WeightRuntimeBindingManifest(
        resource_id=p.resource_id, placement_id=p.placement_id, placement_digest=p.digest, instance_id="inst",
        generation=1, lease_id="lease", revision=p.revision, participant_id=participant, fragments=tuple(fragments),
    )


def test_runtime_bindings_are_fenced_to_the_placement() -> None:
    p = placement(SPECS, tp=2)
    ids = [part.participant_id for part in p.parts]
    bindings = [_binding_for(p, pid, 0x10000 * (i + 1)) for i, pid in enumerate(ids)]
    validate_runtime_bindings(p, bindings)
    with pytest.raises(ValueError, match="missing runtime binding participant"):
        validate_runtime_bindings(p, bindings[:1])
    other = placement(SPECS, tp=2, set_id="other")
    with pytest.raises(ValueError, match="placement_id and runtime binding placement_id differ"):
        validate_runtime_binding(other, bindings[0])
    # Two participants of one instance and worker with overlapping views.
    clash = _binding_for(p, ids[1], 0x10000, gap=64)
    clash = replace(clash, fragments=tuple(replace(f, worker_id=ids[0]) for f in clash.fragments))
    with pytest.raises(ValueError, match="address ranges overlap"):
        validate_runtime_bindings(p, [bindings[0], clash])
    f = bindings[0].fragments[0]
    with pytest.raises(ValueError, match="storage_address plus storage_offset_bytes"):
        replace(f, address=f.address + 1)
    with pytest.raises(ValueError, match="exceeds storage allocation"):
        replace(f, storage_offset_bytes=8, address=f.address + 8)
    # The owner keeps the allocation alive in this process only.
    clone = pickle.loads(pickle.dumps(f))
    assert clone == f and clone.owner is None


def test_stored_manifest_round_trip_and_checks() -> None:
    tensor = TensorDescriptor("w", (4, 4), "float16", 2, (0,), "fp", (SplitAxis("tp", 0),))
    frags = tuple(
        StoredFragment(f"w-{i}", "w", (2 * i, 0), (2, 4), "g/payload/0", 16 * i, 16) for i in range(2)
    )
    m = WeightManifest(namespace="ns", resource_id=RESOURCE, revision=REVISION, weight_generation=1, group_id="g",
                       manifest_key="g/manifest", tensors=(tensor,), fragments=frags, created_at="2026-12-07T00:00:00Z")
    assert WeightManifest.from_json(m.to_json()) == m
    assert m.manifest_identity.content_sha256 == m.manifest_digest
    kwargs = dict(namespace="ns", resource_id=RESOURCE, revision=REVISION, weight_generation=1, group_id="g",
                  manifest_key="g/manifest", tensors=(tensor,), created_at="now")
    with pytest.raises(ValueError, match="object ranges overlap"):
        WeightManifest(**kwargs, fragments=(frags[0], replace(frags[1], object_offset=8)))
    with pytest.raises(ValueError, match="not fully covered"):
        WeightManifest(**kwargs, fragments=frags[:1])
    with pytest.raises(ValueError, match="does not belong to manifest group"):
        WeightManifest(**kwargs, fragments=(frags[0], replace(frags[1], object_key="h/payload/0")))
    with pytest.raises(ValueError, match="schema"):
        WeightManifest.from_json(m.to_json().replace('"created_at"', '"made_at"'))
    with pytest.raises(ValueError, match="non-finite"):
        WeightManifest.from_json(m.to_json().replace('"weight_generation":1', '"weight_generation":Infinity'))


def test_coordinates_past_64_bits_are_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"2\*\*64"):
        boxes_overlap([((1 << 64,), (1,)), ((0,), (1,))])
    huge = TensorDescriptor("w", (1 << 65,), "u8", 1, (), "fp", (ReplicatedAxis("tp"),))
    topo = ParallelTopology(tp_size=1, pp_size=1, ep_size=1, dp_size=1,
                            participants=(TopologyParticipant("w", ParallelRank()),))
    with pytest.raises(ValueError, match=r"2\*\*64"):
        WeightPlacementManifest.from_fragments(
            resource_id=RESOURCE, revision=REVISION, weight_generation=1, placement_set_id="s", topology=topo,
            tensors=(huge,), fragments=(PlacementFragment("w", (1 << 64,), (2,), 2, ParallelRank()),))
    with pytest.raises(ValueError, match="ends past"):
        boxes_exactly_cover((0,), ((1 << 64) - 1,), [(((1 << 64) - 2,), (4,))])
