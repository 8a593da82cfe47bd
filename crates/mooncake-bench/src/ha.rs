//! `mooncake-bench ha`: what replicated metadata costs and how fast a
//! failover is, on an etcd given with `--etcd`:
//!
//! - 4 KiB put latency and throughput (one client thread, then
//!   `--threads` of them sharing the client) through one plain
//!   master, then through the leader of three `--enable_ha
//!   --enable_oplog` masters (each put waits until the standbys hold its
//!   entries), without and with each master's log on disk (`--wal_dir`,
//!   then also `--ha_wal_sync_ack`: the leader's fsync on the path). All
//!   setups are up at once and their phases take turns, `--repeats`
//!   rounds, each replicated phase reported against the plain one of its
//!   round (the machine's load changes between rounds, not within one);
//! - with `--floor`, the same put phases through the floor
//!   ([`crate::floor`]): a leader process and two standby processes with
//!   no state machine, reached in four ways, so each replicated phase is
//!   also reported against the least this machine needs to replicate a
//!   put to both standbys (the fastest such floor of its round); and
//!   floors whose put waits for one standby only (the first of two, or
//!   the only one);
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
use mooncake_store::types::ReplicaPolicy;

use crate::cluster::{program, work_dir, Proc};
use crate::floor::{Floor, FloorClient, Mode, Quorum};
use crate::stats::{self, Summary};

pub struct HaBenchConfig {
    /// etcd `host:port`.
    pub etcd: String,
    pub seconds: f64,
    /// Failovers per signal (0: none).
    pub runs: usize,
    /// Rounds of put phases.
    pub repeats: usize,
    /// Also the setups with each master's log on disk.
    pub wal: bool,
    /// Also the replicated setup without the put fence.
    pub unfenced: bool,
    /// Client threads of the second put phase (1: none).
    pub threads: usize,
    /// Also the floor setups (`crate::floor`).
    pub floor: bool,
}

/// One measured put phase.
pub struct PutRow {
    pub setup: &'static str,
    /// Which round of the phases it ran in.
    pub repeat: usize,
    /// Client threads putting at once.
    pub threads: usize,
    /// `ops_s` is puts over the wall time spent putting.
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
        env: &[(&str, &str)],
    ) -> Result<HaMaster> {
        let (exe, mut args) = program("mooncake_master")?;
        args.extend(ha_flags(etcd, cluster, rpc));
        args.extend(extra.iter().cloned());
        let log = work_dir()?.join(format!("{name}.log"));
        let log =
            std::fs::File::create(&log).map_err(|e| err(format!("{}: {e}", log.display())))?;
        let child = Command::new(exe)
            .args(&args)
            .envs(env.iter().copied())
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
fn ha_cluster(
    etcd: &str,
    cluster: &str,
    log: Option<bool>,
    env: &[(&str, &str)],
) -> Result<Vec<HaMaster>> {
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
            env,
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

/// Puts distinct 4 KiB values for `seconds` of wall time from `threads`
/// threads sharing `c`: latencies of the puts, and puts per second of
/// wall time. The phase runs in slices; between two, each thread removes
/// what it put (untimed, so the segment does not fill).
fn put_phase(c: &Putter, seconds: f64, prefix: &str, threads: usize) -> Result<Summary> {
    const SLICE: f64 = 0.25;
    let slices = (seconds / SLICE).ceil().max(1.0) as usize;
    let per_slice = Duration::from_secs_f64(seconds / slices as f64);
    let barrier = std::sync::Barrier::new(threads);
    let v = vec![7u8; 4096];
    let cfg = ReplicaPolicy::default();
    let outcomes: Vec<Result<(Vec<u64>, Duration)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, v, cfg) = (&barrier, &v, &cfg);
                scope.spawn(move || {
                    let mut lat = Vec::new();
                    let mut wall = Duration::ZERO;
                    let mut failed = None;
                    let mut keys = Vec::new();
                    let mut segment = vec![0u8; v.len()];
                    for slice in 0..slices {
                        // Every thread passes every barrier, failed or not.
                        barrier.wait();
                        let start = Instant::now();
                        let until = start + per_slice;
                        while failed.is_none() && Instant::now() < until {
                            let key = format!("{prefix}-{t}-{slice}-{}", keys.len());
                            let at = Instant::now();
                            let put = match c {
                                Putter::Store(c) => c.put(&key, v, cfg),
                                Putter::Floor(f) => f.put(&key, v, &mut segment),
                            };
                            match put {
                                Ok(()) => lat.push(at.elapsed().as_nanos() as u64),
                                Err(e) => failed = Some(e),
                            }
                            keys.push(key);
                        }
                        barrier.wait();
                        wall += start.elapsed();
                        for key in keys.drain(..) {
                            if let Putter::Store(c) = c {
                                if let Err(e) = c.remove(&key, true) {
                                    failed.get_or_insert(e);
                                }
                            }
                        }
                    }
                    failed.map_or(Ok((lat, wall)), Err)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(err("a put thread panicked".into())))
            })
            .collect()
    });
    let mut lat = Vec::new();
    let mut wall = Duration::ZERO;
    for o in outcomes {
        let (l, w) = o?;
        lat.extend(l);
        // The threads' slices start and end at the same barriers.
        wall = wall.max(w);
    }
    let mut summary = stats::summarize(&mut lat, 4096, 1);
    summary.ops_s = summary.n as f64 / wall.as_secs_f64().max(1e-9);
    Ok(summary)
}

