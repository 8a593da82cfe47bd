"""mooncake.reshard planning and execution: TP split/merge on any
dimension, DP replicas, PP stages, experts, stored sources, limits, and
the bytes a plan moves."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from mooncake.reshard.weight import (
    OwnershipAxis,
    ParallelRank,
    ParallelTopology,
    PlacementFragment,
    PlanningLimits,
    SplitAxis,
    StoredFragment,
    TensorDescriptor,
    TopologyParticipant,
    TransferRegion,
    WeightManifest,
    WeightPlacementManifest,
    plan_placement_transfer,
    plan_placement_transfer_to_local_target,
    plan_stored_transfer_to_target_placement,
)
from mooncake.reshard.weight.execute import execute_plan

from reshard_cases import GENERATION, RESOURCE, REVISION, Spec, fragment_bytes, global_bytes, placement

ROWS = Spec("layers.0.mlp.up", (16, 4))
COLS = Spec("layers.0.mlp.down", (2, 8), tp_dim=1)


def _ops_for(plan, tp: int):
    return [op for op in plan.operations if op.target.rank.tp == tp]


def test_tp2_to_tp4_splits_each_source_shard() -> None:
    plan = plan_placement_transfer(placement((ROWS,), tp=2, prefix="train"), placement((ROWS,), tp=4, prefix="roll"))
    assert len(plan.operations) == 4
    # Target rank 1 holds rows 4..8: the second half of source rank 0.
    (op,) = _ops_for(plan, 1)
    assert (op.source.rank.tp, op.source_offset, op.target_offset, op.nbytes) == (0, 32, 0, 32)
    assert op.repeat == 1 and op.segment_count == 1 and op.source_stride == 0
    assert plan.total_bytes == 16 * 4 * 2
    assert len(plan.source_executors) == 2 and len(plan.target_executors) == 4
    for executor in plan.target_executors:
        assert len(plan.operation_indices_for_executor(executor, "target")) == 1


def test_tp4_to_tp2_merges_at_increasing_target_offsets() -> None:
    plan = plan_placement_transfer(placement((ROWS,), tp=4, prefix="a"), placement((ROWS,), tp=2, prefix="b"))
    assert [(op.source_offset, op.target_offset, op.nbytes) for op in _ops_for(plan, 0)] == [(0, 0, 32), (0, 32, 32)]


def test_split_on_the_inner_dimension_is_one_strided_run_per_row() -> None:
    plan = plan_placement_transfer(placement((COLS,), tp=2, prefix="a"), placement((COLS,), tp=4, prefix="b"))
    (op,) = _ops_for(plan, 1)
    assert (op.repeat, op.source_stride, op.target_stride, op.nbytes) == (2, 8, 4, 4)
    assert list(op.iter_segments(max_segments=2)) == [(4, 0, 4), (12, 4, 4)]
    with pytest.raises(ValueError, match="exceeds max_segments"):
        list(op.iter_segments(max_segments=1))
    with pytest.raises(ValueError, match="positive integer"):
        op.iter_segments(max_segments=0)
    big = Spec("embed", (8192, 8192), tp_dim=1)
    plan = plan_placement_transfer(placement((big,), tp=2, prefix="a"), placement((big,), tp=4, prefix="b"))
    assert {op.repeat for op in plan.operations} == {8192}
    assert plan.total_bytes == 8192 * 8192 * 2


@pytest.mark.parametrize(("src", "dst"), [(4, 8), (8, 4), (3, 6), (2, 1)])
def test_every_target_fragment_is_filled_in_order(src: int, dst: int) -> None:
    spec = Spec("w", (24, 6))
    plan = plan_placement_transfer(placement((spec,), tp=src, prefix="a"), placement((spec,), tp=dst, prefix="b"))
    for tp in range(dst):
        cursor = 0
        for op in sorted(_ops_for(plan, tp), key=lambda o: o.target_offset):
            assert op.target_offset == cursor
            cursor += op.total_bytes
        assert cursor == 24 * 6 * 2 // dst


def test_regions_refuse_non_canonical_geometry() -> None:
    plan = plan_placement_transfer(placement((COLS,), tp=2, prefix="a"), placement((COLS,), tp=4, prefix="b"))
    op = _ops_for(plan, 1)[0]
    with pytest.raises(ValueError, match="source base offset is inconsistent"):
        replace(op, source_base_offset=op.source_base_offset + 2)
    with pytest.raises(ValueError, match="exceeds source logical fragment"):
        replace(op, overlap_shape=(2, 4))
    with pytest.raises(ValueError, match="must contain integers"):
        replace(op, source_strides=("8",))
    with pytest.raises(ValueError, match="not canonical"):
        replace(op, inner_bytes=2, outer_loop_counts=(2, 2), source_strides=(8, 2), target_strides=(4, 2))
    # A split on the last of three dimensions leaves two outer loops.
    cube = Spec("c", (2, 3, 8), tp_dim=2)
    plan = plan_placement_transfer(placement((cube,), tp=2, prefix="a"), placement((cube,), tp=4, prefix="b"))
    op = plan.operations[0]
    assert isinstance(op, TransferRegion) and op.outer_loop_counts == (2, 3) and op.repeat == 6
    with pytest.raises(ValueError, match="multiple source strides"):
        op.source_stride


def test_limits_bound_regions_and_segments() -> None:
    src, dst = placement((COLS,), tp=2, prefix="a"), placement((COLS,), tp=4, prefix="b")
    with pytest.raises(ValueError, match="max_transfer_regions"):
        plan_placement_transfer(src, dst, planning_limits=PlanningLimits(max_transfer_regions=3))
    with pytest.raises(ValueError, match="max_segments_per_region"):
        plan_placement_transfer(src, dst, planning_limits=PlanningLimits(max_segments_per_region=1))
    with pytest.raises(ValueError, match="max_total_lowered_segments"):
        plan_placement_transfer(src, dst, planning_limits=PlanningLimits(max_total_lowered_segments=7))
    with pytest.raises(ValueError, match="positive integer"):
        PlanningLimits(max_transfer_regions=0)


def test_source_and_target_must_be_the_same_generation_and_tensors() -> None:
    src = placement((ROWS, COLS), tp=2, prefix="a")
    with pytest.raises(ValueError, match="weight_generation differ"):
        plan_placement_transfer(src, placement((ROWS, COLS), tp=4, prefix="b", generation=GENERATION + 1))
    with pytest.raises(ValueError, match="target manifests are missing tensors: layers.0.mlp.down"):
        plan_placement_transfer(src, placement((ROWS,), tp=4, prefix="b"))
    with pytest.raises(ValueError, match="layout mismatch"):
        plan_placement_transfer(src, placement((ROWS, COLS), tp=4, prefix="b", fingerprint="swizzled"))


def test_dp_replicas_are_read_from_one_complete_replica() -> None:
    src = placement((ROWS,), tp=2, dp=2, prefix="a")
    dst = placement((ROWS,), tp=4, dp=3, prefix="b")
    plan = plan_placement_transfer(src, dst)
    # Target DP rank d reads source replica d % 2.
    for op in plan.operations:
        assert op.source.rank.dp == op.target.rank.dp % 2
    assert plan.total_bytes == 3 * 16 * 4 * 2


def test_pipeline_stages_route_by_stage() -> None:
    specs = (Spec("layers.0.w", (8, 4), stage=0), Spec("layers.1.w", (8, 4), stage=1))
    src = placement(specs, tp=2, pp=2, prefix="a")
    dst = placement(specs, tp=1, pp=2, prefix="b")
    plan = plan_placement_transfer(src, dst)
    routes = {(r.source_pp, r.target_pp): len(r.operation_indices) for r in plan.pipeline_routes}
    assert routes == {(0, 0): 2, (1, 1): 2}


def _experts(prefix: str, count: int, ep: int, set_id: str) -> WeightPlacementManifest:
    tensor = TensorDescriptor("layers.2.experts.w1", (count, 4, 4), "float16", 2, (0,), "fp", (SplitAxis("ep", 0),))
    per = count // ep
    frags = tuple(
        PlacementFragment(tensor.tensor_id, (r * per, 0, 0), (per, 4, 4), per * 32, ParallelRank(ep=r))
        for r in range(ep)
    )
    topo = ParallelTopology(tp_size=1, pp_size=1, ep_size=ep, dp_size=1,
                            participants=tuple(TopologyParticipant(f"{prefix}-e{r}", ParallelRank(ep=r)) for r in range(ep)))
    return WeightPlacementManifest.from_fragments(resource_id=RESOURCE, revision=REVISION, weight_generation=GENERATION,
                                                  placement_set_id=set_id, topology=topo, tensors=(tensor,), fragments=frags)


def test_expert_reshard_to_one_local_target() -> None:
    src = _experts("a", 256, 256, "src")
    dst = _experts("b", 256, 8, "dst")
    plan = plan_placement_transfer_to_local_target(src, dst, "b-e3")
    assert len(plan.operations) == 32
    assert {op.source.rank.ep for op in plan.operations} == set(range(96, 128))
    assert [e.participant_id for e in plan.target_executors] == ["b-e3"]
    with pytest.raises(ValueError, match="required for a multi-participant target"):
        plan_placement_transfer_to_local_target(src, dst)
    with pytest.raises(ValueError, match="unknown target participant"):
        plan_placement_transfer_to_local_target(src, dst, "nobody")


def test_dp_owned_tensor_needs_one_complete_owner() -> None:
    tensor = TensorDescriptor("router", (4,), "float16", 2, (), "fp", (OwnershipAxis("dp"),))
    topo = ParallelTopology(tp_size=1, pp_size=1, ep_size=1, dp_size=2,
                            participants=tuple(TopologyParticipant(f"w{d}", ParallelRank(dp=d)) for d in range(2)))

    def make(ranks, set_id):
        frags = tuple(PlacementFragment("router", (0,), (4,), 8, ParallelRank(dp=d)) for d in ranks)
        return WeightPlacementManifest.from_fragments(resource_id=RESOURCE, revision=REVISION, weight_generation=1,
                                                      placement_set_id=set_id, topology=topo, tensors=(tensor,), fragments=frags)

    plan = plan_placement_transfer(make([1], "s"), make([0], "t"))
    assert [(op.source.rank.dp, op.target.rank.dp) for op in plan.operations] == [(1, 0)]
    with pytest.raises(ValueError, match="ambiguous declared owners"):
        plan_placement_transfer(make([0, 1], "s"), make([0], "t"))


def test_stored_source_plans_and_pickles() -> None:
    tensor = TensorDescriptor(ROWS.name, ROWS.shape, "float16", 2, (0,), "row-major", (SplitAxis("tp", 0),))
    stored = WeightManifest(
        namespace="ns", resource_id=RESOURCE, revision=REVISION, weight_generation=GENERATION, group_id="g",
        manifest_key="g/manifest", tensors=(tensor,), created_at="now",
        fragments=(StoredFragment("whole", ROWS.name, (0, 0), (16, 4), "g/payload/0", 0, 128),),
    )
    dst = placement((ROWS,), tp=4, prefix="b")
    plan = plan_stored_transfer_to_target_placement(stored, dst)
    assert [op.source_offset for op in sorted(plan.operations, key=lambda o: o.target.rank.tp)] == [0, 32, 64, 96]
    assert plan.source_manifest_identity == stored.manifest_identity and plan.source_executors == ()
    assert pickle.loads(pickle.dumps(plan)) == plan


def _run(specs, src, dst, nthreads=2):
    plan = plan_placement_transfer(src, dst)
    whole = {s.name: global_bytes(s) for s in specs}
    spec_of = {s.name: s for s in specs}
    sources = {f.placement_fragment_id: fragment_bytes(spec_of[f.tensor_id], whole[f.tensor_id], f) for f in src.fragments}
    targets = {f.placement_fragment_id: bytearray(f.nbytes) for f in dst.fragments}
    assert execute_plan(plan, sources, targets, nthreads=nthreads) == plan.total_bytes
    for f in dst.fragments:
        assert bytes(targets[f.placement_fragment_id]) == fragment_bytes(spec_of[f.tensor_id], whole[f.tensor_id], f)
    return plan, sources, targets


@pytest.mark.parametrize(("src", "dst"), [(2, 4), (4, 2), (2, 3), (1, 8)])
def test_execute_moves_every_byte(src: int, dst: int) -> None:
    specs = (Spec("a", (24, 8)), Spec("b", (6, 24), tp_dim=1), Spec("c", (2, 6, 24), tp_dim=2), Spec("n", (24,), tp_dim=None))
    _run(specs, placement(specs, tp=src, dp=1, prefix="a"), placement(specs, tp=dst, dp=2, prefix="b"))


def test_execute_refuses_bad_buffers() -> None:
    specs = (ROWS,)
    plan, sources, targets = _run(specs, placement(specs, tp=2, prefix="a"), placement(specs, tp=4, prefix="b"))
    some_target = next(iter(targets))
    with pytest.raises(ValueError, match="holds 8 bytes"):
        execute_plan(plan, sources, {**targets, some_target: bytearray(8)})
    with pytest.raises(ValueError, match="read-only"):
        execute_plan(plan, sources, {**targets, some_target: bytes(32)})
    with pytest.raises(KeyError, match="no source buffer"):
        execute_plan(plan, {}, targets)
    shared = bytearray(64)
    aliased = {k: memoryview(shared)[:32] for k in targets}
    with pytest.raises(ValueError, match="overlaps"):
        execute_plan(plan, sources, aliased)
