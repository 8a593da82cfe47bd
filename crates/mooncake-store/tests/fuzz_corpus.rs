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
use mooncake_store::master::oplog::{
    OwnedClientOp, OwnedDiskOp, OwnedEntry, OwnedMutation, OwnedObjectOp, OwnedSegmentOp,
    OwnedSegments, OwnedTaskOp, OwnedWrite, Placed,
};
use mooncake_store::master::snapshot::format::{self as snapshot, SnapshotMeta};
use mooncake_store::master::{MasterConfig, MasterService, OffloadPolicy};
use mooncake_store::proto::frame::{encode_frame, LEN_PREFIX};
use mooncake_store::proto::wire::Encode;
use mooncake_store::proto::{Frames, Request, Response};
use mooncake_store::types::{
    DiskDescriptor, GetReplicaListResponse, MemoryDescriptor, OffloadBatch, OffloadTask,
    ReplicaDesc, ReplicaKind, ReplicaStatus, ReplicateConfig, SegmentInfo, StorageConfig,
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

fn config() -> ReplicateConfig {
    ReplicateConfig {
        replica_num: 2,
        with_soft_pin: true,
        with_hard_pin: false,
        preferred_segment: "node0:12345".into(),
        preferred_segments: vec!["node1:12345".into()],
        prefer_alloc_in_same_node: true,
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

fn requests() -> Vec<Request<'static>> {
    let keys = || vec!["k0", "k1", ""];
    vec![
        Request::Ping { client_id: CLIENT },
        Request::MountSegment {
            client_id: CLIENT,
            segment: SegmentInfo {
                name: "node0:12345".into(),
                base: 0x7f00_0000_0000,
                size: 1 << 30,
                transport_endpoint: "10.0.0.1:12345".into(),
            },
        },
        Request::UnmountSegment {
            client_id: CLIENT,
            name: "node0:12345",
        },
        Request::PutStart {
            client_id: CLIENT,
            key: "k0",
            value_len: 1 << 20,
            config: config(),
            upsert: false,
        },
        Request::BatchPutStart {
            client_id: CLIENT,
            keys: keys(),
            value_lens: vec![1, 300, 1 << 40],
            config: ReplicateConfig::default(),
            upsert: true,
        },
        Request::PutEnd {
            client_id: CLIENT,
            key: "k0",
        },
        Request::BatchPutEnd {
            client_id: CLIENT,
            keys: keys(),
        },
        Request::PutRevoke {
            client_id: CLIENT,
            key: "k0",
        },
        Request::BatchPutRevoke {
            client_id: CLIENT,
            keys: keys(),
        },
        Request::GetReplicaList { key: "k0" },
        Request::BatchGetReplicaList { keys: keys() },
        Request::ExistKey { key: "k0" },
        Request::BatchExistKey { keys: keys() },
        Request::GetSize { key: "k0" },
        Request::Remove {
            key: "k0",
            force: true,
        },
        Request::BatchRemove {
            keys: keys(),
            force: false,
        },
        Request::RemoveByRegex {
            pattern: "^k[0-9]+$",
            force: false,
        },
        Request::RemoveAll { force: true },
        Request::BatchReplicaClear {
            client_id: CLIENT,
            keys: keys(),
            segment_name: "node0:12345",
        },
        Request::CreateCopyTask {
            key: "k0",
            targets: vec!["node1:1", "node2:2"],
        },
        Request::CreateMoveTask {
            key: "k0",
            source: "node0:12345",
            target: "node1:1",
        },
        Request::QueryTask { id: TASK },
        Request::FetchTasks {
            client_id: CLIENT,
            max: 16,
        },
        Request::MarkTaskComplete {
            client_id: CLIENT,
            id: TASK,
            success: false,
            message: "segment gone",
        },
        Request::ReplicaTransferStart {
            client_id: CLIENT,
            key: "k0",
            source: "node0:12345",
            targets: vec!["node1:1"],
        },
        Request::ReplicaTransferEnd {
            client_id: CLIENT,
            key: "k0",
        },
        Request::ReplicaTransferRevoke {
            client_id: CLIENT,
            key: "k0",
        },
        Request::MountLocalDisk {
            client_id: CLIENT,
            tier_id: "tier-0",
            endpoint: "node0:12346",
            capacity: 1 << 30,
        },
        Request::FetchOffloadTasks {
            client_id: CLIENT,
            max: 64,
        },
        Request::NotifyOffload {
            client_id: CLIENT,
            keys: keys(),
            sizes: vec![1, 2, 0],
            restore: false,
        },
        Request::NotifyOffloadFailure {
            client_id: CLIENT,
            keys: keys(),
        },
        Request::EvictDiskReplicas {
            client_id: CLIENT,
            keys: keys(),
        },
        Request::PromotionStart {
            client_id: CLIENT,
            key: "k0",
        },
        Request::ReplicationPull {
            standby: "127.0.0.1:50052",
            after: 41,
            after_term: 3,
            applied: 40,
            max: 256,
            wait_ms: 50,
        },
        Request::Authenticate { token: "s3cret" },
        Request::GetStorageConfig {},
        Request::MountSharedFs { client_id: CLIENT },
        Request::FetchFileTasks {
            client_id: CLIENT,
            max: 64,
        },
        Request::NotifyFileCopies {
            client_id: CLIENT,
            keys: keys(),
            sizes: vec![1, 2, 0],
            failed: vec!["k3"],
            removed: vec!["k4"],
        },
        Request::SnapshotFetch {
            standby: "127.0.0.1:50052",
            seq: 200_002,
            offset: 4 << 20,
        },
    ]
}

fn responses() -> Vec<(String, Response)> {
    let list = GetReplicaListResponse {
        replicas: replicas(),
        lease_ttl_ms: 5000,
    };
    let task = TaskInfo {
        id: TASK,
        task_type: TaskType::ReplicaMove,
        status: TaskStatus::Processing,
        created_at_ms_epoch: 1_700_000_000_000,
        last_updated_at_ms_epoch: 1_700_000_000_500,
        assigned_client: CLIENT,
        message: String::new(),
    };
    let assignment = TaskAssignment {
        id: TASK,
        task_type: TaskType::ReplicaCopy,
        key: "k0".into(),
        source: "node0:12345".into(),
        targets: vec!["node1:1".into()],
    };
    let ok = [
        Response::Unit { result: Ok(()) },
        Response::Units {
            results: vec![Ok(()), Err(not_found())],
        },
        Response::Replicas {
            result: Ok(replicas()),
        },
        Response::BatchReplicas {
            results: vec![Ok(replicas()), Err(not_found())],
        },
        Response::ReplicaList {
            result: Ok(list.clone()),
        },
        Response::BatchReplicaList {
            results: vec![Ok(list), Err(not_found())],
        },
        Response::Bool { result: Ok(true) },
        Response::Bools {
            results: vec![Ok(true), Ok(false), Err(not_found())],
        },
        Response::Count { result: Ok(4096) },
        Response::Failed {
            error: Error::new(ErrorCode::DESERIALIZE_FAIL, "truncated message"),
        },
        Response::Keys {
            result: Ok(vec!["k0".into(), "k1".into()]),
        },
        Response::Task { result: Ok(TASK) },
        Response::TaskState { result: Ok(task) },
        Response::Tasks {
            result: Ok(vec![assignment]),
        },
        Response::Offload {
            result: Ok(OffloadBatch {
                tasks: vec![OffloadTask {
                    key: "k0".into(),
                    size: 4096,
                    address: 0x7f00_0000_0000,
                    idle_ms: 3,
                }],
                removes: vec!["k1".into()],
                promotions: vec!["k2".into()],
            }),
        },
        Response::Storage {
            result: Ok(StorageConfig {
                fsdir: "/mnt/mooncake/cluster".into(),
                enable_disk_eviction: true,
                quota_bytes: 1 << 30,
            }),
        },
        Response::Entries {
            term: 3,
            committed: 42,
            leader_now: 1_700_000_000_000,
            frames: Frames(b"MCOL entry frames".to_vec()),
        },
        Response::SnapshotChunk {
            seq: 200_002,
            term: 3,
            leader_now: 1_700_000_000_000,
            offset: 0,
            total: 19,
            chunk: Frames(b"MCSN snapshot bytes".to_vec()),
        },
    ];
    let mut out: Vec<(String, Response)> = ok.into_iter().map(|r| (snake(r.name()), r)).collect();
    // Each single-result answer as an error too.
    for r in [
        Response::Unit { result: err() },
        Response::Replicas { result: err() },
        Response::ReplicaList { result: err() },
        Response::Bool { result: err() },
        Response::Count { result: err() },
        Response::Keys { result: err() },
        Response::Task { result: err() },
        Response::TaskState { result: err() },
        Response::Tasks { result: err() },
        Response::Offload { result: err() },
    ] {
        out.push((format!("{}_error", snake(r.name())), r));
    }
    out
}

fn dummy_requests() -> Vec<DummyRequest> {
    let keys = || vec!["k0".to_string(), "k1".to_string()];
    vec![
        DummyRequest::Hello {
            shm_name: "mooncake-dummy-4242-1".into(),
            region_len: 1 << 30,
            pid: 4242,
            fd: 17,
        },
        DummyRequest::Attach { session: 7 },
        DummyRequest::Write {
            upsert: true,
            config: config(),
            items: vec![WriteItem {
                key: "k0".into(),
                parts: vec![Span { off: 0, len: 4096 }, Span { off: 8192, len: 1 }],
            }],
        },
        DummyRequest::ReadInto {
            items: vec![ReadItem {
                key: "k0".into(),
                dests: vec![Span {
                    off: 4096,
                    len: 4097,
                }],
            }],
        },
        DummyRequest::ReadRanges {
            items: vec![RangeItem {
                buffer: Span {
                    off: 0,
                    len: 1 << 20,
                },
                key: "k0".into(),
                dst_off: 16,
                src_off: 100,
                len: 200,
            }],
        },
        DummyRequest::GetSize { keys: keys() },
        DummyRequest::IsExist { keys: keys() },
        DummyRequest::Remove {
            keys: keys(),
            force: false,
        },
        DummyRequest::RemoveByRegex {
            pattern: "^k".into(),
            force: true,
        },
        DummyRequest::RemoveAll { force: false },
        DummyRequest::ReplicaDesc { keys: keys() },
        DummyRequest::Health {},
        DummyRequest::CreateCopyTask {
            key: "k0".into(),
            targets: vec!["node1:1".into()],
        },
        DummyRequest::CreateMoveTask {
            key: "k0".into(),
            source: "node0:12345".into(),
            target: "node1:1".into(),
        },
        DummyRequest::QueryTask { id: TASK },
        DummyRequest::BatchReplicaClear {
            keys: keys(),
            segment_name: "node0:12345".into(),
        },
        DummyRequest::Authenticate {
            token: "s3cret".into(),
        },
    ]
}

fn dummy_responses() -> Vec<DummyResponse> {
    vec![
        DummyResponse::Session {
            session: 7,
            client_id: CLIENT,
            hostname: "node0:12345".into(),
        },
        DummyResponse::Unit {
            result: Err(not_found()),
        },
        DummyResponse::Units {
            result: Ok(vec![Ok(()), Err(not_found())]),
        },
        DummyResponse::Counts {
            result: Ok(vec![Ok(4096), Err(not_found())]),
        },
        DummyResponse::Bools {
            result: Ok(vec![Ok(true), Ok(false)]),
        },
        DummyResponse::Count { result: Ok(3) },
        DummyResponse::Replicas {
            result: Ok(vec![Ok(replicas()), Err(not_found())]),
        },
        DummyResponse::Task { result: Ok(TASK) },
        DummyResponse::TaskState {
            result: Err(Error::new(ErrorCode::TASK_NOT_FOUND, "task")),
        },
        DummyResponse::Keys {
            result: Ok(vec!["k0".into()]),
        },
    ]
}

/// A Lease as the API server returns it.
fn lease(record: &LeaseRecord, version: &str) -> Vec<u8> {
    serde_json::to_vec_pretty(&json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "mooncake-master",
            "namespace": "default",
            "resourceVersion": version,
            "uid": "5f0c2a4e-1b7c-4d7e-9a0e-3c1f2b9d8e70",
            "creationTimestamp": "2024-01-01T00:00:00Z",
        },
        "spec": record.to_spec(),
    }))
    .unwrap()
}

