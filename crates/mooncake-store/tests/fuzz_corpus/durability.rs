//! Seeds for the oplog entry and snapshot targets.

use super::*;

fn segment_info(name: &str) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        base: 0x7f00_0000_0000,
        size: 64 << 20,
        transport_endpoint: "10.0.0.1:12345".into(),
    }
}

/// One mutation of every kind the log carries.
fn log_mutations() -> Vec<(&'static str, OwnedMutation)> {
    let at = |segment, offset| Placed { segment, offset };
    let object = |key: &str, op| OwnedMutation::Object {
        key: key.into(),
        op,
    };
    let put_start = |write| OwnedObjectOp::PutStart {
        client: 7,
        size: 4096,
        pins: 4,
        now: 1_000,
        write,
    };
    vec![
        (
            "segment_mount",
            OwnedMutation::Segment(OwnedSegmentOp::Mount {
                id: 1,
                owner: 7,
                info: segment_info("node0:12345"),
            }),
        ),
        (
            "segment_unmount",
            OwnedMutation::Segment(OwnedSegmentOp::Unmount {
                name: "node0:12345".into(),
            }),
        ),
        (
            "client_register",
            OwnedMutation::Client(OwnedClientOp::Register {
                client: 7,
                now: 1_000,
            }),
        ),
        (
            "client_expire",
            OwnedMutation::Client(OwnedClientOp::Expire { client: 7 }),
        ),
        (
            "put_start_fresh",
            object(
                "key",
                put_start(OwnedWrite::Fresh(vec![at(1, 0), at(2, 8192)])),
            ),
        ),
        (
            "put_start_in_place",
            object("key", put_start(OwnedWrite::InPlace)),
        ),
        (
            "put_start_replacing",
            object("key", put_start(OwnedWrite::Replacing(vec![at(1, 4096)]))),
        ),
        (
            "put_end",
            object(
                "key",
                OwnedObjectOp::PutEnd {
                    now: 1_010,
                    readers_until: 6_000,
                },
            ),
        ),
        ("put_revoke", object("key", OwnedObjectOp::PutRevoke)),
        (
            "group",
            object(
                "key",
                OwnedObjectOp::Group {
                    group: "group0".into(),
                },
            ),
        ),
        (
            "discard_put",
            object(
                "key",
                OwnedObjectOp::DiscardPut {
                    free_at: Some(2_000),
                    now: 1_500,
                },
            ),
        ),
        (
            "remove",
            object("key", OwnedObjectOp::Remove { now: 3_000 }),
        ),
        (
            "drop_replicas_named",
            object(
                "key",
                OwnedObjectOp::DropReplicas {
                    on: OwnedSegments::Named("node0:12345".into()),
                    free_at: 3_000,
                    now: 3_000,
                },
            ),
        ),
        (
            "drop_replicas_unmounted",
            object(
                "key",
                OwnedObjectOp::DropReplicas {
                    on: OwnedSegments::Unmounted,
                    free_at: 3_000,
                    now: 3_000,
                },
            ),
        ),
        (
            "transfer_start",
            object(
                "key",
                OwnedObjectOp::TransferStart {
                    client: 7,
                    now: 2_000,
                    replicas: vec![at(2, 0)],
                    drop_source: Some("node0:12345".into()),
                },
            ),
        ),
        (
            "transfer_end",
            object(
                "key",
                OwnedObjectOp::TransferEnd {
                    now: 2_100,
                    readers_until: 2_000,
                },
            ),
        ),
        (
            "transfer_revoke",
            object("key", OwnedObjectOp::TransferRevoke),
        ),
        (
            "task_create",
            OwnedMutation::Task(OwnedTaskOp::Create {
                task: TaskAssignment {
                    id: 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
                    task_type: TaskType::ReplicaMove,
                    key: "key".into(),
                    source: "node0:12345".into(),
                    targets: vec!["node1:12345".into()],
                },
                executor: 7,
                now: 2_000,
            }),
        ),
        (
            "task_start",
            OwnedMutation::Task(OwnedTaskOp::Start {
                ids: vec![1, 2],
                now: 2_000,
            }),
        ),
        (
            "task_finish",
            OwnedMutation::Task(OwnedTaskOp::Finish {
                id: 1,
                status: TaskStatus::Success,
                message: "done".into(),
                now: 2_200,
            }),
        ),
        (
            "disk_mount_tier",
            OwnedMutation::Disk(OwnedDiskOp::MountTier {
                client: 7,
                tier_id: "/mnt/ssd".into(),
                endpoint: "10.0.0.1:12346".into(),
                capacity: 1 << 30,
            }),
        ),
        (
            "disk_unmount_tier",
            OwnedMutation::Disk(OwnedDiskOp::UnmountTier { client: 7 }),
        ),
        (
            "disk_add_copy",
            OwnedMutation::Disk(OwnedDiskOp::AddCopy {
                client: 7,
                key: "key".into(),
                size: 4096,
            }),
        ),
        (
            "disk_drop_copy",
            OwnedMutation::Disk(OwnedDiskOp::DropCopy { key: "key".into() }),
        ),
        ("free_retired", OwnedMutation::FreeRetired { now: 4_000 }),
        (
            "reserve",
            OwnedMutation::Reserve {
                segment: 1,
                offset: 1 << 20,
                len: 1 << 20,
            },
        ),
        (
            "unreserve",
            OwnedMutation::Unreserve {
                segment: 1,
                offset: 1 << 20,
                len: 1 << 20,
                free_at: 64_000,
                now: 4_000,
            },
        ),
    ]
}

