//! `mooncake-bench`: measurements of this build, and the side-by-side
//! comparison with the reference. A development tool: it is not part of
//! the Python wheel or of the `mooncake-cli` programs.
//!
//! - `mooncake-bench store`: the store workload on the Rust API
//!   ([`store`]), local and remote topologies, optionally forced TCP;
//! - `mooncake-bench rpc`: master round trips alone ([`rpc`]);
//! - `mooncake-bench baseline`: loopback TCP ping-pong and memcpy bandwidth
//!   ([`baseline`]), the floor and ceiling the store numbers sit between;
//! - `mooncake-bench memory`: master RSS per object ([`memory`]);
//! - `mooncake-bench restart`: a master's restart from a snapshot and a
//!   log tail ([`restart`]);
//! - `mooncake-bench failover`: HA failover time on a Kubernetes Lease
//!   (on the API stand-in) ([`failover`]);
//! - `mooncake-bench --compare-reference`: `benchmarks/compare.py` on the
//!   reference's venv and ours ([`compare`]), then the ratio table, chart and
//!   `docs/benchmarks.md`.
//!
//! Each subcommand is a thin shell over the library function of its module.
//! The master and storage processes a benchmark starts are this executable
//! re-run as `mooncake_master` / `mooncake_client` ([`cluster`]): the same
//! entry points as those binaries, always of this build.

mod baseline;
mod cluster;
mod compare;
mod durability;
mod failover;
mod floor;
mod ha;
mod memory;
mod restart;
mod rpc;
mod stats;
mod store;
mod svg;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use mooncake_common::gflags::normalize;
use mooncake_common::size::parse_size;

use store::{Op, StoreBenchConfig, Topology};

/// Variables that force TCP in both systems (the reference honours them too).
pub(crate) const FORCE_TCP_ENV: [(&str, &str); 2] =
    [("MC_FORCE_TCP", "1"), ("MC_STORE_MEMCPY", "0")];

#[derive(Parser, Debug)]
#[command(
    name = "mooncake-bench",
    about = "Benchmarks of this build, and the comparison with the reference",
    rename_all = "snake_case",
    args_conflicts_with_subcommands = true
)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    pub(crate) command: Option<BenchCmd>,
    #[command(flatten)]
    pub(crate) compare: compare::CompareArgs,
}

#[derive(Subcommand, Debug)]
pub(crate) enum BenchCmd {
    /// Store put/get/batch/zero-copy latency and throughput on the Rust API.
    Store(StoreArgs),
    /// Master RPC round trips (no data path).
    Rpc(RpcArgs),
    /// Loopback TCP ping-pong and memcpy bandwidth of this machine.
    Baseline(BaselineArgs),
    /// Master RSS per object after filling it with small objects.
    Memory(MemoryArgs),
    /// A master's restart from a snapshot of N objects and a log tail.
    Restart(RestartArgs),
    /// Replicated HA: 4 KiB put cost and failover time (needs an etcd).
    Ha(HaArgs),
    /// Put latency with and without the write-ahead log; snapshot and
    /// restore time and the hot-path stall at scale.
    Durability(DurabilityArgs),
    /// HA failover time on a Kubernetes Lease (three masters on the API stand-in).
    Failover(FailoverArgs),
}

#[derive(Args, Debug)]
#[command(rename_all = "snake_case")]
pub(crate) struct HaArgs {
    /// etcd `host:port` for the election and the replication record.
    #[arg(long)]
    pub(crate) etcd: String,
    /// Seconds per put phase.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) seconds: f64,
    /// Failovers per signal (0: none).
    #[arg(long, default_value_t = 5)]
    pub(crate) runs: usize,
    /// Rounds of put phases (one per setup each, in turn).
    #[arg(long, default_value_t = 1)]
    pub(crate) repeats: usize,
    /// Leave out the setups with each master's log on disk.
    #[arg(long)]
    pub(crate) no_wal: bool,
    /// Client threads of a second put phase per setup and round, after
    /// the one-thread phase (1: only that one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub(crate) threads: u64,
    /// Also the replicated setup without the put fence (every PutStart
    /// waits for its own commit, `MC_PUT_FENCE=0`), to compare.
    #[arg(long)]
    pub(crate) unfenced: bool,
    /// Also the floor: the same client, processes and threads with no
    /// state machine (a leader forwarding each put's entries to two
    /// standbys), in four ways of reaching them; and, pulled and direct,
    /// with a put waiting for one standby (the first of two, or the only
    /// one).
    #[arg(long)]
    pub(crate) floor: bool,
    /// Draw the results here as SVG.
    #[arg(long)]
    pub(crate) chart: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(rename_all = "snake_case")]
