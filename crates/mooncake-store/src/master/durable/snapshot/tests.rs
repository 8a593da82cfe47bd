//! Restart without loss, in process: a leader logging to a real
//! write-ahead log and taking snapshots, restored into a fresh master
//! from the files alone, ends in the leader's replicated state; damaged
//! snapshots fall back to older ones; retention and log truncation.

use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::durable::{round, Shadow};
use super::format::{self, SnapshotError, SnapshotMeta};
use super::live_round;
use super::store::{snapshot_name, LocalStore, SnapshotStore};
use super::{restore, RestoreProgress, Stores};
use crate::master::config::policy::AllocationStrategy;
use crate::master::durable::oplog::wal::{self, Wal, WalSink};
use crate::master::state::service::tests::{
    assert_same, segment, service, step, History, SEGMENTS, WRITERS,
};
use crate::master::state::service::MasterService;

const STRATEGY: AllocationStrategy = AllocationStrategy::FreeRatioFirst;

fn make() -> MasterService {
    service(STRATEGY)
}

struct Setup {
    leader: MasterService,
    wal: std::sync::Arc<Wal>,
    stores: Stores,
    _dir: tempfile::TempDir,
    wal_dir: std::path::PathBuf,
    snap_dir: std::path::PathBuf,
}

fn setup(sync: bool) -> Setup {
    setup_with(sync, false)
}

/// `fence`: the leader places puts in space reserved ahead (what a
/// master with a log does, `open`).
fn setup_with(sync: bool, fence: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("wal");
    let snap_dir = dir.path().join("snapshots");
    super::start_history(&wal_dir, 0).unwrap();
    let wal = Wal::start(&wal_dir, 1, sync).unwrap();
    let mut leader = make().with_sink(Box::new(WalSink(wal.clone())));
    if fence {
        leader = leader.with_put_fence();
    }
    for (name, owner) in SEGMENTS {
        leader.mount_segment(owner, &segment(name), 0).unwrap();
    }
    let stores = Stores::new(Box::new(LocalStore::new(&snap_dir).unwrap()), None);
    Setup {
        leader,
        wal,
        stores,
        _dir: dir,
        wal_dir,
        snap_dir,
    }
}

fn run(s: &Setup, rng: &mut StdRng, h: &mut History, steps: usize) {
    for _ in 0..steps {
        step(&s.leader, rng, h);
    }
}

fn restored(s: &Setup) -> super::Restored {
    s.wal.flush().unwrap();
    restore_from(s).unwrap()
}

/// Restores what `s`'s stores and log hold.
fn restore_from(s: &Setup) -> mooncake_common::Result<super::Restored> {
    let progress = RestoreProgress::default();
    restore(&make, Some(&s.stores), Some(&s.wal_dir), None, &progress)
}

#[test]
fn the_log_alone_rebuilds_the_state() {
    let s = setup(true);
    let mut rng = StdRng::seed_from_u64(1);
    let mut h = History::default();
    run(&s, &mut rng, &mut h, 2_000);
    let r = restored(&s);
    assert_eq!(r.report.snapshot, None);
    assert!(r.report.entries > 0);
    assert_same(&s.leader, &r.service, &h.tasks, "log only");
    let stats = s.wal.stats();
    assert!(stats.commits > 0 && stats.mutations >= stats.entries);
}

#[test]
fn snapshots_then_the_log_tail_rebuild_the_state() {
    let s = setup(false);
    let mut rng = StdRng::seed_from_u64(2);
    let mut h = History::default();
    let mut shadow: Option<Shadow> = None;
    let mut last = 0;
    for i in 0..4 {
        let n = rng.gen_range(300..900);
        run(&s, &mut rng, &mut h, n);
        let rep = round(&make, 2, &s.stores, &s.wal, &mut shadow).unwrap();
        assert!(rep.seq > last, "round {i}: {rep:?}");
        last = rep.seq;
        // The shadow is the leader's state at the cut.
        s.wal.flush().unwrap();
        let r = restored(&s);
        assert_eq!(r.report.snapshot, Some(rep.seq));
        assert_same(&s.leader, &r.service, &h.tasks, &format!("round {i}"));
    }
    // Retention: the two newest; the log reaches back to the older one.
    let kept = s.stores.main.list().unwrap();
    assert_eq!(kept.len(), 2, "{kept:?}");
    let first_log = wal::list_files(&s.wal_dir).unwrap()[0].0;
    assert!(first_log <= kept[0] + 1, "{first_log} vs {kept:?}");
    // Puts after the last snapshot are in the tail.
    run(&s, &mut rng, &mut h, 500);
    let r = restored(&s);
    assert_eq!(r.report.snapshot, Some(last));
    assert!(r.report.entries > 0);
    assert_same(&s.leader, &r.service, &h.tasks, "tail");
}

