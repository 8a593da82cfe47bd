//! The master wire protocol: every message round-trips, and no byte string
//! (truncated, oversized, random, bit-flipped) makes the decoder panic or
//! allocate beyond the input.

use std::io::Cursor;

use mooncake_common::{Error, ErrorCode};
use mooncake_store::proto::frame::{
    decode_payload, encode_frame, frame_len, read_frame, MAX_FRAME_LEN,
};
use mooncake_store::proto::{Frames, Request, Response, PROTOCOL_VERSION};
use mooncake_store::types::{
    DiskDescriptor, GetReplicaListResponse, MemoryDescriptor, OffloadBatch, OffloadTask,
    ReplicaDesc, ReplicaKind, ReplicaPolicy, ReplicaStatus, SegmentInfo, StorageConfig,
    TaskAssignment, TaskInfo, TaskStatus, TaskType,
};
use proptest::prelude::*;

fn frame_of<M: mooncake_store::proto::Encode>(m: &M) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(m, &mut out).unwrap();
    out
}

/// Strips the length prefix after checking it.
fn payload(frame: &[u8]) -> &[u8] {
    let len = frame_len(frame[..4].try_into().unwrap()).unwrap();
    assert_eq!(len, frame.len() - 4);
    &frame[4..]
}

fn replica(i: u64) -> ReplicaDesc {
    ReplicaDesc {
        kind: ReplicaKind::Memory(MemoryDescriptor {
            segment_name: format!("seg{i}"),
            transport_endpoint: format!("10.0.0.{i}:12345"),
            buffer_address: 0x7f00_0000_0000 + i * 4096,
            size: 4096,
            suspected: i % 2 == 1,
        }),
        status: ReplicaStatus::Complete,
    }
}

fn sample_requests(config: &ReplicaPolicy) -> Vec<Request<'_>> {
    let id = u128::MAX - 7;
    vec![
        Request::Ping { client_id: id },
        Request::MountSegment {
            client_id: id,
            segment: SegmentInfo {
                name: "s".into(),
                base: u64::MAX - 10,
                size: 10,
                transport_endpoint: "h:1".into(),
            },
        },
        Request::UnmountSegment {
            client_id: id,
            name: "s",
        },
        Request::PutStart {
            client_id: id,
            key: "κλειδί",
            value_len: 4096,
            config: config.clone(),
            upsert: true,
        },
        Request::BatchPutStart {
            client_id: id,
            keys: vec!["a", "", "c"],
            value_lens: vec![1, 0, u64::MAX],
            config: config.clone(),
            upsert: false,
        },
        Request::PutEnd {
            client_id: 0,
            key: "k",
        },
        Request::BatchPutEnd {
            client_id: 0,
            keys: vec![],
        },
        Request::PutRevoke {
            client_id: 1,
            key: "k",
        },
        Request::BatchPutRevoke {
            client_id: 1,
            keys: vec!["x"],
        },
        Request::GetReplicaList { key: "k" },
        Request::BatchGetReplicaList {
            keys: vec!["a", "b"],
        },
        Request::ExistKey { key: "k" },
        Request::BatchExistKey { keys: vec!["a"] },
        Request::GetSize { key: "k" },
        Request::Remove {
            key: "k",
            force: true,
        },
        Request::BatchRemove {
            keys: vec!["a", "b"],
            force: false,
        },
        Request::RemoveByRegex {
            pattern: "^a.*$",
            force: true,
        },
        Request::RemoveAll { force: false },
        Request::BatchReplicaClear {
            client_id: 3,
            keys: vec!["a", "b"],
            segment_name: "seg",
        },
        Request::CreateCopyTask {
            key: "k",
            targets: vec!["t1", "t2"],
        },
        Request::CreateMoveTask {
            key: "k",
            source: "s",
            target: "t",
        },
        Request::QueryTask { id: u128::MAX },
        Request::FetchTasks {
            client_id: 4,
            max: u32::MAX,
        },
        Request::MarkTaskComplete {
            client_id: 4,
            id: 5,
            success: false,
            message: "failed: x",
        },
        Request::ReplicaTransferStart {
            client_id: 4,
            key: "k",
            source: "",
            targets: vec!["t"],
        },
        Request::ReplicaTransferEnd {
            client_id: 4,
            key: "k",
        },
        Request::ReplicaTransferRevoke {
            client_id: 4,
            key: "k",
        },
        Request::MountLocalDisk {
            client_id: id,
            tier_id: "tier-7",
            endpoint: "h:2",
            capacity: u64::MAX,
        },
        Request::FetchOffloadTasks {
            client_id: id,
            max: u32::MAX,
            promote_round_ms: u64::MAX,
        },
        Request::NotifyOffload {
            client_id: id,
            keys: vec!["a", ""],
            sizes: vec![1, u64::MAX],
            restore: true,
        },
        Request::NotifyOffloadFailure {
            client_id: id,
            keys: vec!["a"],
        },
        Request::EvictDiskReplicas {
            client_id: id,
            keys: vec!["a", "b"],
        },
        Request::PromotionStart {
            client_id: id,
            key: "k",
        },
        Request::GetStorageConfig {},
        Request::MountSharedFs { client_id: id },
        Request::UnmountLocalDisk { client_id: id },
        Request::FetchFileTasks {
            client_id: id,
            max: 64,
        },
        Request::NotifyFileCopies {
            client_id: id,
            keys: vec!["a", "b"],
            sizes: vec![1, u64::MAX],
            failed: vec!["c"],
            removed: vec![],
        },
        Request::ReplicationPull {
            standby: "127.0.0.1:50051#00ff",
            after: u64::MAX,
            after_term: 7,
            applied: 3,
            max: 1024,
            wait_ms: 1000,
        },
        Request::Authenticate { token: "s3cret" },
        Request::SnapshotFetch {
            standby: "127.0.0.1:50051#00ff",
            seq: 100_000,
            offset: 4 << 20,
        },
        Request::LeaderTerm { term: u64::MAX },
        Request::Tenant {
            tenant_id: "team-a",
        },
    ]
}

