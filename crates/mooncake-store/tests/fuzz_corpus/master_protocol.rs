//! Seeds for the master protocol targets: every request and response kind.

use super::*;

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
            config: ReplicaPolicy::default(),
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
            promote_round_ms: 1_000,
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
        Request::UnmountLocalDisk { client_id: CLIENT },
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
        Request::LeaderTerm { term: 7 },
        Request::Tenant {
            tenant_id: "team-a",
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