#[test]
fn live_rounds_under_heavy_mutation_cut_at_their_log_position() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    let s = setup_with(false, true);
    let mut rng = StdRng::seed_from_u64(9);
    let mut h = History::default();
    run(&s, &mut rng, &mut h, 300);
    let clock = AtomicU64::new(h.now);
    let stop = AtomicBool::new(false);
    let (leader, clock, stop) = (&s.leader, &clock, &stop);
    let mut seqs = Vec::new();
    let mut h = std::thread::scope(|sc| {
        let mutator = sc.spawn(move || {
            let mut rng = StdRng::seed_from_u64(10);
            while !stop.load(Relaxed) {
                step(leader, &mut rng, &mut h);
                clock.store(h.now, Relaxed);
            }
            h
        });
        // Many keys, so the rounds meet writes in many chunks: new keys,
        // upserts of existing ones and reads (a read moves the lease, so
        // it changes the object too), ahead of and behind the round.
        let bulk = sc.spawn(move || {
            let cfg = crate::types::ReplicaPolicy::default();
            let mut i = 0u64;
            while !stop.load(Relaxed) {
                let key = format!("bulk/{}", i % 6000);
                let now = clock.load(Relaxed);
                let upsert = i % 6000 < 2000;
                let _ = leader.put_start(WRITERS[1], &key, 64, &cfg, upsert, now);
                let _ = leader.put_end(WRITERS[1], &key, now);
                let read = format!("bulk/{}", i.wrapping_mul(2_654_435_761) % 6000);
                let _ = leader.get_replica_list(&read, now);
                if i.is_multiple_of(3) {
                    let _ = leader.remove(&format!("bulk/{}", (i / 3) % 6000), true, now);
                }
                i += 1;
            }
        });
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(30));
            // Later than every mutation before the cut: a step moves the
            // clock by less than a second.
            let now = || clock.load(Relaxed) + 1_000;
            let rep = live_round(leader, &now, 10, &s.stores, &s.wal).unwrap();
            seqs.push(rep.seq);
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        stop.store(true, Relaxed);
        bulk.join().unwrap();
        mutator.join().unwrap()
    });
    let last = *seqs.last().unwrap();
    assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "{seqs:?}");
    // Each later snapshot is the state at its position: what the first
    // one and the log up to that position rebuild (the log is kept from
    // the oldest snapshot on).
    let kept = s.stores.main.list().unwrap();
    let mut distinct = seqs.clone();
    distinct.dedup();
    assert_eq!(kept, distinct);
    assert!(kept.len() >= 2, "{kept:?}");
    let first_only = tempfile::tempdir().unwrap();
    let name = snapshot_name(kept[0]);
    std::fs::copy(s.snap_dir.join(&name), first_only.path().join(&name)).unwrap();
    let first_only = Stores::new(Box::new(LocalStore::new(first_only.path()).unwrap()), None);
    s.wal.flush().unwrap();
    let progress = RestoreProgress::default();
    for &seq in &kept[1..] {
        let at = |stores: &Stores| {
            restore(&make, Some(stores), Some(&s.wal_dir), Some(seq), &progress).unwrap()
        };
        let (alone, rebuilt) = (at(&s.stores), at(&first_only));
        assert_eq!(
            (alone.report.snapshot, alone.report.entries),
            (Some(seq), 0)
        );
        assert_eq!(rebuilt.report.snapshot, Some(kept[0]));
        assert_eq!(rebuilt.report.entries as u64, seq - kept[0]);
        assert_same(
            &rebuilt.service,
            &alone.service,
            &h.tasks,
            &format!("at {seq}"),
        );
    }
    run(&s, &mut rng, &mut h, 200);
    let r = restored(&s);
    assert_eq!(r.report.snapshot, Some(last));
    assert!(r.report.entries > 0, "a tail after it");
    assert_same(&s.leader, &r.service, &h.tasks, "live rounds");
}

