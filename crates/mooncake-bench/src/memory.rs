//! Master memory per object, measured like `benchmarks/master_memory.py`:
//! a `mooncake_master` process, one client mounting a segment big enough
//! for every object, N objects of `size` bytes written with
//! `batch_put_from` from one registered buffer, and the master's RSS growth
//! divided by N.

use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_store::types::ReplicaPolicy;
use serde::Serialize;

use crate::cluster;

#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    pub objects: usize,
    pub object_size: usize,
    pub failed_puts: usize,
    pub fill_seconds: f64,
    pub master_rss_before: u64,
    pub master_rss_after: u64,
    /// The master's peak RSS (VmHWM) over the run.
    pub master_rss_peak: u64,
    pub rss_bytes_per_object: f64,
    /// Seconds between snapshots, when they were on (the RSS after is
    /// the lowest over one interval after the first snapshot written
    /// after the fill).
    pub snapshot_interval_s: Option<u64>,
    pub segment_bytes: u64,
}

/// The master's RSS before and after the fill, and per object, drawn.
pub fn charts(r: &MemoryReport) -> Vec<crate::svg::Bars> {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    vec![
        crate::svg::Bars::new(
            format!("master RSS, {} objects of {} B", r.objects, r.object_size),
            "MiB",
            vec![
                ("before".into(), mib(r.master_rss_before)),
                ("after".into(), mib(r.master_rss_after)),
            ],
        ),
        crate::svg::Bars::new(
            "RSS per object",
            "bytes",
            vec![("per object".into(), r.rss_bytes_per_object)],
        ),
    ]
}

/// Fills a fresh master with `objects` objects of `size` bytes, `batch` per
/// call; with `snapshot_interval_s`, the master takes snapshots that often.
pub fn run(
    objects: usize,
    size: usize,
    batch: usize,
    snapshot_interval_s: Option<u64>,
    mut progress: impl FnMut(usize, u64),
) -> Result<MemoryReport> {
    if objects == 0 || size == 0 || batch == 0 {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "objects, size and batch must be positive",
        ));
    }
    let snapshots = cluster::work_dir()?.join("memory-snapshots");
    let (env, extra) = match snapshot_interval_s {
        Some(s) => (
            vec![(
                "MOONCAKE_SNAPSHOT_LOCAL_PATH".to_string(),
                snapshots.display().to_string(),
            )],
            vec![
                "--enable_snapshot=true".to_string(),
                format!("--snapshot_interval_seconds={s}"),
            ],
        ),
        None => (Vec::new(), Vec::new()),
    };
    let master = cluster::start_master(&env, &extra)?;
    let pid = master.proc.pid();
    // Stay below the eviction watermark.
    let segment = (objects as f64 * size as f64 * 1.3) as u64 + (64 << 20);
    let client = master.tcp_client(segment)?;
    std::thread::sleep(Duration::from_secs(1));
    let before = cluster::rss_bytes(pid)?;
    let src = vec![0x5au8; size];
    let addr = src.as_ptr() as usize;
    client.register_buffer(addr, size)?;
    let rc = ReplicaPolicy::default();
    let t0 = Instant::now();
    let mut failed = 0;
    for start in (0..objects).step_by(batch) {
        let n = batch.min(objects - start);
        let keys: Vec<String> = (start..start + n).map(|i| format!("mem/{i:08}")).collect();
        let rs = client.batch_put_from(&keys, &vec![addr; n], &vec![size; n], &rc)?;
        failed += rs.iter().filter(|r| r.is_err()).count();
        if (start / batch).is_multiple_of(200) {
            progress(start, cluster::rss_bytes(pid).unwrap_or(0));
        }
    }
    let fill_seconds = t0.elapsed().as_secs_f64();
    let after = match snapshot_interval_s {
        Some(s) => {
            await_snapshot(&snapshots, std::time::SystemTime::now(), s)?;
            // Between rounds: the lowest RSS over one interval after it,
            // as a round's own copy may still be going when it appears.
            let mut low = u64::MAX;
            let until = Instant::now() + Duration::from_secs(s.max(2));
            while Instant::now() < until {
                low = low.min(cluster::rss_bytes(pid)?);
                std::thread::sleep(Duration::from_millis(250));
            }
            low
        }
        None => {
            std::thread::sleep(Duration::from_secs(2));
            cluster::rss_bytes(pid)?
        }
    };
    let stored = (objects - failed).max(1);
    let _ = client.unregister_buffer(addr);
    let _ = client.close();
    Ok(MemoryReport {
        objects,
        object_size: size,
        failed_puts: failed,
        fill_seconds: (fill_seconds * 10.0).round() / 10.0,
        master_rss_before: before,
        master_rss_after: after,
        master_rss_peak: peak_rss(pid).unwrap_or(0),
        snapshot_interval_s,
        rss_bytes_per_object: ((after.saturating_sub(before)) as f64 / stored as f64 * 10.0)
            .round()
            / 10.0,
        segment_bytes: segment,
    })
}

/// Waits for a snapshot file under `dir` written after `since`.
fn await_snapshot(
    dir: &std::path::Path,
    since: std::time::SystemTime,
    interval_s: u64,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(interval_s * 3 + 600);
    while Instant::now() < deadline {
        let newer = walk(dir).into_iter().any(|p| {
            std::fs::metadata(&p)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > since)
        });
        if newer {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(Error::new(
        ErrorCode::INTERNAL_ERROR,
        format!("no snapshot under {} after the fill", dir.display()),
    ))
}

pub(crate) fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            files.extend(walk(&p));
        } else {
            files.push(p);
        }
    }
    files
}

/// The process's peak RSS (VmHWM), in bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
