//! Copy and move tasks against real processes: `mooncake_master`, a
//! `mooncake_http_metadata_server` and three storage nodes run as
//! `mooncake_client` processes, which execute the tasks; an in-test pure
//! client creates and follows them. Every wait is bounded.

use mooncake_common::ErrorCode;
use mooncake_store::client::Client;
use mooncake_store::types::{ReplicaPolicy, TaskId, TaskStatus, TaskType};

mod common;
use common::*;

fn sorted(names: &[&String]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

fn finished(client: &Client, id: TaskId) -> (TaskStatus, String) {
    let mut last = None;
    eventually("task finishes", || {
        let info = client.query_task(id).unwrap();
        assert_eq!(info.id, id);
        let done = matches!(info.status, TaskStatus::Success | TaskStatus::Failed);
        last = Some((info.status, info.message));
        done
    });
    last.unwrap()
}

#[test]
fn copy_and_move_tasks_run_on_the_target_node() {
    let cluster = Cluster::start(&[]);
    let mut a = cluster.storage("16MB");
    let mut b = cluster.storage("16MB");
    let c = cluster.storage("16MB");
    let client = cluster.pure_client();

    // Copy onto two segments: B reads from A, then writes C from its copy.
    let big = value("big", 3 << 20);
    client.put("big", &big, &pinned_to(&a.segment)).unwrap();
    let targets = vec![b.segment.clone(), c.segment.clone()];
    let id = client.create_copy_task("big", &targets).unwrap();
    let info = client.query_task(id).unwrap();
    assert_eq!(info.task_type, TaskType::ReplicaCopy);
    assert!(info.created_at_ms_epoch > 0);
    assert_eq!(finished(&client, id), (TaskStatus::Success, String::new()));
    assert_eq!(
        segments_of(&client, "big"),
        sorted(&[&a.segment, &b.segment, &c.segment])
    );
    assert_eq!(client.get("big").unwrap(), big);

    // Move A -> B: the source replica goes.
    let moved = value("moved", 1 << 20);
    client.put("moved", &moved, &pinned_to(&a.segment)).unwrap();
    let id = client
        .create_move_task("moved", &a.segment, &b.segment)
        .unwrap();
    assert_eq!(
        client.query_task(id).unwrap().task_type,
        TaskType::ReplicaMove
    );
    assert_eq!(finished(&client, id).0, TaskStatus::Success);
    assert_eq!(segments_of(&client, "moved"), vec![b.segment.clone()]);
    assert_eq!(client.get("moved").unwrap(), moved);

    // Copying onto a segment that already holds a replica is a no-op.
    let id = client
        .create_copy_task("moved", std::slice::from_ref(&b.segment))
        .unwrap();
    assert_eq!(finished(&client, id).0, TaskStatus::Success);
    assert_eq!(segments_of(&client, "moved"), vec![b.segment.clone()]);

    // Through a dummy client of C: C reads B's replica.
    let dummy = Client::setup_dummy(1 << 20, 4 << 20, &c.dummy_addr).unwrap();
    let id = dummy
        .create_copy_task("moved", std::slice::from_ref(&c.segment))
        .unwrap();
    assert_eq!(finished(&dummy, id).0, TaskStatus::Success);
    assert_eq!(
        segments_of(&client, "moved"),
        sorted(&[&b.segment, &c.segment])
    );
    assert_eq!(
        code(dummy.query_task(12345)),
        ErrorCode::TASK_NOT_FOUND,
        "dummy answers errors with their codes"
    );
    drop(dummy);

    // Errors.
    assert_eq!(
        code(client.create_copy_task("missing", std::slice::from_ref(&b.segment))),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        code(client.create_copy_task("big", &["nosuch:1".to_string()])),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(client.create_copy_task("big", &[])),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(client.create_move_task("big", &a.segment, "nosuch:1")),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(client.create_move_task("missing", &a.segment, &b.segment)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        code(client.create_move_task("moved", &a.segment, &c.segment)),
        ErrorCode::REPLICA_NOT_FOUND,
        "A holds no replica of `moved` any more"
    );
    assert_eq!(code(client.query_task(0)), ErrorCode::TASK_NOT_FOUND);
    assert_eq!(
        code(client.query_task(u128::MAX)),
        ErrorCode::TASK_NOT_FOUND
    );

    // Each copy holds the bytes: drop the nodes one by one and read what is left.
    a.proc.kill();
    eventually("A's replicas go", || {
        segments_of(&client, "big") == sorted(&[&b.segment, &c.segment])
    });
    assert_eq!(client.get("big").unwrap(), big);
    b.proc.kill();
    eventually("B's replicas go", || {
        segments_of(&client, "big") == vec![c.segment.clone()]
    });
    assert_eq!(
        client.get("big").unwrap(),
        big,
        "C's copy, written from B's"
    );
    assert_eq!(client.get("moved").unwrap(), moved, "C's copy, read from B");
}

#[test]
fn batch_replica_clear_drops_expired_replicas() {
    let cluster = Cluster::start(&[]);
    let a = cluster.storage("16MB");
    let b = cluster.storage("16MB");
    let client = cluster.pure_client();
    let two = ReplicaPolicy {
        replica_num: 2,
        ..Default::default()
    };
    client.put("c1", b"one", &two).unwrap();
    client.put("c2", b"two", &two).unwrap();
    let keys = vec!["c1".to_string(), "c2".to_string(), "missing".to_string()];
    // Only replicas whose lease has expired are cleared.
    let mut cleared = Vec::new();
    eventually("A's replica of c1 is cleared", || {
        cleared = client.batch_replica_clear(&keys[..1], &a.segment).unwrap();
        !cleared.is_empty()
    });
    assert_eq!(cleared, ["c1"]);
    assert_eq!(segments_of(&client, "c1"), vec![b.segment.clone()]);
    // An empty segment name clears every replica (the object goes).
    let mut all = Vec::new();
    eventually("c1 and c2 are cleared", || {
        all.extend(client.batch_replica_clear(&keys, "").unwrap());
        all.len() >= 2
    });
    all.sort();
    assert_eq!(all, ["c1", "c2"]);
    assert!(!client.is_exist("c1").unwrap());
    assert!(!client.is_exist("c2").unwrap());
    assert_eq!(
        client.batch_replica_clear(&keys, "nosuch:1").unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn a_copy_that_does_not_fit_fails_and_changes_nothing() {
    let cluster = Cluster::start(&[]);
    let a = cluster.storage("16MB");
    let b = cluster.storage("16MB");
    let client = cluster.pure_client();
    // Hard-pinned so eviction cannot make room on B.
    let on = |segment: &str| ReplicaPolicy {
        with_hard_pin: true,
        ..pinned_to(segment)
    };
    let x = value("x", 10 << 20);
    client.put("x", &x, &on(&a.segment)).unwrap();
    client
        .put("y", &value("y", 10 << 20), &on(&b.segment))
        .unwrap();
    let id = client
        .create_copy_task("x", std::slice::from_ref(&b.segment))
        .unwrap();
    let (status, message) = finished(&client, id);
    assert_eq!(status, TaskStatus::Failed);
    assert!(!message.is_empty(), "a failed task says why");
    assert_eq!(segments_of(&client, "x"), vec![a.segment.clone()]);
    // Once B has room the same copy goes through.
    client.remove("y", true).unwrap();
    let id = client
        .create_copy_task("x", std::slice::from_ref(&b.segment))
        .unwrap();
    assert_eq!(finished(&client, id).0, TaskStatus::Success);
    assert_eq!(segments_of(&client, "x"), sorted(&[&a.segment, &b.segment]));
    assert_eq!(client.get("x").unwrap(), x);
}