fn damage(dir: &Path, seq: u64, how: &str) {
    let path = dir.join(snapshot_name(seq));
    let mut b = std::fs::read(&path).unwrap();
    match how {
        "truncate" => b.truncate(b.len() / 2),
        _ => {
            let at = b.len() / 2;
            b[at] ^= 0x40;
        }
    }
    std::fs::write(&path, b).unwrap();
}

#[test]
fn a_damaged_newest_snapshot_falls_back_to_the_previous_one() {
    for how in ["truncate", "flip"] {
        let s = setup(false);
        let mut rng = StdRng::seed_from_u64(3);
        let mut h = History::default();
        let mut shadow = None;
        run(&s, &mut rng, &mut h, 800);
        let older = round(&make, 2, &s.stores, &s.wal, &mut shadow).unwrap().seq;
        run(&s, &mut rng, &mut h, 800);
        let newer = round(&make, 2, &s.stores, &s.wal, &mut shadow).unwrap().seq;
        run(&s, &mut rng, &mut h, 300);
        damage(&s.snap_dir, newer, how);
        let r = restored(&s);
        assert_eq!(r.report.snapshot, Some(older), "{how}");
        assert_eq!(r.report.skipped, [newer]);
        assert_same(&s.leader, &r.service, &h.tasks, how);
    }
}

#[test]
fn a_fresh_history_ignores_older_snapshots() {
    let s = setup(false);
    let mut rng = StdRng::seed_from_u64(4);
    let mut h = History::default();
    run(&s, &mut rng, &mut h, 300);
    let mut shadow = None;
    let seq = round(&make, 2, &s.stores, &s.wal, &mut shadow).unwrap().seq;
    s.wal.flush().unwrap();
    s.wal.stop();
    // A new history starts past it; restoring it starts empty.
    super::start_history(&s.wal_dir, seq).unwrap();
    let r = restore_from(&s).unwrap();
    assert_eq!(r.report.snapshot, None);
    assert!(r.service.all_keys().is_empty());
}

#[test]
fn snapshot_frames_are_checked() {
    let s = setup(false);
    let mut rng = StdRng::seed_from_u64(5);
    let mut h = History::default();
    run(&s, &mut rng, &mut h, 300);
    let meta = SnapshotMeta {
        seq: 9,
        term: 1,
        now: h.now,
    };
    let bytes = format::encode(&s.leader, meta);
    assert_eq!(format::read_meta(&bytes).unwrap(), meta);
    let fresh = make();
    let progress = RestoreProgress::default();
    assert_eq!(
        format::decode_into(&bytes, &fresh, &progress).unwrap(),
        meta
    );
    assert_same(&s.leader, &fresh, &h.tasks, "decoded");
    let keys: usize = s.leader.objects_table().shards().map(|sh| sh.len()).sum();
    let keys = keys as u64;
    assert!(keys > 0);
    assert_eq!(
        progress.objects(),
        (keys, keys),
        "progress ends at the count"
    );
    for cut in [0, 3, 10, 19, 20, bytes.len() / 2, bytes.len() - 1] {
        let err = format::payload(&bytes[..cut]).unwrap_err();
        assert!(
            matches!(err, SnapshotError::Truncated),
            "cut {cut}: {err:?}"
        );
    }
    let mut bad = bytes.clone();
    bad[4] = format::VERSION + 1;
    assert_eq!(
        format::payload(&bad).unwrap_err(),
        SnapshotError::UnknownVersion(format::VERSION + 1)
    );
    for at in (format::HEADER_LEN..bytes.len()).step_by(97) {
        let mut bad = bytes.clone();
        bad[at] ^= 1;
        assert!(matches!(
            format::payload(&bad).unwrap_err(),
            SnapshotError::Checksum { .. }
        ));
    }
    // Decoded twice into one master: every range is already taken.
    let err = format::decode_into(&bytes, &fresh, &RestoreProgress::default()).unwrap_err();
    assert!(matches!(err, SnapshotError::Inconsistent(_)), "{err:?}");
}