pub(crate) struct DurabilityArgs {
    /// Sequential 4 KiB puts per master configuration.
    #[arg(long, default_value_t = 5_000)]
    pub(crate) puts: usize,
    /// Objects in the snapshot measurements.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) objects: usize,
    /// Write the tables into docs/benchmarks.md and the chart to
    /// docs/img/durability.svg (run inside the repository).
    #[arg(long)]
    pub(crate) update_docs: bool,
    /// Draw the results here as SVG.
    #[arg(long)]
    pub(crate) chart: Option<PathBuf>,
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
#[command(rename_all = "snake_case")]
pub(crate) struct StoreArgs {
    /// Comma list of `local`, `remote`.
    #[arg(long, default_value = "local,remote")]
    pub(crate) topology: String,
    /// Comma list of value sizes (`4096`, `64KiB`, `1MB`…).
    #[arg(long, default_value = "4096,65536,1048576,4194304")]
    pub(crate) sizes: String,
    #[arg(long, default_value = "put,get,put_batch,get_batch,put_from,get_into")]
    pub(crate) ops: String,
    /// Time budget per phase, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) seconds: f64,
    #[arg(long, default_value_t = 2000)]
    pub(crate) max_iters: usize,
    #[arg(long, default_value_t = 16)]
    pub(crate) batch: usize,
    #[arg(long, default_value = "1536MiB", value_parser = size_arg)]
    pub(crate) segment_size: u64,
    #[arg(long, default_value = "256MiB", value_parser = size_arg)]
    pub(crate) local_buffer_size: u64,
    /// Move bytes over TCP even on one host (`MC_FORCE_TCP=1 MC_STORE_MEMCPY=0`
    /// in this process and the ones it starts).
    #[arg(long)]
    pub(crate) force_tcp: bool,
    /// Skip the untimed pass that writes one phase's budget before measuring.
    #[arg(long)]
    pub(crate) no_touch: bool,
    /// Also write the results here as JSON.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Draw the results here as SVG (default: next to `--json`, as `.svg`).
    #[arg(long)]
    pub(crate) chart: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(rename_all = "snake_case")]
pub(crate) struct RpcArgs {
    #[arg(long, default_value_t = 20000)]
    pub(crate) calls: usize,
    /// Client threads calling at once.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Draw the results here as SVG.
    #[arg(long)]
    pub(crate) chart: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(rename_all = "snake_case")]
pub(crate) struct BaselineArgs {
    #[arg(long, default_value_t = 20000)]
    pub(crate) iters: usize,
    /// Draw the results here as SVG.
    #[arg(long)]
    pub(crate) chart: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(rename_all = "snake_case")]
pub(crate) struct MemoryArgs {
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) objects: usize,
    #[arg(long, default_value = "4096", value_parser = size_arg)]
    pub(crate) size: u64,
    #[arg(long, default_value_t = 512)]
    pub(crate) batch: usize,
    /// Run the master with snapshots this many seconds apart, and read its
    /// RSS (the lowest over one interval) after the first snapshot written
    /// after the fill.
    #[arg(long)]
    pub(crate) snapshot_interval: Option<u64>,
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Draw the results here as SVG (default: next to `--json`, as `.svg`).
    #[arg(long)]
    pub(crate) chart: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(rename_all = "snake_case")]
