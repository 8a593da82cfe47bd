"""Weights from a trainer's TP 2 layout to a rollout's TP 4 layout through
Mooncake Store: the trainer packs each rank's shards into one object and
commits a WeightManifest beside them; the rollout reads the manifest, plans
from it (plan_stored_transfer_to_target_placement), reads the objects and
runs the plan into its own shards. Every byte is checked."""

from __future__ import annotations

from collections import defaultdict

from mooncake.reshard.weight import (
    StoredFragment,
    WeightManifest,
    plan_stored_transfer_to_target_placement,
)
from mooncake.reshard.weight.execute import execute_plan

from reshard_cases import GENERATION, RESOURCE, REVISION, Spec, fragment_bytes, global_bytes, placement

SPECS = (
    Spec("embed", (64, 32)),
    Spec("layers.0.qkv", (96, 32)),
    Spec("layers.0.o", (32, 32), tp_dim=1),
    Spec("layers.0.norm", (32,), tp_dim=None),
)


def publish(store, group: str, trainer, shards: dict[str, bytes]) -> WeightManifest:
    """One payload object per trainer rank, its shards back to back; the
    manifest names each shard's object and offset. Replicated tensors are
    stored once (from TP rank 0)."""

    by_rank: dict[int, list] = defaultdict(list)
    stored_boxes = set()
    for f in sorted(trainer.fragments, key=lambda f: (f.rank.tp, f.tensor_id)):
        box = (f.tensor_id, f.global_offset, f.local_shape)
        if box not in stored_boxes:
            stored_boxes.add(box)
            by_rank[f.rank.tp].append(f)
    fragments = []
    for rank, owned in by_rank.items():
        key = f"{group}/payload/tp{rank}"
        payload = bytearray()
        for f in owned:
            fragments.append(StoredFragment(f"{key}#{len(payload)}", f.tensor_id, f.global_offset,
                                            f.local_shape, key, len(payload), f.nbytes))
            payload += shards[f.placement_fragment_id]
        assert store.put(key, bytes(payload)) == 0
    manifest = WeightManifest(
        namespace="rl", resource_id=RESOURCE, revision=REVISION, weight_generation=GENERATION, group_id=group,
        manifest_key=f"{group}/manifest", tensors=trainer.tensors, fragments=tuple(fragments),
        created_at="2026-12-07T00:00:00Z",
    )
    assert store.put(manifest.manifest_key, manifest.to_json().encode()) == 0
    return manifest


def test_weights_move_from_tp2_to_tp4_through_the_store(store) -> None:
    trainer = placement(SPECS, tp=2, prefix="trainer")
    rollout = placement(SPECS, tp=4, dp=2, prefix="rollout")
    whole = {s.name: global_bytes(s, seed=GENERATION) for s in SPECS}
    spec_of = {s.name: s for s in SPECS}
    shards = {f.placement_fragment_id: fragment_bytes(spec_of[f.tensor_id], whole[f.tensor_id], f)
              for f in trainer.fragments}
    published = publish(store, "weights/step-7", trainer, shards)

    # The rollout side knows only the manifest key and its own layout.
    manifest = WeightManifest.from_json(store.get("weights/step-7/manifest"))
    assert manifest == published and manifest.manifest_digest == published.manifest_digest
    plan = plan_stored_transfer_to_target_placement(manifest, rollout)
    objects = {key: store.get(key) for key in sorted({op.source.object_key for op in plan.operations})}
    sources = {}
    for op in plan.operations:
        s = op.source
        sources[s.fragment_id] = memoryview(objects[s.object_key])[s.object_offset:s.object_offset + s.nbytes]
    targets = {f.placement_fragment_id: bytearray(f.nbytes) for f in rollout.fragments}
    assert execute_plan(plan, sources, targets) == plan.total_bytes
    for f in rollout.fragments:
        assert bytes(targets[f.placement_fragment_id]) == fragment_bytes(spec_of[f.tensor_id], whole[f.tensor_id], f)
    # Every rollout shard (both DP replicas, the norm on every TP rank) was
    # filled from the one stored copy: two objects, each read once.
    assert plan.total_bytes == sum(f.nbytes for f in rollout.fragments)
    assert sorted(objects) == ["weights/step-7/payload/tp0", "weights/step-7/payload/tp1"]
