//! The SSD tier with real processes and real files: `mooncake_master
//! --enable_offload`, `mooncake_client --enable_offload` on a temporary
//! directory, and a pure client (no segment) that puts and reads.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use mooncake_common::ErrorCode;
use mooncake_store::client::Client;
use mooncake_store::types::{ReplicaKind, ReplicaPolicy, WriteOptions};

const SEGMENT: &str = "4MB";
const VALUE: usize = 256 << 10;

/// A `mooncake_client --enable_offload` on `dir` (extra `MOONCAKE_OFFLOAD_*`
/// settings in `env`); returns once it is ready.
fn tier_storage(cluster: &Cluster, dir: &Path, env: &[(&str, &str)]) -> Proc {
    let mut cmd = Command::new(&*STORAGE);
    cmd.args([
        format!("--master_server_address={}", cluster.master_addr),
        format!("--metadata_server={}", cluster.metadata),
        "--host=127.0.0.1".into(),
        "--port=0".into(),
        format!("--global_segment_size={SEGMENT}"),
        "--enable_offload=true".into(),
    ])
    .env("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", dir)
    .env("MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES", "67108864")
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("mooncake_client ready") {
                let _ = tx.send(());
            }
        }
    });
    let proc = Proc(child);
    rx.recv_timeout(WAIT)
        .expect("mooncake_client never got ready");
    proc
}

fn tier_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(name).tempdir().unwrap()
}

fn key(i: usize) -> String {
    format!("tier-key-{i:04}")
}

/// Puts `n` keys, retrying the retryable `NO_AVAILABLE_HANDLE` (memory
/// full of objects whose disk copy is not durable yet).
fn put_all(client: &Client, n: usize) -> usize {
    (0..n)
        .map(|i| {
            until_room(&key(i), || {
                client.put(&key(i), &value(&key(i), VALUE), &ReplicaPolicy::default())
            })
        })
        .sum()
}

/// Runs a write until it gets room, retrying the retryable
/// `NO_AVAILABLE_HANDLE`: memory can be full of objects that wait for their
/// disk copy or that a reader holds a lease on (every replica query grants
/// one). Returns the number of retries.
fn until_room(what: &str, mut write: impl FnMut() -> mooncake_common::Result<()>) -> usize {
    let mut retries = 0;
    loop {
        match write() {
            Ok(()) => return retries,
            Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE => {
                retries += 1;
                assert!(retries < 100_000, "{what}: never got room");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("write {what}: {e}"),
        }
    }
}

fn assert_all_exact(client: &Client, keys: impl IntoIterator<Item = String>) {
    for k in keys {
        let got = client.get(&k).unwrap_or_else(|e| panic!("get {k}: {e}"));
        assert!(got == value(&k, VALUE), "{k}: wrong bytes");
    }
}

fn kinds(client: &Client, k: &str) -> (bool, bool) {
    let reps = client.get_replica_desc(k).unwrap_or_default();
    let mem = reps
        .iter()
        .any(|r| matches!(r.kind, ReplicaKind::Memory(_)));
    let disk = reps
        .iter()
        .any(|r| matches!(r.kind, ReplicaKind::LocalDisk(_)));
    (mem, disk)
}

fn on_disk(client: &Client, n: usize) -> BTreeSet<String> {
    (0..n).map(key).filter(|k| kinds(client, k).1).collect()
}

fn tier_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bucket"))
        .collect();
    v.sort();
    v
}

/// 64 keys of 256 KiB through a 4 MiB segment (4× memory): every
/// acknowledged key reads back byte-exact from another client, most of
/// them from disk only.
fn lossless(master_flags: &[&str]) {
    let cluster = Cluster::start(master_flags);
    let dir = tier_dir("tier-lossless");
    let _storage = tier_storage(&cluster, dir.path(), &[]);
    let client = cluster.pure_client();
    let n = 64;
    put_all(&client, n);
    assert_all_exact(&client, (0..n).map(key));
    let disk_only = (0..n)
        .map(key)
        .filter(|k| kinds(&client, k) == (false, true))
        .count();
    assert!(
        disk_only > n / 2,
        "only {disk_only} of {n} keys are disk-only"
    );
    assert!(!tier_files(dir.path()).is_empty());
    // A second reader sees the same.
    let other = cluster.pure_client();
    assert_all_exact(&other, (0..n).map(key));
}

#[test]
fn offload_at_put_end_loses_nothing_at_four_times_memory() {
    lossless(&["--enable_offload=true"]);
}

#[test]
fn offload_on_evict_loses_nothing_at_four_times_memory() {
    lossless(&["--enable_offload=true", "--offload_on_evict=true"]);
}