pub(crate) struct RestartArgs {
    /// Objects in the snapshot.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) objects: usize,
    /// Objects put after it (log entries replayed at the restart).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) tail: usize,
    #[arg(long, default_value = "64", value_parser = size_arg)]
    pub(crate) size: u64,
    #[arg(long, default_value_t = 512)]
    pub(crate) batch: usize,
    /// Seconds between the first master's snapshots: the tail must be put
    /// within one interval of the snapshot after the fill.
    #[arg(long, default_value_t = 60)]
    pub(crate) snapshot_interval: u64,
    /// Keep a copy of the stopped master's state (snapshot and log) in
    /// this folder, to restart from again with `--from`.
    #[arg(long)]
    pub(crate) keep: Option<PathBuf>,
    /// Skip the fill: restart from the state `--keep` left in this folder
    /// (the same state for two builds; `--objects`, `--tail` and `--size`
    /// are then the kept run's).
    #[arg(long)]
    pub(crate) from: Option<PathBuf>,
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(rename_all = "snake_case")]
pub(crate) struct FailoverArgs {
    /// Stops of each kind (kill -9, SIGTERM).
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Draw the results here as SVG (default: next to `--json`, as `.svg`).
    #[arg(long)]
    pub(crate) chart: Option<PathBuf>,
}

/// Runs `mooncake-bench` with `argv` (argv[0] = program name); returns
/// the exit code.
pub fn main(argv: Vec<String>) -> i32 {
    if let Some(code) = cluster::run_as_program(&argv) {
        return code;
    }
    if let Some(code) = floor::run_as_floor(&argv) {
        return code;
    }
    let args = match BenchArgs::try_parse_from(normalize(argv, &[])) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    mooncake_cli::logging::init();
    let result = match args.command {
        Some(BenchCmd::Store(a)) => run_store(a),
        Some(BenchCmd::Rpc(a)) => run_rpc(a),
        Some(BenchCmd::Baseline(a)) => run_baseline(a),
        Some(BenchCmd::Memory(a)) => run_memory(a),
        Some(BenchCmd::Restart(a)) => run_restart(a),
        Some(BenchCmd::Failover(a)) => run_failover(a),
        Some(BenchCmd::Ha(a)) => run_ha(a),
        Some(BenchCmd::Durability(a)) => run_durability(a),
        None if args.compare.compare_reference => return compare::main(&args.compare),
        None => Err(
            "nothing to do: give a subcommand (store, rpc, baseline, memory, failover, ha, durability) or --compare-reference"
                .to_string(),
        ),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mooncake-bench: {e}");
            1
        }
    }
}

fn list<T>(s: &str, parse: impl Fn(&str) -> mooncake_common::Result<T>) -> Result<Vec<T>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| parse(x).map_err(|e| e.to_string()))
        .collect()
}

/// Prints `text` to stdout; a closed pipe (`| head`) is not an error.
fn emit(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{text}");
}

/// Writes `charts` as SVG to `path` when there is one.
fn draw(path: Option<PathBuf>, charts: &[svg::Bars]) -> Result<(), String> {
    if let Some(p) = path {
        svg::write(&p, charts)?;
        eprintln!("[mooncake-bench] chart: {}", p.display());
    }
    Ok(())
}

/// Prints `charts` in text.
fn emit_charts(charts: &[svg::Bars]) {
    for c in charts {
        emit(&c.text());
    }
}