fn lease_seeds() -> Seeds {
    let now = UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
    let held = LeaseRecord::acquired("10.0.0.1:50051", 5, 3, now);
    let renewed = held.renewed(5, now + Duration::from_secs(1));
    let released = renewed.released(now + Duration::from_secs(2));
    let mut seeds = Seeds::new();
    seeds.insert("held".into(), lease(&held, "100"));
    seeds.insert("renewed".into(), lease(&renewed, "101"));
    seeds.insert("released".into(), lease(&released, "102"));
    seeds.insert(
        "no_spec".into(),
        br#"{"kind":"Lease","metadata":{"resourceVersion":"1"}}"#.to_vec(),
    );
    seeds.insert(
        "status_conflict".into(),
        serde_json::to_vec(&json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "Operation cannot be fulfilled on leases.coordination.k8s.io \"mooncake-master\": the object has been modified",
            "reason": "Conflict", "code": 409,
        }))
        .unwrap(),
    );
    seeds.insert(
        "offset_time".into(),
        b"2024-02-29T23:59:59.999999999+05:30".to_vec(),
    );
    seeds
}

/// Kubeconfigs: the fuzz target only loads files without path separators
/// (but for `http(s)://`), escapes or tags, so these have none.
fn kubeconfig_seeds() -> Seeds {
    let mut seeds = Seeds::new();
    seeds.insert(
        "token".into(),
        b"apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    insecure-skip-tls-verify: true
contexts:
- name: dev
  context:
    cluster: c
    user: u
users:
- name: u
  user:
    token: abc.def
"
        .to_vec(),
    );
    seeds.insert(
        "client_cert_data".into(),
        b"current-context: prod
clusters:
- name: prod
  cluster:
    server: https://k8s.example:443
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
contexts:
- name: prod
  context: {cluster: prod, user: admin}
users:
- name: admin
  user:
    client-certificate-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
    client-key-data: LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCg==
"
        .to_vec(),
    );
    seeds.insert(
        "files_and_basic".into(),
        b"current-context: a
clusters:
- {name: a, cluster: {server: http://h:8080, certificate-authority: ca.crt}}
contexts:
- {name: a, context: {cluster: a, user: b}}
users:
- {name: b, user: {username: admin, password: secret, tokenFile: token}}
"
        .to_vec(),
    );
    seeds.insert(
        "exec_plugin".into(),
        b"current-context: a
clusters: [{name: a, cluster: {server: https://h}}]
contexts: [{name: a, context: {cluster: a, user: e}}]
users: [{name: e, user: {exec: {command: aws, args: [eks, get-token]}}}]
"
        .to_vec(),
    );
    seeds
}

#[test]
fn master_protocol_seeds() {
    let requests: Vec<(String, Request<'static>)> = requests()
        .into_iter()
        .map(|r| (snake(r.name()), r))
        .collect();
    // Every request and response type has a seed.
    for tag in Request::TAGS {
        let name = snake(Request::name_of(*tag));
        assert!(requests.iter().any(|(n, _)| *n == name), "{name}");
    }
    let responses = responses();
    for tag in Response::TAGS {
        let name = snake(Response::name_of(*tag));
        assert!(responses.iter().any(|(n, _)| *n == name), "{name}");
    }
    check_or_write(
        "mooncake-store",
        "master_request",
        &payload_seeds(&requests),
    );
    check_or_write(
        "mooncake-store",
        "master_response",
        &payload_seeds(&responses),
    );
}

#[test]
fn dummy_protocol_seeds() {
    let requests: Vec<(String, DummyRequest)> = dummy_requests()
        .into_iter()
        .map(|r| (snake(r.name()), r))
        .collect();
    let responses: Vec<(String, DummyResponse)> = dummy_responses()
        .into_iter()
        .map(|r| (snake(r.name()), r))
        .collect();
    for tag in DummyRequest::TAGS {
        let name = snake(DummyRequest::name_of(*tag));
        assert!(requests.iter().any(|(n, _)| *n == name), "{name}");
    }
    for tag in DummyResponse::TAGS {
        let name = snake(DummyResponse::name_of(*tag));
        assert!(responses.iter().any(|(n, _)| *n == name), "{name}");
    }
    check_or_write("mooncake-store", "dummy_request", &payload_seeds(&requests));
    check_or_write(
        "mooncake-store",
        "dummy_response",
        &payload_seeds(&responses),
    );
}

#[test]
fn k8s_seeds() {
    let kubeconfigs = kubeconfig_seeds();
    for (name, text) in &kubeconfigs {
        let rest = String::from_utf8_lossy(text)
            .replace("https://", "")
            .replace("http://", "");
        assert!(
            !rest.contains(['/', '\\', '!']),
            "{name}: the target would skip it"
        );
    }
    check_or_write("mooncake-store", "k8s_lease", &lease_seeds());
    check_or_write("mooncake-store", "kubeconfig", &kubeconfigs);
}

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
    let cfg = |soft, hard| ReplicateConfig {
        replica_num: 1,
        with_soft_pin: soft,
        with_hard_pin: hard,
        ..ReplicateConfig::default()
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
        let back = mooncake_store::master::oplog::decode(&frame).unwrap();
        assert_eq!(&back.mutations[0], m, "{name}");
    }
    let snapshots = snapshot_seeds();
    for (name, bytes) in &snapshots {
        let s = MasterService::new(&MasterConfig::default());
        let progress = mooncake_store::master::snapshot::RestoreProgress::default();
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
