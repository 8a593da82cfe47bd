//! Seeds for the dummy protocol targets.

use super::*;

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
