//! `mooncake-bench ha`: what replicated metadata costs and how fast a
//! failover is, on an etcd given with `--etcd`:
//!
//! - 4 KiB put latency and single-thread throughput through one plain
//!   master, then through the leader of three `--enable_ha
//!   --enable_oplog` masters (each put waits until the standbys hold its
//!   entries), without and with each master's log on disk (`--wal_dir`,
//!   then also `--ha_wal_sync_ack`: the leader's fsync on the path);
//! - failover: `kill -9`, then SIGTERM, of the leader while a client
//!   puts and gets in a loop; the time from the signal to its first good
//!   put and get through the new leader, `runs` times each.
//!
//! The client holds its own segment (local topology), so the numbers are
//! the master path: what replication changes.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::ReplicateConfig;

use crate::cluster::{program, work_dir, Proc};
use crate::stats::{self, Summary};

pub struct HaBenchConfig {
    /// etcd `host:port`.
    pub etcd: String,
    pub seconds: f64,
    pub runs: usize,
}

/// One measured put phase.
pub struct PutRow {
    pub setup: &'static str,
    pub summary: Summary,
}

/// One failover.
pub struct FailoverRow {
    pub signal: &'static str,
    pub first_put: Duration,
    pub first_get: Duration,
}

fn err(what: String) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, what)
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| err(format!("free port: {e}")))?;
    Ok(l.local_addr().map_err(|e| err(e.to_string()))?.port())
}

fn metadata_server() -> Result<(Proc, String)> {
    let (exe, mut args) = program("mooncake_http_metadata_server")?;
    args.extend(["--port=0".to_string(), "--host=127.0.0.1".into()]);
    let log = work_dir()?.join("ha-metadata.log");
    let (proc, line) = Proc::spawn("metadata", &exe, &args, &[], log, "listening on")?;
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_string();
    Ok((proc, format!("http://{addr}/metadata")))
}

/// A replicated master: a child killed when dropped.
struct HaMaster {
    child: Option<Child>,
    rpc: u16,
}