/// A put into memory full of objects that could go to the tier waits for
/// their copies instead of answering -200: 4× memory in single puts and in
/// batches, not one refusal (every object stays offloadable throughout),
/// and every acknowledged key reads back byte-exact, most from disk only.
#[test]
fn puts_into_full_memory_wait_for_copies_and_are_never_refused() {
    let cluster = Cluster::start(&["--enable_offload=true", "--offload_on_evict=true"]);
    let dir = tier_dir("tier-room");
    let _storage = tier_storage(&cluster, dir.path(), &[]);
    let client = cluster.pure_client();
    let n = 64;
    let refused = put_all(&client, n);
    assert_eq!(
        refused, 0,
        "{refused} puts answered -200 while copies could be made"
    );
    // Batches of 8: a refused key of a batch waits as a single put does.
    let batch_keys: Vec<String> = (n..2 * n).map(key).collect();
    let mut refused = 0;
    for chunk in batch_keys.chunks(8) {
        let values: Vec<Vec<u8>> = chunk.iter().map(|k| value(k, VALUE)).collect();
        let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let results = client
            .put_batch(chunk, &slices, &ReplicaPolicy::default())
            .unwrap();
        for (k, r) in chunk.iter().zip(results) {
            match r {
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE => refused += 1,
                Err(e) => panic!("put {k}: {e}"),
            }
        }
    }
    assert_eq!(refused, 0, "{refused} batched puts answered -200");
    assert_all_exact(&client, (0..2 * n).map(key));
    let disk_only = (0..2 * n)
        .map(key)
        .filter(|k| kinds(&client, k) == (false, true))
        .count();
    assert!(
        disk_only > n,
        "only {disk_only} of {} keys are disk-only",
        2 * n
    );
}

