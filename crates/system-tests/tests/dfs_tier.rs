//! The shared-filesystem tier with real processes and real files:
//! `mooncake_master --root_fs_dir=DIR` (a temporary directory standing in
//! for the shared mount), two `mooncake_client` storage processes writing
//! there, and pure clients (no segment) that put and read.

mod common;

use std::time::Duration;

use common::*;
use mooncake_common::ErrorCode;
use mooncake_store::client::Client;
use mooncake_store::tier::shared_fs::object_file;
use mooncake_store::types::{ReplicaKind, ReplicaPolicy};

const SEGMENT: &str = "4MB";
const VALUE: usize = 256 << 10;

fn key(i: usize) -> String {
    format!("dfs-key/{i:04}")
}

/// Puts `key`, retrying `NO_AVAILABLE_HANDLE` (memory full of objects whose
/// file is not durable yet) up to `tries` times; the last error if it
/// never got room.
fn put_retrying(client: &Client, k: &str, tries: usize) -> Result<(), ErrorCode> {
    let v = value(k, VALUE);
    for _ in 0..tries {
        match client.put(k, &v, &ReplicaPolicy::default()) {
            Ok(()) => return Ok(()),
            Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("put {k}: {e}"),
        }
    }
    Err(ErrorCode::NO_AVAILABLE_HANDLE)
}

/// (has a memory replica, its file path if it has a file copy).
fn kinds(client: &Client, k: &str) -> (bool, Option<String>) {
    let reps = client.get_replica_desc(k).unwrap_or_default();
    let mem = reps
        .iter()
        .any(|r| matches!(r.kind, ReplicaKind::Memory(_)));
    let file = reps.iter().find_map(|r| match &r.kind {
        ReplicaKind::Disk(d) => Some(d.file_path.clone()),
        _ => None,
    });
    (mem, file)
}

fn files_under(dir: &std::path::Path) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_none_or(|x| x != "tmp") {
                n += 1;
            }
        }
    }
    n
}

/// 64 keys of 256 KiB through two 4 MiB segments (2× memory): every
/// acknowledged key reads back byte-exact from a third client, those
/// evicted to the tier straight from their files at the reference's paths.
#[test]
fn two_storage_clients_share_the_tier_and_a_third_client_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let cluster = Cluster::start(&[
        &format!("--root_fs_dir={root}"),
        "--allow_force_remove_all=true",
    ]);
    let _a = cluster.storage(SEGMENT);
    let _b = cluster.storage(SEGMENT);
    let writer = cluster.pure_client();
    let n = 64;
    for i in 0..n {
        put_retrying(&writer, &key(i), 100_000).expect("the tier drains");
    }
    drop(writer);

    let reader = cluster.pure_client();
    let fsdir = format!("{root}/mooncake_cluster");
    let mut file_only = 0;
    for i in 0..n {
        let k = key(i);
        let got = reader.get(&k).unwrap_or_else(|e| panic!("get {k}: {e}"));
        assert!(got == value(&k, VALUE), "{k}: wrong bytes");
        match kinds(&reader, &k) {
            (false, Some(path)) => {
                assert_eq!(path, object_file(&fsdir, &k));
                assert!(std::path::Path::new(&path).is_file(), "{path}");
                file_only += 1;
            }
            (true, _) => {}
            (false, None) => panic!("{k} has no replica"),
        }
    }
    assert!(file_only >= n / 3, "only {file_only} of {n} left memory");
    assert!(files_under(dir.path()) >= file_only);
    let m = |name| metric(&cluster.http_addr, name);
    assert!(m("file_cache_hit_nums_") >= file_only as f64);
    assert!(m("file_cache_nums_") >= file_only as f64);
    assert!(m("master_allocated_file_size_bytes") >= (file_only * VALUE) as f64);
    // 90% of the filesystem holding the directory (`--quota_bytes=0`).
    assert!(m("master_total_file_capacity_bytes") > m("master_allocated_file_size_bytes"));

    // Batch reads of file-only objects, and removal deletes the files.
    let keys: Vec<String> = (0..n).map(key).collect();
    for (k, got) in keys.iter().zip(reader.get_batch(&keys)) {
        assert!(
            got.unwrap() == value(k, VALUE),
            "{k}: wrong bytes in a batch"
        );
    }
    assert_eq!(reader.remove_all(true).unwrap() as usize, n);
    eventually("the tier's files are deleted", || {
        files_under(dir.path()) == 0
    });
}

/// `--enable_disk_eviction=false` and a tier of 8 values: once memory and
/// the tier are full, puts get the retryable -200, and every acknowledged
/// key still reads back.
#[test]
fn a_full_tier_without_eviction_backs_puts_off_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let cluster = Cluster::start(&[
        &format!("--root_fs_dir={root}"),
        "--global_file_segment_size=2097152",
        "--enable_disk_eviction=false",
    ]);
    let _a = cluster.storage(SEGMENT);
    let client = cluster.pure_client();
    let mut acked = Vec::new();
    let mut refused = None;
    for i in 0..40 {
        match put_retrying(&client, &key(i), 400) {
            Ok(()) => acked.push(key(i)),
            Err(c) => {
                refused = Some(c);
                break;
            }
        }
    }
    assert_eq!(refused, Some(ErrorCode::NO_AVAILABLE_HANDLE));
    assert!(acked.len() > 8, "only {} acknowledged", acked.len());
    let in_files = acked
        .iter()
        .filter(|k| kinds(&client, k).1.is_some())
        .count();
    assert!(in_files <= 8, "{in_files} files in a tier of 8 values");
    let m = |name| metric(&cluster.http_addr, name);
    assert_eq!(m("master_total_file_capacity_bytes"), 2097152.0);
    assert_eq!(
        m("master_allocated_file_size_bytes"),
        (in_files * VALUE) as f64
    );
    for k in &acked {
        let got = client.get(k).unwrap_or_else(|e| panic!("get {k}: {e}"));
        assert!(got == value(k, VALUE), "{k}: wrong bytes");
    }
    // Room again: removing an object in memory lets the next put through.
    let in_memory = acked.iter().find(|k| kinds(&client, k).0).unwrap();
    client.remove(in_memory, true).unwrap();
    put_retrying(&client, "after-room", 100_000).expect("room came back");
}