impl HaMaster {
    fn start(
        name: &str,
        etcd: &str,
        cluster: &str,
        rpc: u16,
        extra: &[String],
    ) -> Result<HaMaster> {
        let (exe, mut args) = program("mooncake_master")?;
        args.extend(ha_flags(etcd, cluster, rpc));
        args.extend(extra.iter().cloned());
        let log = work_dir()?.join(format!("{name}.log"));
        let log =
            std::fs::File::create(&log).map_err(|e| err(format!("{}: {e}", log.display())))?;
        let child = Command::new(exe)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| err(format!("cannot start a master: {e}")))?;
        Ok(HaMaster {
            child: Some(child),
            rpc,
        })
    }

    fn serves(&self) -> bool {
        self.child.is_some() && std::net::TcpStream::connect(("127.0.0.1", self.rpc)).is_ok()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for HaMaster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn start_master(name: &str, flags: &[String], marker: &str) -> Result<(Proc, String)> {
    let (exe, mut args) = program("mooncake_master")?;
    args.extend(flags.iter().cloned());
    let log = work_dir()?.join(format!("{name}.log"));
    Proc::spawn(name, &exe, &args, &[], log, marker)
}

fn ha_flags(etcd: &str, cluster: &str, rpc: u16) -> Vec<String> {
    vec![
        "--enable_ha=true".into(),
        "--enable_oplog=true".into(),
        format!("--etcd_endpoints={etcd}"),
        format!("--cluster_id={cluster}"),
        format!("--rpc_port={rpc}"),
        "--rpc_address=127.0.0.1".into(),
        "--metrics_host=127.0.0.1".into(),
        "--metrics_port=0".into(),
    ]
}

/// Three replicated masters; the first leads. With `log`, each keeps its
/// log on disk (`--wal_dir` under the work directory), with
/// `--ha_wal_sync_ack` when `log` says so.
fn ha_cluster(etcd: &str, cluster: &str, log: Option<bool>) -> Result<Vec<HaMaster>> {
    let mut masters = Vec::new();
    for i in 0..3 {
        let mut extra = Vec::new();
        if let Some(sync_ack) = log {
            let dir = work_dir()?.join(format!("{cluster}-wal-{i}"));
            let _ = std::fs::remove_dir_all(&dir);
            extra.push(format!("--wal_dir={}", dir.display()));
            extra.push(format!("--ha_wal_sync_ack={sync_ack}"));
        }
        masters.push(HaMaster::start(
            &format!("ha-master-{i}"),
            etcd,
            cluster,
            free_port()?,
            &extra,
        )?);
        if i == 0 {
            let t = Instant::now();
            while !masters[0].serves() {
                if t.elapsed() > Duration::from_secs(30) {
                    return Err(err("the first replicated master never served".into()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // Let the standbys catch up and join the in-sync set.
    std::thread::sleep(Duration::from_secs(2));
    Ok(masters)
}

fn client(master: &str, cluster: &str, metadata: &str) -> Result<Client> {
    Client::setup(&ClientConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.to_string(),
        global_segment_size: 512 << 20,
        local_buffer_size: 64 << 20,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: master.to_string(),
        cluster_id: cluster.to_string(),
        ..ClientConfig::default()
    })
}

/// Puts distinct 4 KiB values for `seconds` (removing each afterwards
/// keeps the segment from filling); latencies of the puts.
fn put_phase(c: &Client, seconds: f64, prefix: &str) -> Result<Summary> {
    let v = vec![7u8; 4096];
    let cfg = ReplicateConfig::default();
    let mut lat = Vec::new();
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut i = 0;
    while Instant::now() < until {
        let key = format!("{prefix}-{i}");
        i += 1;
        let t = Instant::now();
        c.put(&key, &v, &cfg)?;
        lat.push(t.elapsed().as_nanos() as u64);
        c.remove(&key, true)?;
    }
    Ok(stats::summarize(&mut lat, 4096, 1))
}

/// Runs the benchmark; `progress` sees each put setup and each failover
/// as it ends.
pub fn run(
    cfg: &HaBenchConfig,
    mut progress: impl FnMut(String),
) -> Result<(Vec<PutRow>, Vec<FailoverRow>)> {
    let (_meta, metadata) = metadata_server()?;
    let mut puts = Vec::new();

    let rpc = free_port()?;
    let plain = [
        format!("--rpc_port={rpc}"),
        "--rpc_address=127.0.0.1".into(),
        "--metrics_host=127.0.0.1".into(),
        "--metrics_port=0".into(),
    ];
    let (plain_master, _) = start_master("plain-master", &plain, "listening on")?;
    let c = client(&format!("127.0.0.1:{rpc}"), "plain", &metadata)?;
    put_phase(&c, cfg.seconds / 4.0, "warm")?;
    puts.push(PutRow {
        setup: "1 master",
        summary: put_phase(&c, cfg.seconds, "plain")?,
    });
    progress(put_line(&puts[0]));
    drop(c);
    drop(plain_master);

    let etcd_url = format!("etcd://{}", cfg.etcd);
    let mut logged = Vec::new();
    for (setup, sync_ack) in [
        ("3 masters, replicated, log on disk", false),
        (
            "3 masters, replicated, log on disk, --ha_wal_sync_ack",
            true,
        ),
    ] {
        let cluster = format!("bench-ha-wal-{sync_ack}-{}", std::process::id());
        let masters = ha_cluster(&cfg.etcd, &cluster, Some(sync_ack))?;
        let c = client(&etcd_url, &cluster, &metadata)?;
        put_phase(&c, cfg.seconds / 4.0, "warm")?;
        let summary = put_phase(&c, cfg.seconds, "ha-wal")?;
        drop(c);
        drop(masters);
        logged.push(PutRow { setup, summary });
    }

    let cluster = format!("bench-ha-{}", std::process::id());
    let mut masters = ha_cluster(&cfg.etcd, &cluster, None)?;
    let c = client(&etcd_url, &cluster, &metadata)?;
    put_phase(&c, cfg.seconds / 4.0, "warm")?;
    puts.push(PutRow {
        setup: "3 masters, replicated",
        summary: put_phase(&c, cfg.seconds, "ha")?,
    });
    progress(put_line(&puts[1]));
    for row in logged {
        progress(put_line(&row));
        puts.push(row);
    }

    let mut failovers = Vec::new();
    for (signal, signo) in [("kill -9", libc::SIGKILL), ("SIGTERM", libc::SIGTERM)] {
        for run in 0..cfg.runs {
            let f = failover(&c, &mut masters, &cfg.etcd, &cluster, signal, signo, run)?;
            progress(format!(
                "{signal} {}/{}: first put after {:.0} ms, first get after {:.0} ms",
                run + 1,
                cfg.runs,
                f.first_put.as_secs_f64() * 1e3,
                f.first_get.as_secs_f64() * 1e3
            ));
            failovers.push(f);
        }
    }
    Ok((puts, failovers))
}

fn put_line(r: &PutRow) -> String {
    format!(
        "{}: {} puts, p50 {:.1} µs, p99 {:.1} µs",
        r.setup, r.summary.n, r.summary.p50_us, r.summary.p99_us
    )
}

/// Signals the leader and times the first good put and get after it; the
/// signalled master is restarted as a standby afterwards.
fn failover(
    c: &Client,
    masters: &mut [HaMaster],
    etcd: &str,
    cluster: &str,
    signal: &'static str,
    signo: i32,
    run: usize,
) -> Result<FailoverRow> {
    let cfg = ReplicateConfig::default();
    let v = vec![9u8; 4096];
    let key = format!("before-{signal}-{run}");
    c.put(&key, &v, &cfg)?;
    // The leader is the master the client reaches: the one whose port is bound
    // and which answers as leader; standbys do not bind their RPC port.
    let leader = masters
        .iter()
        .position(HaMaster::serves)
        .ok_or_else(|| err("no master serves".into()))?;
    let pid = masters[leader].child.as_ref().map_or(0, Child::id) as i32;
    let t = Instant::now();
    // SAFETY: kill(2) on a child this benchmark started and still holds.
    unsafe { libc::kill(pid, signo) };
    let (mut first_put, mut first_get) = (None, None);
    let mut i = 0;
    while first_put.is_none() || first_get.is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            return Err(err(format!("no good put and get within 60 s of {signal}")));
        }
        if first_put.is_none()
            && c.put(&format!("after-{signal}-{run}-{i}"), &v, &cfg)
                .is_ok()
        {
            first_put = Some(t.elapsed());
        }
        i += 1;
        if first_get.is_none() && c.get(&key).is_ok_and(|got| got == v) {
            first_get = Some(t.elapsed());
        }
    }
    // Back as a standby; give it time to catch up and join the set.
    masters[leader].stop();
    let rpc = masters[leader].rpc;
    masters[leader] = HaMaster::start(
        &format!("ha-master-{signal}-{run}"),
        etcd,
        cluster,
        rpc,
        &[],
    )?;
    std::thread::sleep(Duration::from_secs(2));
    Ok(FailoverRow {
        signal,
        first_put: first_put.unwrap_or_default(),
        first_get: first_get.unwrap_or_default(),
    })
}

/// Put latency per setup and each failover's times, drawn.
pub fn charts(puts: &[PutRow], failovers: &[FailoverRow]) -> Vec<crate::svg::Bars> {
    let put = |f: fn(&Summary) -> f64| {
        puts.iter()
            .map(|r| (r.setup.to_string(), f(&r.summary)))
            .collect()
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let failover = failovers
        .iter()
        .enumerate()
        .flat_map(|(i, f)| {
            [
                (
                    format!("{} #{} first put", f.signal, i + 1),
                    ms(f.first_put),
                ),
                (
                    format!("{} #{} first get", f.signal, i + 1),
                    ms(f.first_get),
                ),
            ]
        })
        .collect();
    vec![
        crate::svg::Bars::new("4 KiB put p50", "µs", put(|s| s.p50_us)),
        crate::svg::Bars::new("4 KiB put p99", "µs", put(|s| s.p99_us)),
        crate::svg::Bars::new(
            "Leader stopped: time to the first put and get",
            "ms",
            failover,
        ),
    ]
}

pub fn render(puts: &[PutRow], failovers: &[FailoverRow]) -> String {
    let rows: Vec<Vec<String>> = puts
        .iter()
        .map(|r| {
            vec![
                r.setup.to_string(),
                r.summary.n.to_string(),
                format!("{:.1}", r.summary.p50_us),
                format!("{:.1}", r.summary.p99_us),
                format!("{:.0}", r.summary.ops_s),
            ]
        })
        .collect();
    let mut out = stats::table(
        &["4 KiB put", "n", "p50 µs", "p99 µs", "puts/s (1 thread)"],
        &rows,
    );
    out.push('\n');
    let rows: Vec<Vec<String>> = failovers
        .iter()
        .map(|f| {
            vec![
                f.signal.to_string(),
                format!("{:.0}", f.first_put.as_secs_f64() * 1000.0),
                format!("{:.0}", f.first_get.as_secs_f64() * 1000.0),
            ]
        })
        .collect();
    out.push_str(&stats::table(
        &["leader stopped by", "first put (ms)", "first get (ms)"],
        &rows,
    ));
    out
}