#[test]
fn removed_and_replaced_objects_leave_the_tier() {
    let cluster = Cluster::start(&["--enable_offload=true"]);
    let dir = tier_dir("tier-remove");
    let _storage = tier_storage(&cluster, dir.path(), &[]);
    let client = cluster.pure_client();
    let n = 40;
    put_all(&client, n);
    eventually("every key on disk", || on_disk(&client, n).len() == n);
    // Disk-only objects exist and refuse a plain put, accept an upsert.
    let k0 = key(0);
    eventually("key 0 disk-only", || kinds(&client, &k0) == (false, true));
    assert_eq!(
        code(client.put(&k0, b"x", &ReplicaPolicy::default())),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    assert!(client.is_exist(&k0).unwrap());
    // The replica queries above leased every object still in memory, so
    // the upsert may have to wait for those leases to run out.
    until_room(&k0, || {
        let upsert = WriteOptions::upsert(&ReplicaPolicy::default());
        client.put(&k0, b"fresh bytes", upsert)
    });
    assert_eq!(client.get(&k0).unwrap(), b"fresh bytes");
    let k1 = key(1);
    client.remove(&k1, false).unwrap();
    assert!(!client.is_exist(&k1).unwrap());
    assert_eq!(code(client.get(&k1)), ErrorCode::OBJECT_NOT_FOUND);
    assert_all_exact(&client, (2..n).map(key));
}

#[test]
fn a_restarted_storage_client_serves_its_tier_at_once() {
    let cluster = Cluster::start(&["--enable_offload=true"]);
    let dir = tier_dir("tier-restart");
    let mut storage = tier_storage(&cluster, dir.path(), &[]);
    let client = cluster.pure_client();
    let n = 48;
    put_all(&client, n);
    eventually("every key on disk", || on_disk(&client, n).len() == n);
    storage.kill();
    let _storage = tier_storage(&cluster, dir.path(), &[]);
    // Readable as soon as the new process is ready: no TTL wait, no retry.
    assert_all_exact(&client, (0..n).map(key));
}

#[test]
fn kill_9_during_offload_brings_back_every_reported_copy() {
    let cluster = Cluster::start(&["--enable_offload=true"]);
    let dir = tier_dir("tier-kill9");
    let mut storage = tier_storage(&cluster, dir.path(), &[]);
    let client = cluster.pure_client();
    let n = 48;
    // Kill while copies are still being written: after the puts, with
    // some keys not reported durable yet (or all, on a fast disk).
    put_all(&client, n);
    let reported = on_disk(&client, n);
    storage.kill9();
    let _storage = tier_storage(&cluster, dir.path(), &[]);
    assert_all_exact(&client, reported.iter().cloned());
    for k in (0..n).map(key) {
        match client.get(&k) {
            Ok(v) => assert!(v == value(&k, VALUE), "{k}: wrong bytes"),
            Err(e) => assert!(!reported.contains(&k), "{k} was durable: {e}"),
        }
    }
}

#[test]
fn a_flipped_byte_is_detected_and_never_served() {
    let cluster = Cluster::start(&["--enable_offload=true"]);
    let dir = tier_dir("tier-corrupt");
    let mut storage = tier_storage(&cluster, dir.path(), &[]);
    let client = cluster.pure_client();
    let n = 32;
    put_all(&client, n);
    eventually("every key on disk", || on_disk(&client, n).len() == n);
    storage.kill();
    // Flip one byte in the middle of the first bucket's data.
    let bucket = tier_files(dir.path()).into_iter().next().unwrap();
    let mut bytes = std::fs::read(&bucket).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0x40;
    std::fs::write(&bucket, &bytes).unwrap();
    let _storage = tier_storage(&cluster, dir.path(), &[]);
    let mut failed = 0;
    for k in (0..n).map(key) {
        match client.get(&k) {
            Ok(v) => assert!(v == value(&k, VALUE), "{k}: corrupt bytes served"),
            Err(_) => failed += 1,
        }
    }
    assert_eq!(
        failed, 1,
        "exactly the object holding the flipped byte fails"
    );
}

#[test]
fn disk_eviction_keeps_the_tier_under_its_limit() {
    let cluster = Cluster::start(&["--enable_offload=true"]);
    let dir = tier_dir("tier-evict");
    let limit = 8u64 << 20;
    let limit_s = limit.to_string();
    let env = [
        ("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", limit_s.as_str()),
        ("MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "fifo"),
        ("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "4"),
    ];
    let _storage = tier_storage(&cluster, dir.path(), &env);
    let client = cluster.pure_client();
    let n = 96; // 24 MiB: 6x memory, 3x the tier
    put_all(&client, n);
    // Blocks, not lengths: an object evicted out of a bucket that keeps
    // others gives its blocks back as a hole, and the file keeps its length.
    let held: u64 = tier_files(dir.path())
        .iter()
        .map(|p| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap()) * 512)
        .sum();
    assert!(held <= limit, "{held} bytes on disk in the tier");
    let mut readable = Vec::new();
    for k in (0..n).map(key) {
        match client.get(&k) {
            Ok(v) => {
                assert!(v == value(&k, VALUE), "{k}: wrong bytes");
                readable.push(k);
            }
            Err(e) => assert_eq!(e.code, ErrorCode::OBJECT_NOT_FOUND, "{k}"),
        }
    }
    assert!(readable.len() < n, "something was evicted");
    // fifo: the newest keys survive.
    assert!(readable.contains(&key(n - 1)));
    assert!(!readable.contains(&key(0)));
}

#[test]
fn a_disk_only_object_read_twice_is_promoted_to_memory() {
    let cluster = Cluster::start(&[
        "--enable_offload=true",
        "--promotion_on_hit=true",
        "--promotion_admission_threshold=2",
    ]);
    let dir = tier_dir("tier-promote");
    let _storage = tier_storage(&cluster, dir.path(), &[]);
    let client = cluster.pure_client();
    let n = 40;
    put_all(&client, n);
    let k0 = key(0);
    eventually("key 0 disk-only", || kinds(&client, &k0) == (false, true));
    eventually("key 0 back in memory", || {
        assert!(client.get(&k0).unwrap() == value(&k0, VALUE));
        kinds(&client, &k0) == (true, true)
    });
    assert!(client.get(&k0).unwrap() == value(&k0, VALUE));
    let m = |name| metric(&cluster.http_addr, name);
    assert!(m("master_promotion_admitted_total") >= 1.0);
    assert!(m("master_promotion_completed_total") >= 1.0);
    assert!(m("master_promotion_completed_bytes_total") >= VALUE as f64);
    assert!(
        m("master_promotion_rejected_frequency_total") >= 1.0,
        "the first read"
    );
    assert!(m("file_cache_hit_nums_") >= 2.0, "two reads from disk");
}

/// A tier owner with `MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS=1` gets
/// one promotion per 1 s round: four queued at once complete no sooner
/// than 3 s apart end to end, and well before the 30 s the master's
/// default 10 s rounds would take.
#[test]
fn a_tier_with_a_1_s_heartbeat_gets_promotions_at_1_s_rounds() {
    let cluster = Cluster::start(&[
        "--enable_offload=true",
        "--promotion_on_hit=true",
        "--promotion_admission_threshold=1",
    ]);
    let dir = tier_dir("tier-round");
    let env = [("MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS", "1")];
    let _storage = tier_storage(&cluster, dir.path(), &env);
    let client = cluster.pure_client();
    let n = 40;
    put_all(&client, n);
    // The oldest four were evicted to make room (put_all waits for it);
    // not looked up before the timer starts, as a lookup queues their
    // promotion.
    let cold: Vec<String> = (0..4).map(key).collect();
    // Room in memory, so no promotion waits at the eviction watermark.
    for i in 4..n {
        let _ = client.remove(&key(i), true);
    }
    let completed = || metric(&cluster.http_addr, "master_promotion_completed_total");
    let before = completed();
    let start = std::time::Instant::now();
    for k in &cold {
        assert!(client.get(k).unwrap() == value(k, VALUE));
    }
    eventually("four promotions", || completed() >= before + 4.0);
    let took = start.elapsed();
    assert!(took >= Duration::from_secs(3), "paced in rounds: {took:?}");
    assert!(
        took < Duration::from_secs(25),
        "1 s rounds, not 10 s: {took:?}"
    );
    for k in &cold {
        assert!(client.get(k).unwrap() == value(k, VALUE));
    }
}
