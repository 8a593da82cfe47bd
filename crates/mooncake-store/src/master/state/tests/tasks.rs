//! Copy and move tasks and their replica transfers.

use super::*;

#[test]
fn task_creation_checks_its_inputs() {
    let s = two_owners();
    put(&s, "k", 100, &on("a"), 0);
    assert_eq!(
        code(s.create_copy_task("missing", &["b"], 1)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        code(s.create_copy_task("k", &["nosuch:1"], 1)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.create_copy_task("k", &[], 1)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.create_move_task("k", "a", "nosuch:1", 1)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.create_move_task("k", "a", "a", 1)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.create_move_task("k", "b", "a", 1)),
        ErrorCode::REPLICA_NOT_FOUND
    );
    assert_eq!(code(s.query_task(0)), ErrorCode::TASK_NOT_FOUND);
    s.put_start(W, "inflight", 10, &one(), false, 1).unwrap();
    assert_eq!(
        code(s.create_copy_task("inflight", &["b"], 1)),
        ErrorCode::OBJECT_NOT_FOUND
    );
}

#[test]
fn a_copy_task_runs_to_completion() {
    let s = two_owners();
    s.set_epoch_offset(1_000_000);
    put(&s, "k", 100, &on("a"), 0);
    let id = s.create_copy_task("k", &["b"], 10).unwrap();
    let info = s.query_task(id).unwrap();
    assert_eq!(
        (info.task_type, info.status, info.assigned_client),
        (TaskType::ReplicaCopy, TaskStatus::Pending, B)
    );
    assert_eq!(info.created_at_ms_epoch, 1_000_010);
    // Only the target's owner gets it, once.
    assert!(s.fetch_tasks(A, 10, 11).is_empty());
    let tasks = s.fetch_tasks(B, 10, 11);
    assert_eq!(tasks.len(), 1);
    assert_eq!(
        (
            tasks[0].id,
            tasks[0].key.as_str(),
            tasks[0].targets.as_slice()
        ),
        (id, "k", &["b".to_string()][..])
    );
    assert!(s.fetch_tasks(B, 10, 11).is_empty());
    assert_eq!(s.query_task(id).unwrap().status, TaskStatus::Processing);

    let new = s
        .replica_transfer_start(B, "k", "", &["b", "a"], 12)
        .unwrap();
    assert_eq!(new.len(), 1, "a already holds a replica");
    assert_eq!(segment_of(&new[0]), "b");
    // The object stays readable, and busy for writers and plain removal.
    assert_eq!(s.get_replica_list("k", 13).unwrap().replicas.len(), 1);
    assert_eq!(
        code(s.put_start(W, "k", 100, &one(), true, 13)),
        ErrorCode::OBJECT_REPLICA_BUSY
    );
    assert_eq!(
        code(s.remove("k", false, 500)),
        ErrorCode::OBJECT_HAS_REPLICATION_TASK
    );
    assert_eq!(
        code(s.put_end(W, "k", 13)),
        ErrorCode::OBJECT_HAS_REPLICATION_TASK
    );
    assert_eq!(
        code(s.replica_transfer_end(A, "k", 14)),
        ErrorCode::ILLEGAL_CLIENT
    );
    s.replica_transfer_end(B, "k", 14).unwrap();
    let mut segs: Vec<String> = s
        .get_replica_list("k", 15)
        .unwrap()
        .replicas
        .iter()
        .map(|r| segment_of(r).to_string())
        .collect();
    segs.sort();
    assert_eq!(segs, ["a", "b"]);
    assert_eq!(
        code(s.replica_transfer_end(B, "k", 16)),
        ErrorCode::OBJECT_NO_REPLICATION_TASK
    );

    assert_eq!(
        code(s.mark_task_complete(A, id, true, "", 17)),
        ErrorCode::ILLEGAL_CLIENT
    );
    s.mark_task_complete(B, id, true, "done", 17).unwrap();
    let info = s.query_task(id).unwrap();
    assert_eq!(
        (
            info.status,
            info.message.as_str(),
            info.last_updated_at_ms_epoch
        ),
        (TaskStatus::Success, "done", 1_000_017)
    );
    assert_eq!(
        code(s.mark_task_complete(B, id, true, "", 18)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(used(&s), 208);
}

#[test]
fn a_move_drops_the_source_after_readers_leases() {
    let s = two_owners();
    put(&s, "k", 100, &on("a"), 0);
    s.create_move_task("k", "a", "b", 1).unwrap();
    s.fetch_tasks(B, 1, 1);
    s.replica_transfer_start(B, "k", "a", &["b"], 2).unwrap();
    s.get_replica_list("k", 3).unwrap(); // a reader leases the source until 103
    s.replica_transfer_end(B, "k", 4).unwrap();
    let r = s.get_replica_list("k", 5).unwrap().replicas;
    assert_eq!(r.len(), 1);
    assert_eq!(segment_of(&r[0]), "b");
    assert_eq!(used(&s), 208, "the source waits for the lease");
    tick(&s, 104);
    assert_eq!(used(&s), 104);
    // Copy it back, then move b -> a: a already holds one, so b's just goes.
    s.replica_transfer_start(B, "k", "", &["a"], 200).unwrap();
    s.replica_transfer_end(B, "k", 200).unwrap();
    assert!(s
        .replica_transfer_start(B, "k", "b", &["a"], 201)
        .unwrap()
        .is_empty());
    let r = s.get_replica_list("k", 202).unwrap().replicas;
    assert_eq!((r.len(), segment_of(&r[0])), (1, "a"));
    assert_eq!(used(&s), 104);
}

#[test]
fn revoked_or_abandoned_transfers_free_their_space() {
    let s = two_owners();
    put(&s, "k", 100, &on("a"), 0);
    s.replica_transfer_start(B, "k", "", &["b"], 1).unwrap();
    assert_eq!(used(&s), 208);
    s.replica_transfer_revoke(B, "k").unwrap();
    assert_eq!(used(&s), 104);
    assert_eq!(s.get_replica_list("k", 2).unwrap().replicas.len(), 1);
    // A transfer never ended is discarded with unfinished puts.
    s.replica_transfer_start(B, "k", "", &["b"], 10).unwrap();
    tick(&s, 10 + DISCARD);
    assert!(s.exist_key("k", 10 + DISCARD).unwrap());
    s.ping(B, 10 + RELEASE).unwrap();
    tick(&s, 10 + RELEASE);
    assert_eq!(used(&s), 104);
    // Forced removal mid-transfer drops everything.
    s.replica_transfer_start(B, "k", "", &["b"], 700).unwrap();
    s.remove("k", true, 701).unwrap();
    s.ping(B, 700 + RELEASE).unwrap();
    tick(&s, 701 + RELEASE);
    assert_eq!(used(&s), 0);
}

#[test]
fn tasks_time_out_or_fail_with_their_executor() {
    let s = two_owners().with_task_policy(TaskPolicy {
        pending_timeout: 1_000,
        max_finished: 2,
        ..TaskPolicy::default()
    });
    put(&s, "k", 100, &on("a"), 0);
    let stale = s.create_copy_task("k", &["b"], 0).unwrap();
    s.ping(B, 400).unwrap();
    s.ping(B, 800).unwrap();
    assert_eq!(tick(&s, 999).failed_tasks, 0);
    assert_eq!(tick(&s, 1000).failed_tasks, 1);
    assert_eq!(s.query_task(stale).unwrap().status, TaskStatus::Failed);
    // B goes silent: its segment is unmounted and its tasks fail.
    let orphan = s.create_move_task("k", "a", "b", 1000).unwrap();
    s.fetch_tasks(B, 1, 1000);
    let r = tick(&s, 800 + CLIENT_TTL);
    assert_eq!((r.expired_clients, r.failed_tasks), (1, 1));
    let info = s.query_task(orphan).unwrap();
    assert_eq!(
        (info.status, info.message.as_str()),
        (TaskStatus::Failed, "executor client is gone")
    );
    // Finished tasks are kept up to the limit, oldest dropped first.
    let a_task = s.create_copy_task("k", &["a"], 1400).unwrap();
    s.fetch_tasks(A, 1, 1400);
    s.mark_task_complete(A, a_task, false, "no", 1401).unwrap();
    assert_eq!(code(s.query_task(stale)), ErrorCode::TASK_NOT_FOUND);
    assert_eq!(s.query_task(orphan).unwrap().status, TaskStatus::Failed);
}