fn sample_responses() -> Vec<Response> {
    fn err<T>(c: ErrorCode) -> Result<T, Error> {
        Err(Error::new(c, "context"))
    }
    let disk = ReplicaDesc {
        kind: ReplicaKind::Disk(DiskDescriptor {
            file_path: "/d/f".into(),
            object_size: 9,
        }),
        status: ReplicaStatus::Processing,
    };
    vec![
        Response::Unit { result: Ok(()) },
        Response::Unit {
            result: err(ErrorCode::OBJECT_HAS_LEASE),
        },
        Response::Units {
            results: vec![Ok(()), err(ErrorCode::OBJECT_NOT_FOUND)],
        },
        Response::Replicas {
            result: Ok(vec![replica(1), replica(2), disk]),
        },
        Response::BatchReplicas {
            results: vec![Ok(vec![replica(3)]), err(ErrorCode::NO_AVAILABLE_HANDLE)],
        },
        Response::ReplicaList {
            result: Ok(GetReplicaListResponse {
                replicas: vec![replica(4)],
                lease_ttl_ms: 10_000,
            }),
        },
        Response::BatchReplicaList {
            results: vec![err(ErrorCode::REPLICA_IS_NOT_READY)],
        },
        Response::Bool { result: Ok(true) },
        Response::Bools {
            results: vec![Ok(false), err(ErrorCode::INVALID_KEY)],
        },
        Response::Count {
            result: Ok(u64::MAX),
        },
        Response::Failed {
            error: Error::new(ErrorCode::INVALID_PARAMS, "2 keys but 1 value lengths"),
        },
        Response::Keys {
            result: Ok(vec!["a".into(), "".into()]),
        },
        Response::Task {
            result: Ok(1 << 100),
        },
        Response::TaskState {
            result: Ok(TaskInfo {
                id: 7,
                task_type: TaskType::ReplicaMove,
                status: TaskStatus::Failed,
                created_at_ms_epoch: 1_795_983_541_027,
                last_updated_at_ms_epoch: 1_795_983_541_099,
                assigned_client: u128::MAX,
                message: "executor client is gone".into(),
            }),
        },
        Response::Tasks {
            result: Ok(vec![TaskAssignment {
                id: 9,
                task_type: TaskType::ReplicaCopy,
                key: "k".into(),
                source: String::new(),
                targets: vec!["a".into()],
            }]),
        },
        Response::Tasks {
            result: Err(Error::new(ErrorCode::TASK_NOT_FOUND, "")),
        },
        Response::Offload {
            result: Ok(OffloadBatch {
                tasks: vec![OffloadTask {
                    key: "k".into(),
                    size: 1 << 20,
                    address: u64::MAX - 1,
                    idle_ms: 7,
                }],
                removes: vec!["gone".into()],
                promotions: vec!["hot".into()],
            }),
        },
        Response::Offload {
            result: Err(Error::new(ErrorCode::NO_AVAILABLE_HANDLE, "busy")),
        },
        Response::Storage {
            result: Ok(StorageConfig {
                fsdir: "/mnt/fs/mooncake_cluster".into(),
                enable_disk_eviction: false,
                quota_bytes: 1 << 30,
            }),
        },
        Response::Entries {
            term: 7,
            committed: 5,
            leader_now: u64::MAX,
            frames: Frames(vec![0, 1, 2, 255]),
        },
        Response::SnapshotChunk {
            seq: 100_000,
            term: 3,
            leader_now: 9,
            offset: 0,
            total: 7,
            chunk: Frames(vec![7; 7]),
        },
    ]
}

