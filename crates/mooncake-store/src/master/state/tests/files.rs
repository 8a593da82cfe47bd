//! The shared-filesystem tier: objects leave memory only with a file copy,
//! a full tier backs puts off or drops its oldest files, deletes keep a key
//! from being written again.

use super::*;
use crate::master::config::policy::FilePolicy;
use crate::types::ReplicaKind;

/// 16 objects of 1 KiB fill A's segment; the tier holds `files` of them.
pub(super) fn with_tier(files: u64, evict: bool) -> MasterService {
    let s = MasterService::with_policy(policy()).with_file_policy(FilePolicy {
        fsdir: Some("/mnt/fs/c".into()),
        capacity: files * 1024,
        evict,
        quota_bytes: 0,
    });
    s.mount_segment(A, &seg("a", 0x10_000, 16 * 1024), 0)
        .unwrap();
    s.mount_shared_fs(A, 0).unwrap();
    s
}

/// A writes every file it was asked to; returns (written, deleted).
pub(super) fn drain(s: &MasterService, now: u64) -> (usize, usize) {
    let batch = s.fetch_file_tasks(A, 1000, now).unwrap();
    let keys: Vec<&str> = batch.tasks.iter().map(|t| t.key.as_str()).collect();
    let sizes: Vec<u64> = batch.tasks.iter().map(|t| t.size).collect();
    let removed: Vec<&str> = batch.removes.iter().map(String::as_str).collect();
    let _ = s.notify_file_copies(A, &keys, &sizes, &[], &removed, now);
    (keys.len(), removed.len())
}

fn file_path(s: &MasterService, key: &str, now: u64) -> Option<String> {
    let reps = s.get_replica_list(key, now).ok()?.replicas;
    reps.iter().find_map(|r| match &r.kind {
        ReplicaKind::Disk(d) => Some(d.file_path.clone()),
        _ => None,
    })
}

fn fill(s: &MasterService, n: usize) {
    for i in 0..n {
        put(s, &format!("k{i}"), 1024, &one(), i as u64);
    }
}

#[test]
fn objects_leave_memory_only_once_their_file_is_reported() {
    let s = with_tier(64, true);
    fill(&s, 16);
    assert_eq!(drain(&s, 20), (0, 0), "nothing is written at PutEnd");
    let full = s.put_start(W, "k16", 1024, &one(), false, 1000);
    assert_eq!(full.unwrap_err().code, ErrorCode::NO_AVAILABLE_HANDLE);
    tick(&s, 1000);
    let (written, _) = drain(&s, 1000);
    assert!(written > 0, "eviction queued the objects it could not take");
    tick(&s, 2000);
    put(&s, "k16", 1024, &one(), 2000);
    let mut file_only = 0;
    for i in 0..17 {
        let key = format!("k{i}");
        assert!(s.exist_key(&key, 3000).unwrap(), "{key} lost");
        let reps = s.get_replica_list(&key, 3000).unwrap().replicas;
        if reps.len() == 1 && file_path(&s, &key, 3000).is_some() {
            file_only += 1;
            assert_eq!(
                file_path(&s, &key, 3000).unwrap(),
                crate::tier::shared_fs::object_file("/mnt/fs/c", &key)
            );
        }
    }
    assert!(file_only > 0);
    assert_eq!(s.file_usage(), (written as u64 * 1024, 64 * 1024));
}

#[test]
fn a_full_tier_without_eviction_backs_puts_off() {
    let s = with_tier(2, false);
    fill(&s, 16);
    for t in [1000, 2000, 3000] {
        tick(&s, t);
        drain(&s, t);
    }
    assert_eq!(s.file_usage().0, 2 * 1024, "no more than the tier holds");
    // The two objects in files left memory: room for two more, no more.
    put(&s, "k16", 1024, &one(), 4000);
    put(&s, "k17", 1024, &one(), 4000);
    for t in [5000, 6000] {
        tick(&s, t);
        assert_eq!(drain(&s, t), (0, 0), "the tier is full");
    }
    let full = s.put_start(W, "k18", 1024, &one(), false, 7000);
    assert_eq!(full.unwrap_err().code, ErrorCode::NO_AVAILABLE_HANDLE);
    for i in 0..18 {
        assert!(s.exist_key(&format!("k{i}"), 7000).unwrap(), "k{i} lost");
    }
}

#[test]
fn a_full_tier_with_eviction_drops_its_oldest_files() {
    let s = with_tier(2, true);
    fill(&s, 16);
    for t in [1000, 2000, 3000, 4000] {
        tick(&s, t);
        drain(&s, t);
        let _ = s.put_start(W, &format!("n{t}"), 1024, &one(), false, t);
        let _ = s.put_end(W, &format!("n{t}"), t);
    }
    assert!(s.file_usage().0 <= 2 * 1024);
    let gone = (0..16).filter(|i| !s.exist_key(&format!("k{i}"), 5000).unwrap());
    assert!(gone.count() > 0, "files were evicted with their objects");
}

#[test]
fn stale_files_and_removed_objects_are_deleted_before_the_key_is_written_again() {
    let s = with_tier(64, true);
    fill(&s, 16);
    tick(&s, 1000);
    let batch = s.fetch_file_tasks(A, 1, 1000).unwrap();
    let key = batch.tasks[0].key.clone();
    // The object is replaced while its file is written: the file is refused.
    s.remove(&key, true, 2000).unwrap();
    put(&s, &key, 1024, &one(), 2000);
    let r = s.notify_file_copies(A, &[key.as_str()], &[1024], &[], &[], 2000);
    assert_eq!(r[0].as_ref().unwrap_err().code, ErrorCode::OBJECT_NOT_FOUND);
    tick(&s, 3000);
    let batch = s.fetch_file_tasks(A, 1000, 3000).unwrap();
    assert_eq!(
        batch.removes,
        std::slice::from_ref(&key),
        "its file is to be deleted"
    );
    assert!(
        batch.tasks.iter().all(|t| t.key != key),
        "not written again until the delete is reported"
    );
    let _ = s.notify_file_copies(A, &[], &[], &[], &[key.as_str()], 3000);
    // Once the delete is reported, the key is written again when eviction
    // next wants it out: make it the oldest object of a full memory.
    for i in 0..16 {
        if format!("k{i}") != key {
            s.remove(&format!("k{i}"), true, 3000).unwrap();
        }
    }
    for i in 0..15 {
        put(&s, &format!("m{i}"), 1024, &one(), 3000 + i);
    }
    tick(&s, 4000);
    let queued = s.fetch_file_tasks(A, 1000, 4000).unwrap();
    assert!(queued.tasks.iter().any(|t| t.key == key));
}

#[test]
fn the_tier_needs_root_fs_dir_and_a_known_writer() {
    let s = MasterService::with_policy(policy());
    assert_eq!(
        s.mount_shared_fs(A, 0).unwrap_err().code,
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
    );
    assert!(s.storage_config().fsdir.is_empty());
    let s = with_tier(4, false);
    assert_eq!(
        s.fetch_file_tasks(B, 1, 0).unwrap_err().code,
        ErrorCode::SEGMENT_NOT_FOUND
    );
    let c = s.storage_config();
    assert_eq!(
        (c.fsdir.as_str(), c.enable_disk_eviction),
        ("/mnt/fs/c", false)
    );
}
