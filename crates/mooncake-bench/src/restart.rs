//! Restart time of a real `mooncake_master` from a snapshot and a log
//! tail: fill a master (snapshots on) with N objects, wait for a snapshot
//! taken after the fill, put a tail of M more objects (log entries after
//! the snapshot), stop it, and time a new master on the same directory
//! from its start to its ready line (every port serving). The restarted
//! master's own startup log lines (`restore:` steps with their times) are
//! returned with it.

use std::path::Path;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_store::client::Client;
use mooncake_store::types::ReplicaPolicy;
use serde::Serialize;

use crate::cluster;

#[derive(Debug, Clone, Serialize)]
pub struct RestartReport {
    pub objects: usize,
    pub tail: usize,
    pub fill_seconds: f64,
    /// The newest snapshot's size when the master stopped.
    pub snapshot_bytes: u64,
    /// The log files' total size when the master stopped.
    pub log_bytes: u64,
    /// From the new master's start to its ready line.
    pub restart_seconds: f64,
    /// CPU time (user + system) the restarted master had used when it
    /// became ready: on a shared machine, what the wall time would be
    /// with one core to itself and no overlap.
    pub restart_cpu_seconds: f64,
    /// The restarted master's RSS when it became ready.
    pub rss_after_restart: u64,
    /// The restarted master's log lines about the restore.
    pub startup_log: Vec<String>,
}

fn err(msg: String) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, msg)
}

fn put_range(
    client: &Client,
    from: usize,
    to: usize,
    batch: usize,
    addr: usize,
    size: usize,
) -> Result<usize> {
    let rc = ReplicaPolicy::default();
    let mut failed = 0;
    for start in (from..to).step_by(batch) {
        let n = batch.min(to - start);
        let keys: Vec<String> = (start..start + n).map(|i| format!("mem/{i:08}")).collect();
        let rs = client.batch_put_from(&keys, &vec![addr; n], &vec![size; n], &rc)?;
        failed += rs.iter().filter(|r| r.is_err()).count();
    }
    Ok(failed)
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// User + system CPU seconds of process `pid` (all its threads).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which ends at the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks as f64 / hz.max(1) as f64)
}

/// What the first master left: the fill's figures, kept beside a copy of
/// its snapshot directory by `--keep` and read back by `--from`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct Filled {
    objects: usize,
    tail: usize,
    fill_seconds: f64,
    snapshot_bytes: u64,
    log_bytes: u64,
}

/// Copies the directory tree `from` into `to` (created).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let io = |e: std::io::Error| err(format!("copy {} to {}: {e}", from.display(), to.display()));
    std::fs::create_dir_all(to).map_err(io)?;
    for e in std::fs::read_dir(from).map_err(io)? {
        let p = e.map_err(io)?.path();
        let dest = to.join(p.file_name().expect("a directory entry has a name"));
        if p.is_dir() {
            copy_tree(&p, &dest)?;
        } else {
            std::fs::copy(&p, &dest).map_err(io)?;
        }
    }
    Ok(())
}

/// Where the restart bench takes its snapshot from and leaves it.
#[derive(Debug, Default, Clone)]
pub struct Reuse {
    /// Skip the fill: restart from the state `keep` left in this folder.
    pub from: Option<std::path::PathBuf>,
    /// Keep a copy of the stopped master's state in this folder (for
    /// later runs with `from`, by this build or another).
    pub keep: Option<std::path::PathBuf>,
}