/// Seeds for `oplog_entry`: an entry per kind of mutation, one entry
/// carrying them all, and a stream of entries as a log file holds them.
fn oplog_seeds() -> Seeds {
    let mutations = log_mutations();
    let entry = |seq, mutations| OwnedEntry {
        seq,
        term: 3,
        mutations,
    };
    let mut seeds: Seeds = mutations
        .iter()
        .map(|(name, m)| (name.to_string(), entry(1, vec![m.clone()]).to_frame()))
        .collect();
    let all = mutations.iter().map(|(_, m)| m.clone()).collect();
    seeds.insert("all".into(), entry(1, all).to_frame());
    let mut stream = Vec::new();
    for (seq, (_, m)) in (1..).zip(&mutations) {
        entry(seq, vec![m.clone()]).encode_into(&mut stream);
    }
    seeds.insert("stream".into(), stream);
    seeds
}

/// Seeds for `snapshot`: snapshots of masters the public calls built.
/// Each holds at most one object (a snapshot lists objects in hash order).
fn snapshot_seeds() -> Seeds {
    let meta = SnapshotMeta {
        seq: 42,
        term: 3,
        now: 5_000,
    };
    let master = || {
        let s = MasterService::new(&MasterConfig::default());
        s.mount_segment(7, &segment_info("node0:12345"), 1_000)
            .unwrap();
        s
    };
    let cfg = |soft, hard| ReplicaPolicy {
        replica_num: 1,
        with_soft_pin: soft,
        with_hard_pin: hard,
        ..ReplicaPolicy::default()
    };
    let mut seeds = Seeds::new();
    seeds.insert(
        "empty".into(),
        snapshot::encode(&MasterService::new(&MasterConfig::default()), meta),
    );
    seeds.insert("segment".into(), snapshot::encode(&master(), meta));
    let complete = master();
    complete
        .put_start(7, "key", 4096, &cfg(true, false), false, 2_000)
        .unwrap();
    complete.put_end(7, "key", 2_010).unwrap();
    seeds.insert("object".into(), snapshot::encode(&complete, meta));
    // One object: the order of several depends on the map's hashing.
    let grouped = master();
    let in_group = ReplicaPolicy {
        group_ids: Some(vec!["group0".into()]),
        ..cfg(false, false)
    };
    grouped
        .put_start(7, "key", 4096, &in_group, false, 2_000)
        .unwrap();
    grouped.put_end(7, "key", 2_010).unwrap();
    seeds.insert("groups".into(), snapshot::encode(&grouped, meta));
    let upsert = master();
    upsert
        .put_start(7, "key", 4096, &cfg(false, true), false, 2_000)
        .unwrap();
    upsert.put_end(7, "key", 2_010).unwrap();
    upsert
        .put_start(7, "key", 8192, &cfg(false, false), true, 3_000)
        .unwrap();
    seeds.insert("upsert_in_flight".into(), snapshot::encode(&upsert, meta));
    // An upsert ending while a reader holds the lease on the old
    // version: the old space stays retired until the lease runs out.
    let removed = master();
    removed
        .put_start(7, "key", 4096, &cfg(false, false), false, 2_000)
        .unwrap();
    removed.put_end(7, "key", 2_010).unwrap();
    assert!(removed.exist_key("key", 2_015).unwrap());
    removed
        .put_start(7, "key", 8192, &cfg(false, false), true, 2_020)
        .unwrap();
    removed.put_end(7, "key", 2_030).unwrap();
    seeds.insert("retired".into(), snapshot::encode(&removed, meta));
    let tier = MasterService::new(&MasterConfig::default()).with_offload_policy(OffloadPolicy {
        enabled: true,
        ..OffloadPolicy::default()
    });
    tier.mount_local_disk(7, "/mnt/ssd", "10.0.0.1:12346", 1 << 30, 1_000)
        .unwrap();
    seeds.insert("disk_tier".into(), snapshot::encode(&tier, meta));
    seeds
}

#[test]
fn master_durability_seeds() {
    let mutations = log_mutations();
    for (name, m) in &mutations {
        let frame = OwnedEntry {
            seq: 1,
            term: 3,
            mutations: vec![m.clone()],
        }
        .to_frame();
        let back = mooncake_store::master::durable::oplog::decode(&frame).unwrap();
        assert_eq!(&back.mutations[0], m, "{name}");
    }
    let snapshots = snapshot_seeds();
    for (name, bytes) in &snapshots {
        let s = MasterService::new(&MasterConfig::default());
        let progress = mooncake_store::master::durable::snapshot::RestoreProgress::default();
        snapshot::decode_into(bytes, &s, &progress).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            &snapshot::encode(&s, snapshot::read_meta(bytes).unwrap()),
            bytes,
            "{name}"
        );
    }
    check_or_write("mooncake-store", "oplog_entry", &oplog_seeds());
    check_or_write("mooncake-store", "snapshot", &snapshots);
}