#[test]
fn a_torn_log_tail_is_cut_and_everything_before_it_kept() {
    let s = setup(true);
    let mut rng = StdRng::seed_from_u64(6);
    let mut h = History::default();
    run(&s, &mut rng, &mut h, 500);
    s.wal.flush().unwrap();
    s.wal.stop();
    let (_, last) = wal::list_files(&s.wal_dir).unwrap().pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    // Half a frame of a write that never completed.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&last)
        .unwrap();
    std::io::Write::write_all(&mut f, &b"MCOL\x01\0\0\0\xff\0\0\0"[..]).unwrap();
    drop(f);
    let r = restore_from(&s).unwrap();
    assert_same(&s.leader, &r.service, &h.tasks, "torn");
    assert_eq!(std::fs::metadata(&last).unwrap().len(), len, "cut off");
    // Damage before the end is not a torn write: refused.
    let mut b = std::fs::read(&last).unwrap();
    b[20] ^= 1;
    std::fs::write(&last, b).unwrap();
    assert!(restore_from(&s).is_err());
}

#[test]
fn snapshots_on_an_s3_server_restore_and_fall_back() {
    use super::store::{S3Settings, S3Store};
    let s3 = test_support::services::start_s3("mooncake-snapshots");
    let settings = S3Settings {
        bucket: "mooncake-snapshots".into(),
        region: "us-east-1".into(),
        endpoint: Some(format!("http://{}", s3.addr)),
        access_key_id: Some("test".into()),
        secret_access_key: Some("test".into()),
        virtual_hosted: false,
        prefix: "cluster-a/".into(),
    };
    let mut s = setup(false);
    s.stores = Stores::new(Box::new(S3Store::new(settings.clone()).unwrap()), None);
    let mut rng = StdRng::seed_from_u64(7);
    let mut h = History::default();
    let mut shadow = None;
    let mut seqs = Vec::new();
    for _ in 0..3 {
        run(&s, &mut rng, &mut h, 600);
        seqs.push(round(&make, 2, &s.stores, &s.wal, &mut shadow).unwrap().seq);
    }
    assert_eq!(s.stores.main.list().unwrap(), seqs[1..], "retention on S3");
    run(&s, &mut rng, &mut h, 300);
    let r = restored(&s);
    assert_eq!(r.report.snapshot, Some(seqs[2]));
    assert_same(&s.leader, &r.service, &h.tasks, "s3");
    // A truncated newest object: the previous snapshot and the log.
    let name = snapshot_name(seqs[2]);
    let bytes = s.stores.main.get(&name).unwrap();
    s.stores.main.put(&name, &bytes[..bytes.len() / 3]).unwrap();
    let r = restored(&s);
    assert_eq!(r.report.snapshot, Some(seqs[1]));
    assert_eq!(r.report.skipped, [seqs[2]]);
    assert_same(&s.leader, &r.service, &h.tasks, "s3 fallback");
    // Another prefix sees none of them.
    let other = S3Store::new(S3Settings {
        prefix: "cluster-b/".into(),
        ..settings
    })
    .unwrap();
    assert!(other.list().unwrap().is_empty());
}

#[test]
fn restored_segments_wait_for_their_owner() {
    use mooncake_common::ErrorCode;
    let s = setup(false);
    let cfg = crate::types::ReplicaPolicy {
        preferred_segment: "b1".into(),
        ..Default::default()
    };
    s.leader.put_start(7, "k", 4096, &cfg, false, 1).unwrap();
    s.leader.put_end(7, "k", 2).unwrap();
    let r = restored(&s);
    // What `open` does after a restore.
    r.service.segments_table().unverify_all();
    let err = r.service.get_replica_list("k", 3).unwrap_err();
    assert_eq!(err.code, ErrorCode::REPLICA_IS_NOT_READY);
    // Another client's heartbeat verifies nothing; the owner's does.
    r.service.ping(1, 4).unwrap();
    assert!(r.service.get_replica_list("k", 5).is_err());
    r.service.ping(2, 6).unwrap();
    let got = r.service.get_replica_list("k", 7).unwrap();
    assert_eq!(got.replicas.len(), 1);
}