/// Runs the measurement; `progress` sees each step.
pub fn run(
    objects: usize,
    tail: usize,
    object_size: usize,
    batch: usize,
    interval_s: u64,
    reuse: &Reuse,
    mut progress: impl FnMut(String),
) -> Result<RestartReport> {
    if objects == 0 || object_size == 0 || batch == 0 {
        return Err(err("objects, size and batch must be positive".into()));
    }
    let dir = cluster::work_dir()?.join("restart-snapshots");
    let _ = std::fs::remove_dir_all(&dir);
    let env = vec![(
        "MOONCAKE_SNAPSHOT_LOCAL_PATH".to_string(),
        dir.display().to_string(),
    )];
    let mut flags = vec![
        "--enable_snapshot=true".to_string(),
        format!("--snapshot_interval_seconds={interval_s}"),
    ];
    let filled = match &reuse.from {
        Some(from) => {
            copy_tree(&from.join("state"), &dir)?;
            let text = std::fs::read_to_string(from.join("fill.json"))
                .map_err(|e| err(format!("{}: {e}", from.join("fill.json").display())))?;
            serde_json::from_str(&text).map_err(|e| err(format!("fill.json: {e}")))?
        }
        None => fill(
            &dir,
            &env,
            &flags,
            objects,
            tail,
            object_size,
            batch,
            interval_s,
            &mut progress,
        )?,
    };
    if let Some(keep) = &reuse.keep {
        let _ = std::fs::remove_dir_all(keep);
        copy_tree(&dir, &keep.join("state"))?;
        let json = serde_json::to_string_pretty(&filled).map_err(|e| err(e.to_string()))?;
        std::fs::write(keep.join("fill.json"), json)
            .map_err(|e| err(format!("{}: {e}", keep.display())))?;
        progress(format!(
            "kept the stopped master's state in {}",
            keep.display()
        ));
    }
    flags.push("--enable_snapshot_restore=true".into());
    let t = Instant::now();
    let again = cluster::start_master(&env, &flags)?;
    let restart_seconds = t.elapsed().as_secs_f64();
    let restart_cpu_seconds = cpu_seconds(again.proc.pid()).unwrap_or(0.0);
    let rss_after_restart = cluster::rss_bytes(again.proc.pid())?;
    let log = std::fs::read_to_string(cluster::work_dir()?.join("master.log")).unwrap_or_default();
    let startup_log = log
        .lines()
        .filter(|l| l.contains("restor") || l.contains("startup"))
        .map(str::to_owned)
        .collect();
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(RestartReport {
        objects: filled.objects,
        tail: filled.tail,
        fill_seconds: (filled.fill_seconds * 10.0).round() / 10.0,
        snapshot_bytes: filled.snapshot_bytes,
        log_bytes: filled.log_bytes,
        restart_seconds,
        restart_cpu_seconds,
        rss_after_restart,
        startup_log,
    })
}

/// Fills a master on `dir` with `objects`, waits for a snapshot after
/// the fill, puts `tail` more and stops it.
#[allow(clippy::too_many_arguments)]
fn fill(
    dir: &Path,
    env: &[(String, String)],
    flags: &[String],
    objects: usize,
    tail: usize,
    object_size: usize,
    batch: usize,
    interval_s: u64,
    progress: &mut impl FnMut(String),
) -> Result<Filled> {
    let master = cluster::start_master(env, flags)?;
    let segment = ((objects + tail) as f64 * object_size as f64 * 1.3) as u64 + (64 << 20);
    let client = master.tcp_client(segment)?;
    let src = vec![0x5au8; object_size];
    let addr = src.as_ptr() as usize;
    client.register_buffer(addr, object_size)?;
    let t0 = Instant::now();
    let failed = put_range(&client, 0, objects, batch, addr, object_size)?;
    let fill_seconds = t0.elapsed().as_secs_f64();
    progress(format!(
        "filled {objects} objects in {fill_seconds:.1} s ({failed} failed)"
    ));
    // Wait for a snapshot written after the fill, then put the tail.
    let filled = std::time::SystemTime::now();
    let deadline = Instant::now() + Duration::from_secs(interval_s * 3 + 900);
    let snapshot = loop {
        let newest = crate::memory::walk(dir)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "mcs"))
            .find(|p| {
                std::fs::metadata(p)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t > filled)
            });
        if let Some(p) = newest {
            break p;
        }
        if Instant::now() > deadline {
            return Err(err(format!(
                "no snapshot under {} after the fill",
                dir.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    progress(format!(
        "snapshot {} ({} bytes)",
        snapshot.display(),
        size(&snapshot)
    ));
    put_range(&client, objects, objects + tail, batch, addr, object_size)?;
    progress(format!("put a tail of {tail} objects"));
    // A stop as an operator's (SIGTERM); the client goes after it, so its
    // objects stay in the log and the snapshot.
    drop(master);
    drop(client);
    let files = crate::memory::walk(dir);
    let log_bytes = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| size(p))
        .sum();
    Ok(Filled {
        objects,
        tail,
        fill_seconds,
        snapshot_bytes: size(&snapshot),
        log_bytes,
    })
}