#[test]
fn every_message_round_trips() {
    let config = ReplicaPolicy {
        replica_num: 3,
        with_soft_pin: true,
        with_hard_pin: false,
        preferred_segment: "p".into(),
        preferred_segments: vec!["a".into(), "b".into()],
        prefer_alloc_in_same_node: true,
        group_ids: Some(vec!["g".into(), String::new()]),
    };
    let requests = sample_requests(&config);
    let mut tags: Vec<u8> = requests.iter().map(Request::tag).collect();
    tags.sort();
    assert_eq!(tags, Request::TAGS, "the samples cover every request");
    for req in &requests {
        let frame = frame_of(req);
        assert_eq!(
            &decode_payload::<Request<'_>>(payload(&frame)).unwrap(),
            req
        );
    }
    let responses = sample_responses();
    let mut tags: Vec<u8> = responses.iter().map(Response::tag).collect();
    tags.sort();
    tags.dedup();
    assert_eq!(tags, Response::TAGS, "the samples cover every response");
    for resp in responses {
        let frame = frame_of(&resp);
        assert_eq!(decode_payload::<Response>(payload(&frame)).unwrap(), resp);
    }
}

#[test]
fn a_4k_put_start_is_a_small_frame() {
    let req = Request::PutStart {
        client_id: 1,
        key: "model/layer-17/block-000123",
        value_len: 4096,
        config: ReplicaPolicy::default(),
        upsert: false,
    };
    assert!(frame_of(&req).len() < 64, "{}", frame_of(&req).len());
}

#[test]
fn truncated_payloads_are_errors() {
    let config = ReplicaPolicy::default();
    for req in sample_requests(&config) {
        let frame = frame_of(&req);
        let p = payload(&frame);
        for cut in 0..p.len() {
            assert!(
                decode_payload::<Request<'_>>(&p[..cut]).is_err(),
                "{req:?} cut at {cut}"
            );
        }
    }
    for resp in sample_responses() {
        let frame = frame_of(&resp);
        let p = payload(&frame);
        for cut in 0..p.len() {
            assert!(
                decode_payload::<Response>(&p[..cut]).is_err(),
                "{resp:?} cut at {cut}"
            );
        }
    }
}