fn write_json(path: &Option<PathBuf>, value: &impl serde::Serialize) -> Result<(), String> {
    if let Some(p) = path {
        let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
        std::fs::write(p, text + "\n").map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

fn run_store(a: StoreArgs) -> Result<(), String> {
    let mut env = Vec::new();
    if a.force_tcp {
        for (k, v) in FORCE_TCP_ENV {
            // Read by the engine and the client when they start, below; no
            // other thread of ours exists yet.
            std::env::set_var(k, v);
            env.push((k.to_string(), v.to_string()));
        }
    }
    let cfg = StoreBenchConfig {
        topologies: list(&a.topology, Topology::parse)?,
        sizes: list(&a.sizes, |s| {
            parse_size(s).and_then(|n| {
                usize::try_from(n).map_err(|_| {
                    mooncake_common::Error::new(
                        mooncake_common::ErrorCode::INVALID_PARAMS,
                        "size too large",
                    )
                })
            })
        })?,
        ops: list(&a.ops, Op::parse)?,
        seconds: a.seconds,
        max_iters: a.max_iters.max(1),
        batch: a.batch,
        segment_size: a.segment_size,
        local_buffer_size: a.local_buffer_size,
        budget_fraction: 0.4,
        child_env: env,
        mode: if a.force_tcp { "tcp" } else { "default" }.into(),
        touch: !a.no_touch,
    };
    let results = store::run(&cfg, |r| {
        eprintln!(
            "  {}/{} {:<10} {:>8}  n={:<5} p50={:>9.1}us p99={:>9.1}us {:>10.0} ops/s {:>7.3} GB/s err={} bad={}",
            r.topology.name(),
            r.mode,
            r.op.name(),
            stats::fmt_size(r.size),
            r.summary.n,
            r.summary.p50_us,
            r.summary.p99_us,
            r.summary.ops_s,
            r.summary.gb_s,
            r.errors,
            r.verify_errors
        );
    })
    .map_err(|e| e.to_string())?;
    emit(&store::render(&results));
    let charts = store::charts(&results);
    emit_charts(&charts);
    write_json(&a.json, &results)?;
    draw(svg::path_for(&a.chart, &a.json), &charts)
}

fn run_ha(a: HaArgs) -> Result<(), String> {
    let cfg = ha::HaBenchConfig {
        etcd: a.etcd,
        seconds: a.seconds,
        runs: a.runs,
        repeats: a.repeats.max(1),
        wal: !a.no_wal,
        unfenced: a.unfenced,
        threads: a.threads as usize,
        floor: a.floor,
    };
    let (puts, failovers) =
        ha::run(&cfg, |line| eprintln!("  {line}")).map_err(|e| e.to_string())?;
    emit(&ha::render(&puts, &failovers));
    draw(a.chart, &ha::charts(&puts, &failovers))
}

fn run_rpc(a: RpcArgs) -> Result<(), String> {
    let r = rpc::run(a.calls.max(1), a.threads.max(1)).map_err(|e| e.to_string())?;
    emit(&rpc::render(&r));
    let charts = rpc::charts(&r);
    emit_charts(&charts);
    draw(a.chart, &charts)
}

fn run_baseline(a: BaselineArgs) -> Result<(), String> {
    let iters = a.iters.max(10);
    let mut rows = Vec::new();
    let (mut latency, mut bandwidth) = (Vec::new(), Vec::new());
    for (msg, spin, server_spin) in [
        (64, false, false),
        (4096, false, false),
        (64, true, false),
        (64, true, true),
    ] {
        let p =
            baseline::tcp_ping_pong(msg, iters, spin, server_spin).map_err(|e| e.to_string())?;
        let how = match (spin, server_spin) {
            (false, _) => "",
            (true, false) => " (client spins)",
            (true, true) => " (both spin)",
        };
        let case = format!("tcp ping-pong {}{how}", stats::fmt_size(msg));
        eprintln!("  {case}: p50 {:.1} µs", p.summary.p50_us);
        latency.push((case, p.summary.p50_us));
        rows.push(vec![
            format!("tcp ping-pong {}{how}", stats::fmt_size(msg)),
            format!("{:.1}", p.summary.p50_us),
            format!("{:.1}", p.summary.p99_us),
            "-".into(),
        ]);
    }
    for block in [4 << 10, 64 << 10, 1 << 20, 4 << 20, 64 << 20] {
        let n = (iters * 4096 / block).clamp(20, iters);
        let m = baseline::memcpy_bandwidth(block, n);
        let case = format!("memcpy {}", stats::fmt_size(block));
        eprintln!("  {case}: {:.2} GB/s", m.gb_s);
        bandwidth.push((case, m.gb_s));
        rows.push(vec![
            format!("memcpy {} (same buffers)", stats::fmt_size(block)),
            format!("{:.1}", m.p50_us),
            "-".into(),
            format!("{:.2}", m.gb_s),
        ]);
    }
    for block in [64 << 10, 1 << 20, 4 << 20] {
        let region = 512 << 20;
        let n = (region / block).clamp(20, iters.max(20));
        let m = baseline::memcpy_streaming(block, region, n);
        let case = format!("memcpy {} into 512 MiB", stats::fmt_size(block));
        eprintln!("  {case}: {:.2} GB/s", m.gb_s);
        bandwidth.push((case, m.gb_s));
        rows.push(vec![
            format!(
                "memcpy {} into a warm 512 MiB region",
                stats::fmt_size(block)
            ),
            format!("{:.1}", m.p50_us),
            "-".into(),
            format!("{:.2}", m.gb_s),
        ]);
    }
    emit(&stats::table(&["case", "p50 µs", "p99 µs", "GB/s"], &rows));
    let charts = [
        svg::Bars::new("Loopback TCP round trip (p50)", "µs", latency),
        svg::Bars::new("memcpy bandwidth", "GB/s", bandwidth),
    ];
    emit_charts(&charts);
    draw(a.chart, &charts)
}

fn run_memory(a: MemoryArgs) -> Result<(), String> {
    let size = usize::try_from(a.size).map_err(|_| "size too large".to_string())?;
    let r = memory::run(a.objects, size, a.batch, a.snapshot_interval, |n, rss| {
        eprintln!("{n} objects, master RSS {} MiB", rss >> 20);
    })
    .map_err(|e| e.to_string())?;
    emit(&serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?);
    write_json(&a.json, &r)?;
    draw(svg::path_for(&a.chart, &a.json), &memory::charts(&r))
}

fn run_restart(a: RestartArgs) -> Result<(), String> {
    let size = usize::try_from(a.size).map_err(|_| "size too large".to_string())?;
    let reuse = restart::Reuse {
        from: a.from,
        keep: a.keep,
    };
    let r = restart::run(
        a.objects,
        a.tail,
        size,
        a.batch,
        a.snapshot_interval,
        &reuse,
        |s| eprintln!("{s}"),
    )
    .map_err(|e| e.to_string())?;
    emit(&serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?);
    write_json(&a.json, &r)
}

fn run_failover(a: FailoverArgs) -> Result<(), String> {
    let rounds = failover::run(a.rounds.max(1), |r| {
        eprintln!("{}: first put after {:.2} s", r.stop.name(), r.first_put_s);
    })
    .map_err(|e| e.to_string())?;
    emit(&failover::render(&rounds));
    write_json(&a.json, &rounds)?;
    draw(svg::path_for(&a.chart, &a.json), &failover::charts(&rounds))
}

fn run_durability(a: DurabilityArgs) -> Result<(), String> {
    let r = durability::run(a.puts.max(100), a.objects.max(1), |line| {
        eprintln!("  {line}")
    })
    .map_err(|e| e.to_string())?;
    let text = durability::render(&r);
    emit(&text);
    let charts = durability::charts(&r);
    draw(a.chart, &charts)?;
    if a.update_docs {
        let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
        let repo = compare::find_repo(&cwd).ok_or("run inside the mooncake-rs repository")?;
        let command = format!(
            "mooncake-bench durability --puts {} --objects {} --update-docs",
            a.puts, a.objects
        );
        svg::write(&repo.join(durability::CHART_IN_DOCS), &charts)?;
        durability::update_docs(&repo, &text, &command)?;
        eprintln!(
            "[mooncake-bench] updated docs/benchmarks.md (durability) and {}",
            durability::CHART_IN_DOCS
        );
    }
    Ok(())
}
