//! Measurements of the snapshot path at scale, in process (no RPC): the
//! time to take and restore a snapshot of N objects, and what a snapshot
//! round does to the latency of puts running at the same time.
//! `mooncake-bench durability` prints them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::Result;

use mooncake_store::master::durable::oplog::{self, wal::Wal};
use mooncake_store::master::durable::snapshot::store::LocalStore;
use mooncake_store::master::durable::snapshot::{
    restore, round, start_history, RestoreProgress, Shadow, SnapshotReport, Stores,
};
use mooncake_store::master::{MasterConfig, MasterService};
use mooncake_store::types::{ReplicaPolicy, SegmentInfo};

/// Put latencies of one phase, microseconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PutLatency {
    pub puts: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

#[derive(Debug, Clone, Default)]
pub struct SnapshotBench {
    pub objects: usize,
    pub fill: Duration,
    /// The first snapshot: its shadow copy is built from the log.
    pub first: SnapshotReport,
    /// A later snapshot, as the master takes it: the shadow is rebuilt
    /// from the first snapshot and the log after it.
    pub second: SnapshotReport,
    pub second_total: Duration,
    pub restore: Duration,
    pub restored_objects: u64,
    /// Puts with no snapshot running, and while the second one runs.
    pub idle: PutLatency,
    pub during: PutLatency,
}

fn latency(mut ns: Vec<u64>) -> PutLatency {
    ns.sort_unstable();
    let at = |p: f64| {
        if ns.is_empty() {
            return 0.0;
        }
        let i = ((p / 100.0) * ns.len() as f64).ceil() as usize;
        ns[i.clamp(1, ns.len()) - 1] as f64 / 1e3
    };
    PutLatency {
        puts: ns.len(),
        p50_us: at(50.0),
        p99_us: at(99.0),
        max_us: ns.last().map_or(0.0, |&x| x as f64 / 1e3),
    }
}

fn secs(r: &SnapshotReport) -> f64 {
    (r.apply + r.encode + r.store).as_secs_f64()
}

/// One 4 KiB put (start and end) of `key`; its latency in ns.
fn put(s: &MasterService, key: &str, now: u64) -> u64 {
    let t = Instant::now();
    let cfg = ReplicaPolicy::default();
    s.put_start(1, key, 4096, &cfg, false, now)
        .and_then(|_| s.put_end(1, key, now))
        .expect("room for every put");
    t.elapsed().as_nanos() as u64
}

/// Fills a master logging to `dir` (its log and snapshots; emptied
/// first) with `objects` objects, then takes two snapshots and restores;
/// `progress` sees each step (and each tenth of the fill) as it ends.
pub fn run(objects: usize, dir: &Path, progress: &mut dyn FnMut(String)) -> Result<SnapshotBench> {
    let _ = std::fs::remove_dir_all(dir);
    let wal_dir = dir.join("wal");
    start_history(&wal_dir, 0)?;
    let wal = Wal::start(&wal_dir, 1, false)?;
    let config = MasterConfig::default();
    let make = || MasterService::new(&config);
    let leader = Arc::new(oplog::logged(make(), &wal));
    let seg = SegmentInfo {
        name: "bench".into(),
        base: 1 << 40,
        size: 1 << 44,
        transport_endpoint: "127.0.0.1:1".into(),
    };
    leader.mount_segment(1, &seg, 0)?;
    let stores = Stores::new(Box::new(LocalStore::new(dir.join("snapshots"))?), None);
    let mut report = SnapshotBench {
        objects,
        ..SnapshotBench::default()
    };
    let t = Instant::now();
    let tenth = (objects / 10).max(1);
    for i in 0..objects {
        put(&leader, &format!("bench/{i:09}"), 1);
        if (i + 1) % tenth == 0 || i + 1 == objects {
            progress(format!("filled {}/{objects} objects", i + 1));
        }
    }
    report.fill = t.elapsed();
    let mut shadow: Option<Shadow> = None;
    report.first = round(&make, 2, &stores, &wal, &mut shadow)?;
    progress(format!("first snapshot: {:.1} s", secs(&report.first)));

    let idle: Vec<u64> = (0..20_000)
        .map(|i| put(&leader, &format!("idle/{i:09}"), 2))
        .collect();
    report.idle = latency(idle);

    // The master drops its shadow after each round.
    shadow = None;
    let t = Instant::now();
    let (second, during) = std::thread::scope(|sc| {
        let snap = sc.spawn(|| round(&make, 2, &stores, &wal, &mut shadow));
        let mut ns = Vec::new();
        let mut i = 0;
        while !snap.is_finished() {
            ns.push(put(&leader, &format!("during/{i:09}"), 3));
            i += 1;
        }
        (snap.join().expect("snapshot round panicked"), ns)
    });
    report.second_total = t.elapsed();
    report.second = second?;
    progress(format!(
        "later snapshot: {:.1} s, {} puts meanwhile",
        secs(&report.second),
        during.len()
    ));
    report.during = latency(during);

    wal.flush()?;
    let t = Instant::now();
    let r = restore(
        &make,
        Some(&stores),
        Some(&wal_dir),
        None,
        &RestoreProgress::default(),
    )?;
    report.restore = t.elapsed();
    report.restored_objects = r.service.stats(r.now).key_count;
    progress(format!(
        "restore: {:.1} s, {} objects",
        report.restore.as_secs_f64(),
        report.restored_objects
    ));
    wal.stop();
    Ok(report)
}
