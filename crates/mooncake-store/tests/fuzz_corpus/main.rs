//! The fuzz targets' seed corpus (`fuzz/corpus/<target>/`) for this
//! crate's decoders, made by the real encoders: this test fails when the
//! checked-in files differ from what the encoders produce now.
//! `MOONCAKE_FUZZ_CORPUS=write cargo test -p mooncake-store --test fuzz_corpus`
//! rewrites them.

use std::time::{Duration, UNIX_EPOCH};

use mooncake_common::{Error, ErrorCode};
use mooncake_store::client::dummy_proto::{
    DummyRequest, DummyResponse, RangeItem, ReadItem, Span, WriteItem,
};
use mooncake_store::ha::k8s::record::LeaseRecord;
use mooncake_store::master::durable::oplog::{
    OwnedClientOp, OwnedDiskOp, OwnedEntry, OwnedMutation, OwnedObjectOp, OwnedSegmentOp,
    OwnedSegments, OwnedTaskOp, OwnedWrite, Placed,
};
use mooncake_store::master::durable::snapshot::format::{self as snapshot, SnapshotMeta};
use mooncake_store::master::{MasterConfig, MasterService, OffloadPolicy};
use mooncake_store::proto::frame::{encode_frame, LEN_PREFIX};
use mooncake_store::proto::wire::Encode;
use mooncake_store::proto::{Frames, Request, Response};
use mooncake_store::types::{
    DiskDescriptor, GetReplicaListResponse, MemoryDescriptor, OffloadBatch, OffloadTask,
    ReplicaDesc, ReplicaKind, ReplicaPolicy, ReplicaStatus, SegmentInfo, StorageConfig,
    TaskAssignment, TaskInfo, TaskStatus, TaskType,
};
use serde_json::json;
use test_support::corpus::{check_or_write, Seeds};

/// A payload (version byte and message) as a frame carries it.
fn payload<M: Encode + ?Sized>(msg: &M) -> Vec<u8> {
    let mut frame = Vec::new();
    encode_frame(msg, &mut frame).unwrap();
    frame.split_off(LEN_PREFIX)
}

/// Seeds for a payload target: each message on its own, plus all of them
/// as one stream of frames.
fn payload_seeds<M: Encode>(msgs: &[(String, M)]) -> Seeds {
    let mut seeds: Seeds = msgs.iter().map(|(n, m)| (n.clone(), payload(m))).collect();
    let mut stream = Vec::new();
    for (_, m) in msgs {
        encode_frame(m, &mut stream).unwrap();
    }
    seeds.insert("stream".into(), stream);
    seeds
}

fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn config() -> ReplicaPolicy {
    ReplicaPolicy {
        replica_num: 2,
        with_soft_pin: true,
        with_hard_pin: false,
        preferred_segment: "node0:12345".into(),
        preferred_segments: vec!["node1:12345".into()],
        prefer_alloc_in_same_node: true,
        group_ids: Some(vec!["group0".into()]),
    }
}

fn replicas() -> Vec<ReplicaDesc> {
    vec![
        ReplicaDesc {
            kind: ReplicaKind::Memory(MemoryDescriptor {
                segment_name: "node0:12345".into(),
                transport_endpoint: "10.0.0.1:12345".into(),
                buffer_address: 0x7f00_0000_0000,
                size: 4096,
                suspected: false,
            }),
            status: ReplicaStatus::Complete,
        },
        ReplicaDesc {
            kind: ReplicaKind::Disk(DiskDescriptor {
                file_path: "/mnt/ssd/ab/key".into(),
                object_size: 4096,
            }),
            status: ReplicaStatus::Processing,
        },
    ]
}

fn not_found() -> Error {
    Error::new(ErrorCode::OBJECT_NOT_FOUND, "key")
}

fn err<T>() -> Result<T, Error> {
    Err(not_found())
}

const CLIENT: u128 = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;
const TASK: u128 = 42;

mod dummy_protocol;
mod durability;
mod k8s;
mod master_protocol;