/// Reserved space (a replicated leader's, `segments::space`) is in the
/// snapshot: a master restored from it hands out none of it.
#[test]
fn reserved_space_survives_a_snapshot() {
    let leader = make().with_put_fence();
    for (name, owner) in SEGMENTS {
        leader.mount_segment(owner, &segment(name), 0).unwrap();
    }
    let cfg = crate::types::ReplicaPolicy::default();
    leader.put_start(7, "k", 1024, &cfg, false, 10).unwrap();
    let held: Vec<_> = leader
        .segments_table()
        .all()
        .iter()
        .map(|s| s.reserved_ranges())
        .collect();
    assert!(held.iter().any(|r| !r.is_empty()), "a region was reserved");
    let meta = SnapshotMeta {
        seq: 3,
        term: 1,
        now: 10,
    };
    let bytes = format::encode(&leader, meta);
    let back = make();
    format::decode_into(&bytes, &back, &RestoreProgress::default()).unwrap();
    assert_same(&leader, &back, &[], "restored");
}

/// Version 1 (no reserved space) and 2 (no object groups) snapshots are
/// still read.
#[test]
fn older_snapshots_are_read() {
    let leader = make();
    for (name, owner) in SEGMENTS {
        leader.mount_segment(owner, &segment(name), 0).unwrap();
    }
    let cfg = crate::types::ReplicaPolicy::default();
    leader.put_start(7, "k", 1024, &cfg, false, 10).unwrap();
    let meta = SnapshotMeta {
        seq: 3,
        term: 1,
        now: 10,
    };
    let mut old = format::encode(&leader, meta);
    for version in [2, 1] {
        // Version 3 ends with the count of groups, version 2 with the
        // count of reserved ranges: here 0 bytes.
        assert_eq!(old.pop(), Some(0));
        old[4] = version;
        let len = (old.len() - format::HEADER_LEN) as u64;
        old[8..16].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&old[4..16]), &old[format::HEADER_LEN..]);
        old[16..20].copy_from_slice(&crc.to_le_bytes());
        let back = make();
        assert_eq!(
            format::decode_into(&old, &back, &RestoreProgress::default()).unwrap(),
            meta
        );
        assert_same(&leader, &back, &[], &format!("version {version}"));
    }
}

/// A single master with its log: a put is answered once its reservation
/// is durable, not its own entry; restarted on the same directory, the
/// master retires the space reserved before (a put answered there may
/// have lost its entry while its writer goes on writing).
#[test]
fn a_restarted_master_retires_the_space_it_reserved_before() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::master::MasterConfig {
        enable_oplog: true,
        wal_dir: dir.path().join("wal").display().to_string(),
        ..Default::default()
    };
    let progress = RestoreProgress::default();
    let first = super::open(&config, &progress).unwrap();
    first.service.mount_segment(1, &segment("a1"), 0).unwrap();
    let start = crate::proto::Request::PutStart {
        client_id: 7,
        key: "k",
        value_len: 1024,
        config: crate::types::ReplicaPolicy::default(),
        upsert: false,
    };
    let answer = first.service.handle(start, 10);
    assert!(matches!(
        answer.response,
        crate::proto::Response::Replicas { result: Ok(_) }
    ));
    let crate::master::Release::Durable(upto) = answer.release else {
        panic!("{:?}", answer.release)
    };
    let wal = first.durability.wal.clone().unwrap();
    // The log's last position: the put's own entry.
    let own = wal.queued();
    assert!(own > upto, "its own entry comes later");
    wal.flush().unwrap();
    let reserved = |s: &MasterService| -> u64 {
        let segs = s.segments_table().all();
        segs.iter()
            .flat_map(|g| g.reserved_ranges())
            .map(|r| r.1)
            .sum()
    };
    assert!(reserved(&first.service) > 0);
    first.durability.stop();

    let second = super::open(&config, &progress).unwrap();
    assert_eq!(reserved(&second.service), 0, "no longer reserved");
    assert!(second.service.retired_bytes() > 0, "retired");
    assert!(second.service.exist_key("k", 20).is_ok());
    second.durability.stop();
}