#[test]
fn trailing_bytes_version_and_tags_are_checked() {
    let mut frame = frame_of(&Request::RemoveAll { force: true });
    frame.push(0);
    let p = &frame[4..];
    let e: Error = decode_payload::<Request<'_>>(p).unwrap_err().into();
    assert_eq!(e.code, ErrorCode::DESERIALIZE_FAIL);

    // Another build's version, older or newer, is refused as such.
    for other in [PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1] {
        let mut frame = frame_of(&Request::RemoveAll { force: true });
        frame[4] = other;
        let e: Error = decode_payload::<Request<'_>>(&frame[4..])
            .unwrap_err()
            .into();
        assert_eq!(e.code, ErrorCode::INVALID_VERSION);
    }

    // Unknown message tag, bool out of range.
    let v = PROTOCOL_VERSION;
    assert!(decode_payload::<Request<'_>>(&[v, 0]).is_err());
    assert!(decode_payload::<Request<'_>>(&[v, 250]).is_err());
    assert!(decode_payload::<Request<'_>>(&[v, 18, 2]).is_err());
}

#[test]
fn frame_lengths_are_bounded() {
    assert!(frame_len(0u32.to_le_bytes()).is_err());
    assert!(frame_len(1u32.to_le_bytes()).is_err());
    assert!(frame_len(((MAX_FRAME_LEN + 1) as u32).to_le_bytes()).is_err());
    assert!(frame_len(u32::MAX.to_le_bytes()).is_err());
    assert_eq!(
        frame_len((MAX_FRAME_LEN as u32).to_le_bytes()).unwrap(),
        MAX_FRAME_LEN
    );

    // read_frame refuses before allocating, and reports a short stream.
    let mut buf = Vec::new();
    let mut huge = Cursor::new(u32::MAX.to_le_bytes().to_vec());
    assert_eq!(
        read_frame(&mut huge, &mut buf).unwrap_err().kind(),
        std::io::ErrorKind::InvalidData
    );
    assert!(buf.capacity() < 1024);
    let mut short = Cursor::new(vec![10, 0, 0, 0, 1, 2]);
    assert_eq!(
        read_frame(&mut short, &mut buf).unwrap_err().kind(),
        std::io::ErrorKind::UnexpectedEof
    );

    // An encoder never produces a frame the decoder would refuse.
    let big_key = "k".repeat(MAX_FRAME_LEN);
    let mut out = vec![7];
    assert!(encode_frame(&Request::ExistKey { key: &big_key }, &mut out).is_err());
    assert_eq!(out, [7], "a refused frame leaves the buffer as it was");
}

#[test]
fn hostile_counts_do_not_allocate() {
    // BatchExistKey claiming 2^62 keys in a 12-byte payload.
    let mut p = vec![PROTOCOL_VERSION, 13];
    let mut n = 1u64 << 62;
    while n >= 0x80 {
        p.push((n as u8) | 0x80);
        n >>= 7;
    }
    p.push(n as u8);
    assert!(decode_payload::<Request<'_>>(&p).is_err());
    // A string length larger than the input.
    assert!(
        decode_payload::<Request<'_>>(&[PROTOCOL_VERSION, 12, 0xff, 0xff, 0x03, b'a']).is_err()
    );
}

fn arb_config() -> impl Strategy<Value = ReplicaPolicy> {
    (
        any::<usize>(),
        any::<bool>(),
        any::<bool>(),
        ".{0,8}",
        prop::collection::vec(".{0,8}", 0..4),
        any::<bool>(),
        prop::option::of(prop::collection::vec(".{0,8}", 0..4)),
    )
        .prop_map(
            |(
                replica_num,
                with_soft_pin,
                with_hard_pin,
                preferred_segment,
                preferred_segments,
                prefer_alloc_in_same_node,
                group_ids,
            )| {
                ReplicaPolicy {
                    replica_num,
                    with_soft_pin,
                    with_hard_pin,
                    preferred_segment,
                    preferred_segments,
                    prefer_alloc_in_same_node,
                    group_ids,
                }
            },
        )
}

proptest! {
    #[test]
    fn put_starts_round_trip(
        id in any::<u128>(),
        keys in prop::collection::vec(".{0,40}", 0..20),
        lens in prop::collection::vec(any::<u64>(), 0..20),
        config in arb_config(),
        upsert in any::<bool>(),
    ) {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let req = Request::BatchPutStart { client_id: id, keys, value_lens: lens, config, upsert };
        let frame = frame_of(&req);
        prop_assert_eq!(decode_payload::<Request<'_>>(payload(&frame)).unwrap(), req);
    }

    #[test]
    fn replica_lists_round_trip(
        addrs in prop::collection::vec((any::<u64>(), any::<u64>(), ".{0,16}"), 0..8),
        ttl in any::<u64>(),
        code_idx in 0usize..ErrorCode::ALL.len(),
    ) {
        let replicas: Vec<ReplicaDesc> = addrs
            .into_iter()
            .map(|(a, s, n)| ReplicaDesc {
                kind: ReplicaKind::Memory(MemoryDescriptor {
                    segment_name: n.clone(),
                    transport_endpoint: n,
                    buffer_address: a,
                    size: s,
                    suspected: a % 2 == 1,
                }),
                status: ReplicaStatus::Complete,
            })
            .collect();
        let code = ErrorCode::ALL[code_idx];
        let second = if code == ErrorCode::OK { Ok(GetReplicaListResponse { replicas: vec![], lease_ttl_ms: 0 }) } else { Err(Error::new(code, "x")) };
        let resp = Response::BatchReplicaList {
            results: vec![Ok(GetReplicaListResponse { replicas, lease_ttl_ms: ttl }), second],
        };
        let frame = frame_of(&resp);
        prop_assert_eq!(decode_payload::<Response>(payload(&frame)).unwrap(), resp);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_payload::<Request<'_>>(&bytes);
        let _ = decode_payload::<Response>(&bytes);
        let mut buf = Vec::new();
        let _ = read_frame(&mut Cursor::new(bytes), &mut buf);
    }

    #[test]
    fn bit_flips_never_panic(which in 0usize..27, flip in any::<(usize, u8)>()) {
        let config = ReplicaPolicy { preferred_segments: vec!["seg".into()], ..Default::default() };
        let reqs = sample_requests(&config);
        let mut frame = frame_of(&reqs[which % reqs.len()]);
        let i = 4 + flip.0 % (frame.len() - 4);
        frame[i] ^= flip.1 | 1;
        let _ = decode_payload::<Request<'_>>(&frame[4..]);
    }
}
