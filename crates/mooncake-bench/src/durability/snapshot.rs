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
    live_round, restore, round, start_history, RestoreProgress, Shadow, SnapshotReport, Stores,
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
    /// A snapshot of the live state, as the master takes it (cut, objects
    /// walked live), taken right after the fill, and the puts meanwhile.
    pub live: SnapshotReport,
    pub live_total: Duration,
    pub live_during: PutLatency,
    /// Process RSS after the fill, and its peak while the live round ran
    /// and while the second (shadow) round ran, bytes (0: not on Linux).
    pub rss_steady: u64,
    pub rss_peak_live: u64,
    pub rss_peak_shadow: u64,
}

/// A field of `/proc/self/status`, bytes (0 when unreadable).
fn status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Starts measuring the peak RSS afresh (Linux: resets `VmHWM`).
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Runs `work` while putting keys `prefix/N` on `leader`; its result, how
/// long it took, the put latencies and the peak RSS meanwhile.
fn with_puts<T: Send>(
    leader: &MasterService,
    prefix: &str,
    now: u64,
    work: impl FnOnce() -> T + Send,
) -> (T, Duration, Vec<u64>, u64) {
    reset_peak();
    let t = Instant::now();
    let (out, ns) = std::thread::scope(|sc| {
        let job = sc.spawn(work);
        let mut ns = Vec::new();
        let mut i = 0;
        while !job.is_finished() {
            ns.push(put(leader, &format!("{prefix}/{i:09}"), now));
            i += 1;
        }
        (job.join().expect("snapshot round panicked"), ns)
    });
    (out, t.elapsed(), ns, status_bytes("VmHWM:"))
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
    std::thread::sleep(Duration::from_millis(200));
    report.rss_steady = status_bytes("VmRSS:");
    let (live, took, ns, peak) = with_puts(&leader, "live", 2, || {
        live_round(&leader, &|| 2, 2, &stores, &wal)
    });
    report.live = live?;
    report.live_total = took;
    report.live_during = latency(ns);
    report.rss_peak_live = peak;
    progress(format!(
        "live snapshot: {:.1} s, {} puts meanwhile",
        took.as_secs_f64(),
        report.live_during.puts
    ));
    let mut shadow: Option<Shadow> = None;
    report.first = round(&make, 2, &stores, &wal, &mut shadow)?;
    progress(format!("first snapshot: {:.1} s", secs(&report.first)));

    let idle: Vec<u64> = (0..20_000)
        .map(|i| put(&leader, &format!("idle/{i:09}"), 2))
        .collect();
    report.idle = latency(idle);

    // The master drops its shadow after each round.
    shadow = None;
    let (second, took, during, peak) = with_puts(&leader, "during", 3, || {
        round(&make, 2, &stores, &wal, &mut shadow)
    });
    report.second_total = took;
    report.second = second?;
    report.rss_peak_shadow = peak;
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