/// Peak memory of a live round and of a shadow round over the same state,
/// and the latency of puts meanwhile: upserts in place of objects drawn at
/// random, so the rounds meet writes in every chunk and the state does not
/// grow, or with `MC_SNAP_PUTS=new` new keys (in process; `MC_SNAP_OBJECTS`,
/// default 10^6; `MC_SNAP_SHADOW=0` skips the shadow round). A
/// measurement, not a check: run it alone, with `--ignored --nocapture`.
#[test]
#[ignore]
fn measure_round_memory() {
    use std::time::{Duration, Instant};
    let objects: usize = std::env::var("MC_SNAP_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let status = |field: &str| -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
            * 1024
    };
    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("wal");
    super::start_history(&wal_dir, 0).unwrap();
    let wal = Wal::start(&wal_dir, 1, false).unwrap();
    let config = crate::master::config::MasterConfig::default();
    let make = || MasterService::new(&config);
    let leader = make().with_sink(Box::new(WalSink(wal.clone())));
    let seg = crate::types::SegmentInfo {
        name: "bench".into(),
        base: 1 << 40,
        size: 1 << 44,
        transport_endpoint: "127.0.0.1:1".into(),
    };
    leader.mount_segment(1, &seg, 0).unwrap();
    let stores = Stores::new(
        Box::new(LocalStore::new(dir.path().join("snapshots")).unwrap()),
        None,
    );
    let cfg = crate::types::ReplicaPolicy::default();
    let put = |key: &str| {
        let t = Instant::now();
        leader.put_start(1, key, 4096, &cfg, true, 1).unwrap();
        leader.put_end(1, key, 1).unwrap();
        t.elapsed().as_nanos() as u64
    };
    for i in 0..objects {
        put(&format!("bench/{i:09}"));
    }
    let p99 = |mut ns: Vec<u64>| {
        ns.sort_unstable();
        let n = ns.len();
        (
            n,
            ns[(n * 99 / 100).min(n - 1)] as f64 / 1e3,
            ns[n - 1] as f64 / 1e3,
        )
    };
    let settle = || {
        super::release_heap();
        std::thread::sleep(Duration::from_millis(300));
        status("VmRSS:")
    };
    let with_puts = |work: &(dyn Fn() + Sync)| {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let done = std::sync::atomic::AtomicBool::new(false);
        let t = Instant::now();
        let ns = std::thread::scope(|sc| {
            let job = sc.spawn(|| {
                work();
                done.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let mut ns = Vec::new();
            let mut rng = StdRng::seed_from_u64(3);
            let fresh = std::env::var("MC_SNAP_PUTS").as_deref() == Ok("new");
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let key = match fresh {
                    true => format!("new/{:09}", ns.len()),
                    false => format!("bench/{:09}", rng.gen_range(0..objects)),
                };
                ns.push(put(&key));
            }
            job.join().unwrap();
            ns
        });
        (t.elapsed(), p99(ns), status("VmHWM:"))
    };
    let mut rng = StdRng::seed_from_u64(4);
    let idle: Vec<u64> = (0..50_000)
        .map(|_| put(&format!("bench/{:09}", rng.gen_range(0..objects))))
        .collect();
    let steady = settle();
    let (took, lat, peak) = with_puts(&|| {
        live_round(&leader, &|| 2, 2, &stores, &wal).unwrap();
    });
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "{objects} objects: RSS {:.0} MiB; idle puts p99/max {:?}",
        mib(steady),
        p99(idle)
    );
    println!(
        "live round {:.1} s: peak {:.0} MiB ({:.2}x), puts (n, p99 us, max us) {lat:?}",
        took.as_secs_f64(),
        mib(peak),
        peak as f64 / steady as f64
    );
    if std::env::var("MC_SNAP_SHADOW").as_deref() == Ok("0") {
        wal.stop();
        return;
    }
    let steady = settle();
    let (took, lat, peak) = with_puts(&|| {
        let mut shadow: Option<Shadow> = None;
        round(&make, 2, &stores, &wal, &mut shadow).unwrap();
    });
    println!(
        "shadow round {:.1} s: RSS before {:.0} MiB, peak {:.0} MiB ({:.2}x), puts {lat:?}",
        took.as_secs_f64(),
        mib(steady),
        mib(peak),
        peak as f64 / steady as f64
    );
    wal.stop();
}