/// What a put phase puts through.
enum Putter {
    /// A store client of a master (or of the leader of masters).
    Store(Client),
    /// The client of a floor (`crate::floor`).
    Floor(FloorClient),
}

/// One setup the put phases run on: its client and what serves it.
struct Setup {
    name: &'static str,
    client: Putter,
    _plain: Option<Proc>,
    _floor: Option<Floor>,
    masters: Vec<HaMaster>,
}

/// Runs the benchmark; `progress` sees each put phase and each failover
/// as it ends. Every setup is started first and stays up; the phases then
/// take turns, `repeats` rounds of one phase per setup, so that each
/// replicated phase has a plain one next to it under the same load.
pub fn run(
    cfg: &HaBenchConfig,
    mut progress: impl FnMut(String),
) -> Result<(Vec<PutRow>, Vec<FailoverRow>)> {
    let (_meta, metadata) = metadata_server()?;
    let mut setups = Vec::new();

    let rpc = free_port()?;
    let plain = [
        format!("--rpc_port={rpc}"),
        "--rpc_address=127.0.0.1".into(),
        "--metrics_host=127.0.0.1".into(),
        "--metrics_port=0".into(),
    ];
    let (plain_master, _) = start_master("plain-master", &plain, "listening on")?;
    setups.push(Setup {
        name: PLAIN,
        client: Putter::Store(client(&format!("127.0.0.1:{rpc}"), "plain", &metadata)?),
        _plain: Some(plain_master),
        _floor: None,
        masters: Vec::new(),
    });

    let etcd_url = format!("etcd://{}", cfg.etcd);
    let fenced: &[(&str, &str)] = &[];
    let mut kinds = vec![(REPLICATED, None, fenced)];
    let unfenced: &[(&str, &str)] = &[("MC_PUT_FENCE", "0")];
    if cfg.unfenced {
        kinds.push((UNFENCED, None, unfenced));
    }
    if cfg.wal {
        kinds.push(("3 masters, replicated, log on disk", Some(false), fenced));
        kinds.push((
            "3 masters, replicated, log on disk, --ha_wal_sync_ack",
            Some(true),
            fenced,
        ));
    }
    for (name, log, env) in kinds {
        let tag = match log {
            None if env.is_empty() => "mem".to_string(),
            None => "unfenced".to_string(),
            Some(sync) => format!("wal-{sync}"),
        };
        let cluster = format!("bench-ha-{tag}-{}", std::process::id());
        let masters = ha_cluster(&cfg.etcd, &cluster, log, env)?;
        setups.push(Setup {
            name,
            client: Putter::Store(client(&etcd_url, &cluster, &metadata)?),
            _plain: None,
            _floor: None,
            masters,
        });
    }
    if cfg.floor {
        for (name, mode, quorum) in FLOORS {
            let floor = Floor::start(mode, quorum)?;
            let f = FloorClient::connect(floor.address())?;
            setups.push(Setup {
                name,
                client: Putter::Floor(f),
                _plain: None,
                _floor: Some(floor),
                masters: Vec::new(),
            });
        }
    }
    for s in &setups {
        put_phase(&s.client, cfg.seconds / 4.0, "warm", cfg.threads)?;
    }

    let mut puts = Vec::new();
    for repeat in 0..cfg.repeats {
        let mut counts = vec![1];
        if cfg.threads > 1 {
            counts.push(cfg.threads);
        }
        for &threads in &counts {
            for s in &setups {
                let prefix = format!("r{repeat}-t{threads}");
                let summary = put_phase(&s.client, cfg.seconds, &prefix, threads)?;
                let row = PutRow {
                    setup: s.name,
                    repeat,
                    threads,
                    summary,
                };
                progress(put_line(&row));
                puts.push(row);
            }
        }
    }

    // The failovers run on the replicated setup without a log on disk.
    setups.retain(|s| s.name == REPLICATED);
    let Some(Setup {
        client: Putter::Store(c),
        mut masters,
        ..
    }) = setups.pop()
    else {
        return Err(err("no replicated setup".into()));
    };
    let cluster = format!("bench-ha-mem-{}", std::process::id());
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

const PLAIN: &str = "1 master";
const REPLICATED: &str = "3 masters, replicated";
const UNFENCED: &str = "3 masters, replicated, MC_PUT_FENCE=0";

/// The floor setups, by how the floor's leader reaches its standbys and
/// which of them a put waits for.
const FLOORS: [(&str, Mode, Quorum); 8] = [
    ("floor, 1 process", Mode::Alone, Quorum::BothOf2),
    ("floor, 3 processes, pull", Mode::Pull, Quorum::BothOf2),
    (
        "floor, 3 processes, pull, entries at commit",
        Mode::PullAtCommit,
        Quorum::BothOf2,
    ),
    ("floor, 3 processes, direct", Mode::Direct, Quorum::BothOf2),
    (
        "floor, 3 processes, pull, first of 2",
        Mode::Pull,
        Quorum::FirstOf2,
    ),
    (
        "floor, 2 processes, pull, 1 standby",
        Mode::Pull,
        Quorum::OneOf1,
    ),
    (
        "floor, 3 processes, direct, first of 2",
        Mode::Direct,
        Quorum::FirstOf2,
    ),
    (
        "floor, 2 processes, direct, 1 standby",
        Mode::Direct,
        Quorum::OneOf1,
    ),
];

fn put_line(r: &PutRow) -> String {
    format!(
        "round {}, {}, {} thread(s): {} puts, p50 {:.1} µs, p99 {:.1} µs, {:.0} puts/s",
        r.repeat + 1,
        r.setup,
        r.threads,
        r.summary.n,
        r.summary.p50_us,
        r.summary.p99_us,
        r.summary.ops_s
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
    let cfg = ReplicaPolicy::default();
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
    let m = medians(puts);
    let put = |i: usize| {
        m.iter()
            .map(|((name, threads), v)| (format!("{name}, {threads} thread(s)"), v[i]))
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
    let mut charts = vec![
        crate::svg::Bars::new("4 KiB put p50 (median of rounds)", "µs", put(0)),
        crate::svg::Bars::new("4 KiB put p99 (median of rounds)", "µs", put(1)),
    ];
    if !failovers.is_empty() {
        charts.push(crate::svg::Bars::new(
            "Leader stopped: time to the first put and get",
            "ms",
            failover,
        ));
    }
    charts
}

/// The plain phase of `r`'s round and thread count.
fn plain_of<'a>(puts: &'a [PutRow], r: &PutRow) -> Option<&'a Summary> {
    puts.iter()
        .find(|p| p.setup == PLAIN && p.repeat == r.repeat && p.threads == r.threads)
        .map(|p| &p.summary)
}

/// The floor of `r`'s round and thread count: the lowest p50 and the
/// highest puts/s of the floor setups that replicate to both standbys.
fn floor_of(puts: &[PutRow], r: &PutRow) -> Option<(f64, f64)> {
    let floors = puts.iter().filter(|p| {
        p.repeat == r.repeat
            && p.threads == r.threads
            && FLOORS.iter().any(|&(name, mode, quorum)| {
                name == p.setup && mode.replicates() && quorum == Quorum::BothOf2
            })
    });
    floors.fold(None, |acc, p| {
        let (p50, ops) = acc.unwrap_or((f64::INFINITY, 0.0));
        Some((p50.min(p.summary.p50_us), ops.max(p.summary.ops_s)))
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Each setup's median over the rounds, per thread count: p50, p99,
/// puts/s, and the medians of its per-round ratios to the plain phase and
/// to the floor (0 without floor phases).
fn medians(puts: &[PutRow]) -> Vec<((&'static str, usize), [f64; 7])> {
    let mut setups: Vec<(&'static str, usize)> = Vec::new();
    for r in puts {
        if !setups.contains(&(r.setup, r.threads)) {
            setups.push((r.setup, r.threads));
        }
    }
    setups
        .into_iter()
        .map(|(name, threads)| {
            let rows: Vec<&PutRow> = puts
                .iter()
                .filter(|r| r.setup == name && r.threads == threads)
                .collect();
            let pick = |f: &dyn Fn(&PutRow) -> Option<f64>| {
                median(rows.iter().filter_map(|r| f(r)).collect())
            };
            (
                (name, threads),
                [
                    pick(&|r| Some(r.summary.p50_us)),
                    pick(&|r| Some(r.summary.p99_us)),
                    pick(&|r| Some(r.summary.ops_s)),
                    pick(&|r| plain_of(puts, r).map(|p| r.summary.p50_us / p.p50_us)),
                    pick(&|r| plain_of(puts, r).map(|p| r.summary.ops_s / p.ops_s)),
                    pick(&|r| floor_of(puts, r).map(|f| r.summary.p50_us / f.0)),
                    pick(&|r| floor_of(puts, r).map(|f| r.summary.ops_s / f.1)),
                ],
            )
        })
        .collect()
}

pub fn render(puts: &[PutRow], failovers: &[FailoverRow]) -> String {
    let floors = puts.iter().any(|r| floor_of(puts, r).is_some());
    let times = |x: f64| format!("{x:.2}×");
    let share = |x: f64| format!("{:.0}%", 100.0 * x);
    let dash = || "-".to_string();
    let mut head = vec![
        "p50 µs",
        "p99 µs",
        "puts/s",
        "p50 / plain",
        "puts/s / plain",
    ];
    if floors {
        head.extend(["p50 / floor", "puts/s / floor"]);
    }
    let rows: Vec<Vec<String>> = puts
        .iter()
        .map(|r| {
            let mut row = vec![
                (r.repeat + 1).to_string(),
                r.setup.to_string(),
                r.threads.to_string(),
                r.summary.n.to_string(),
                format!("{:.1}", r.summary.p50_us),
                format!("{:.1}", r.summary.p99_us),
                format!("{:.0}", r.summary.ops_s),
            ];
            let plain = plain_of(puts, r);
            row.push(plain.map_or_else(dash, |p| times(r.summary.p50_us / p.p50_us)));
            row.push(plain.map_or_else(dash, |p| share(r.summary.ops_s / p.ops_s)));
            if floors {
                let floor = floor_of(puts, r);
                row.push(floor.map_or_else(dash, |f| times(r.summary.p50_us / f.0)));
                row.push(floor.map_or_else(dash, |f| share(r.summary.ops_s / f.1)));
            }
            row
        })
        .collect();
    let mut out = stats::table(
        &[&["round", "4 KiB put", "threads", "n"][..], &head[..]].concat(),
        &rows,
    );
    out.push('\n');
    let rows: Vec<Vec<String>> = medians(puts)
        .into_iter()
        .map(|((name, threads), m)| {
            let mut row = vec![
                name.to_string(),
                threads.to_string(),
                format!("{:.1}", m[0]),
                format!("{:.1}", m[1]),
                format!("{:.0}", m[2]),
                times(m[3]),
                share(m[4]),
            ];
            if floors {
                row.push(times(m[5]));
                row.push(share(m[6]));
            }
            row
        })
        .collect();
    out.push_str(&stats::table(
        &[&["median over rounds", "threads"][..], &head[..]].concat(),
        &rows,
    ));
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
