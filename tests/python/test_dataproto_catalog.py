"""`mooncake.dataproto_catalog.DataProtoCatalog` and the DataProto ref
handles it stores: the reference's three catalog cases (merged tags,
fragmented fields resolved in key order, replaced and removed locations,
refusals that change nothing), and the handle format both ways."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mooncake.dataproto_catalog import DataProtoCatalog
from mooncake.structured_object_store import (
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredFieldLocation,
    export_dataproto_ref,
    import_dataproto_ref,
)


def handle(name, fields, batch_size=2):
    return {
        "type": "mooncake_dataproto_ref",
        "version": 1,
        "kind": "bundle_stages",
        "batch_size": batch_size,
        "stage_refs": {"rollout": {"manifest_key": f"manifest/{name}"}},
        "field_index": {
            f: {"stage": "rollout", "member": f"batch.{f}", "section": "batch"} for f in fields
        },
    }


def test_tags_merge_and_fragmented_fields_resolve_in_key_order():
    c = DataProtoCatalog()
    c.update("train", ["a", "b"], tags=[{"status": "running"}] * 2,
             handle=handle("base", ["input_ids", "attention_mask"]))
    res = c.update("train", ["b", "a"], tags=[{"status": "done"}] * 2,
                   handle=handle("scores", ["score"]))
    assert res["fields"] == ["input_ids", "attention_mask", "score"]
    assert c.list("train") == {"train": {"a": {"status": "done"}, "b": {"status": "done"}}}
    plan = c.resolve("train", ["a", "b"], ["score", "input_ids"])
    assert plan["fields"] == ["score", "input_ids"]
    assert plan["field_groups"] == [
        {"fields": ["score"], "locations": [("manifest/scores", 1), ("manifest/scores", 0)]},
        {"fields": ["input_ids"], "locations": [("manifest/base", 0), ("manifest/base", 1)]},
    ]
    assert set(plan["handles"]) == {"manifest/base", "manifest/scores"}
    assert c.resolve("train", ["a", "b"])["fields"] == ["input_ids", "attention_mask", "score"]
    grouped = c.resolve("train", ["b", "a"], ["input_ids", "attention_mask"])
    assert grouped["field_groups"] == [
        {"fields": ["input_ids", "attention_mask"],
         "locations": [("manifest/base", 1), ("manifest/base", 0)]}
    ]


def test_replaced_and_removed_locations_are_dropped():
    c = DataProtoCatalog()
    base = handle("base", ["value"])
    c.update("train", ["a", "b"], handle=base)
    c.update("train", ["a"], handle={**handle("replacement", ["value"]), "batch_size": 1})
    c.update("train", ["b", "a"], handle=base)
    plan = c.resolve("train", ["a", "b"], ["value"])
    assert plan["field_groups"] == [
        {"fields": ["value"], "locations": [("manifest/base", 1), ("manifest/base", 0)]}
    ]
    # The replacement fragment lost its last use and is forgotten.
    assert set(plan["handles"]) == {"manifest/base"}
    assert set(c._handles) == {"manifest/base"}
    c.remove("train", ["b"])
    c.remove("train", ["a"])
    assert c.list() == {}
    assert c._handles == {} and c._uses == {}


def test_refusals_change_nothing():
    c = DataProtoCatalog()
    c.update("train", ["a", "b"], tags=[{}, {}])
    c.update("train", ["a"], handle=handle("one", ["value"], batch_size=1))
    with pytest.raises(ValueError, match="were not found"):
        c.resolve("train", ["missing"])
    with pytest.raises(ValueError, match="not ready"):
        c.resolve("train", ["a", "b"], ["value"])
    with pytest.raises(ValueError, match="do not contain any fields"):
        c.resolve("train", ["b"])
    with pytest.raises(ValueError, match="same length"):
        c.update("train", ["a", "b"], tags=[{}])
    with pytest.raises(ValueError, match="sequence"):
        c.resolve("train", "a")
    with pytest.raises(ValueError, match="sequence"):
        c.resolve("train", ["a"], "value")
    bad = handle("invalid", ["value"], batch_size=1)
    bad["version"] = 999
    with pytest.raises(ValueError, match="unsupported.*version"):
        c.update("invalid", ["a"], handle=bad)
    multi = handle("multi", ["value"], batch_size=1)
    multi["stage_refs"]["extra"] = {"manifest_key": "manifest/extra"}
    with pytest.raises(ValueError, match="exactly one.*stage"):
        c.update("invalid", ["a"], handle=multi)
    with pytest.raises(ValueError, match="does not match"):
        c.update("invalid", ["a", "b"], handle=handle("x", ["v"], batch_size=1))
    with pytest.raises(ValueError, match="collision"):
        c.update("train", ["a"], handle={**handle("one", ["other"], batch_size=1)})
    with pytest.raises(ValueError, match="unique"):
        c.update("train", ["a", "a"], tags=[{}, {}])
    with pytest.raises(ValueError, match="requires tags or"):
        c.update("train", ["a"])
    with pytest.raises(TypeError):
        c.update("train", ["a"], tags=["not a mapping"])
    assert c.list("train") == {"train": {"a": {}, "b": {}}}
    assert "invalid" not in c.list()
    assert c.resolve("train", ["a"])["fields"] == ["value"]


def test_results_are_copies():
    c = DataProtoCatalog()
    res = c.update("p", ["k"], tags=[{"nested": {"n": 1}}], handle=handle("h", ["f"], 1))
    res["tags"][0]["nested"]["n"] = 2
    c.list("p")["p"]["k"]["nested"]["n"] = 3
    c.resolve("p", ["k"])["handles"]["manifest/h"]["batch_size"] = 99
    assert c.list("p") == {"p": {"k": {"nested": {"n": 1}}}}
    assert c.resolve("p", ["k"])["handles"]["manifest/h"]["batch_size"] == 1


def test_handles_round_trip_and_are_json():
    ref = MooncakeDataProtoRef(
        batch_size=3,
        stage_refs={"rollout": RemoteBundleRef("m/r", {}), "reward": RemoteBundleRef("m/s", {})},
        field_index={
            "ids": StructuredFieldLocation("rollout", "batch.ids", "batch"),
            "score": StructuredFieldLocation("reward", "non_tensor_batch.score", "non_tensor_batch"),
        },
        meta_info={"temperature": np.float32(0.5), "shape": np.arange(3)},
        global_indexes=[4, 5, 6],
    )
    h = export_dataproto_ref(ref)
    assert json.loads(json.dumps(h)) == h
    assert h["meta_info"] == {"temperature": 0.5, "shape": [0, 1, 2]}
    back = import_dataproto_ref(h)
    assert back.field_index == ref.field_index and back.global_indexes == [4, 5, 6]
    assert {s: r.manifest_key for s, r in back.stage_refs.items()} == {"rollout": "m/r", "reward": "m/s"}
    assert "storage_group_id" not in h
    v2 = {**h, "version": 2}
    with pytest.raises(ValueError, match="storage_group_id"):
        import_dataproto_ref(v2)
    assert import_dataproto_ref({**v2, "storage_group_id": "g"})._storage_group_id == "g"
    with pytest.raises(TypeError):
        export_dataproto_ref(h)
    with pytest.raises(TypeError):
        export_dataproto_ref(MooncakeDataProtoRef(1, {}, {}, {"x": object()}))


@pytest.mark.parametrize(
    "patch, match",
    [
        ({"type": "other"}, "not a Mooncake"),
        ({"kind": "flat"}, "kind"),
        ({"stage_refs": []}, "mapping"),
        ({"stage_refs": {"s": {"manifest_key": ""}}}, "non-empty"),
        ({"field_index": {"f": {"stage": "rollout", "member": "m", "section": "meta"}}}, "section"),
        ({"field_index": {"f": {"stage": "nope", "member": "m", "section": "batch"}}}, "unknown stage"),
        ({"global_indexes": [1, True]}, "global_indexes"),
        ({"batch_size": "many"}, "batch_size"),
    ],
)
def test_malformed_handles_name_what_is_wrong(patch, match):
    with pytest.raises(ValueError, match=match):
        import_dataproto_ref({**handle("h", ["f"]), **patch})
