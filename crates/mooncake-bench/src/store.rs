//! The store workload of `benchmarks/store_bench.py`, on the Rust API: the
//! same phases, sizes, key/value pattern and bounds, so the two can be read
//! side by side and the difference is the Python layer.
//!
//! Per value size: `put` then `get` of what was put; `put_batch` then
//! `get_batch` (`batch` keys per call); `put_from` then `get_into` on a
//! registered buffer. Every read is verified outside the timed region. Each
//! phase is bounded by time, by a call count and by the bytes it may leave
//! in the store, and removes its keys (untimed) afterwards.

use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::ReplicaPolicy;
use serde::Serialize;

use crate::cluster::{self, Master, Proc};
use crate::stats::{self, summarize, Summary};
use crate::svg::Bars;

/// Distinct value per key: key `i` holds the pattern at `(i * STRIDE) % WINDOW`.
const STRIDE: usize = 64;
const WINDOW: usize = 64 << 10;
const MIN_ITERS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// The measuring client mounts the segment.
    Local,
    /// A `mooncake_client` process holds the segment; the measuring client has none.
    Remote,
}

impl Topology {
    pub fn parse(s: &str) -> Result<Topology> {
        match s {
            "local" => Ok(Topology::Local),
            "remote" => Ok(Topology::Remote),
            _ => Err(bad(format!("topology {s:?}: expected local or remote"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Topology::Local => "local",
            Topology::Remote => "remote",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Put,
    Get,
    PutBatch,
    GetBatch,
    PutFrom,
    GetInto,
}

pub const ALL_OPS: [Op; 6] = [
    Op::Put,
    Op::Get,
    Op::PutBatch,
    Op::GetBatch,
    Op::PutFrom,
    Op::GetInto,
];

impl Op {
    pub fn parse(s: &str) -> Result<Op> {
        ALL_OPS.into_iter().find(|o| o.name() == s).ok_or_else(|| {
            bad(format!(
                "op {s:?}: expected one of put, get, put_batch, get_batch, put_from, get_into"
            ))
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
            Op::PutBatch => "put_batch",
            Op::GetBatch => "get_batch",
            Op::PutFrom => "put_from",
            Op::GetInto => "get_into",
        }
    }
}

fn bad(msg: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, msg)
}

/// What to run.
#[derive(Debug, Clone)]
pub struct StoreBenchConfig {
    pub topologies: Vec<Topology>,
    pub sizes: Vec<usize>,
    pub ops: Vec<Op>,
    /// Time budget per phase.
    pub seconds: f64,
    pub max_iters: usize,
    pub batch: usize,
    /// Segment of the storing process (local: the measuring client).
    pub segment_size: u64,
    /// Staging pool of the measuring client.
    pub local_buffer_size: u64,
    /// Fraction of the segment a phase may fill.
    pub budget_fraction: f64,
    /// Environment for the master and storage processes (the measuring
    /// client reads this process's environment).
    pub child_env: Vec<(String, String)>,
    /// Label of the transport mode (`default` or `tcp`), for the report.
    pub mode: String,
    /// Write (untimed) one phase's budget before measuring, so pages are warm.
    pub touch: bool,
}

impl Default for StoreBenchConfig {
    fn default() -> Self {
        StoreBenchConfig {
            topologies: vec![Topology::Local, Topology::Remote],
            sizes: vec![4 << 10, 64 << 10, 1 << 20, 4 << 20],
            ops: ALL_OPS.to_vec(),
            seconds: 1.0,
            max_iters: 2000,
            batch: 16,
            segment_size: 1536 << 20,
            local_buffer_size: 256 << 20,
            budget_fraction: 0.4,
            child_env: Vec::new(),
            mode: "default".into(),
            touch: true,
        }
    }
}

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub topology: Topology,
    pub mode: String,
    pub op: Op,
    pub size: usize,
    /// Values per call.
    pub batch: usize,
    #[serde(flatten)]
    pub summary: Summary,
    /// Calls that returned an error (or a short read).
    pub errors: usize,
    /// Reads whose bytes differed from what was written.
    pub verify_errors: usize,
}

/// The processes and the client of one topology.
struct Setup {
    client: Client,
    _storage: Option<Proc>,
    _master: Master,
}

impl Setup {
    fn start(topology: Topology, cfg: &StoreBenchConfig) -> Result<Setup> {
        let master = cluster::start_master(&cfg.child_env, &[])?;
        let storage = match topology {
            Topology::Remote => Some(cluster::start_storage(
                &master,
                cfg.segment_size,
                &cfg.child_env,
            )?),
            Topology::Local => None,
        };
        let client = Client::setup(&ClientConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: master.metadata_server.clone(),
            global_segment_size: match topology {
                Topology::Local => cfg.segment_size,
                Topology::Remote => 0,
            },
            local_buffer_size: cfg.local_buffer_size,
            protocol: "tcp".into(),
            device_name: String::new(),
            master_server_address: master.rpc.clone(),
            ..ClientConfig::default()
        })?;
        Ok(Setup {
            client,
            _storage: storage,
            _master: master,
        })
    }
}

/// Runs the workload in every topology; `progress` sees each case as it ends.
pub fn run(
    cfg: &StoreBenchConfig,
    mut progress: impl FnMut(&CaseResult),
) -> Result<Vec<CaseResult>> {
    if cfg.batch == 0 || cfg.sizes.contains(&0) {
        return Err(bad("batch and sizes must be positive"));
    }
    let mut out = Vec::new();
    for &topology in &cfg.topologies {
        let setup = Setup::start(topology, cfg)?;
        let mut w = Workload::new(&setup.client, topology, cfg);
        if cfg.touch {
            w.touch_store(cfg.sizes.iter().copied().max().unwrap_or(0))?;
        }
        for &size in &cfg.sizes {
            w.warmup(size)?;
            for res in w.size(size)? {
                progress(&res);
                out.push(res);
            }
        }
        let _ = setup.client.close();
    }
    Ok(out)
}

struct Workload<'a> {
    client: &'a Client,
    topology: Topology,
    cfg: &'a StoreBenchConfig,
    pattern: Vec<u8>,
    rc: ReplicaPolicy,
}

/// Calls `call(i)` up to `count` times within the time budget (at least
/// [`MIN_ITERS`]), handing each answer to `check(i, answer)` outside the
/// timed region; returns each call's latency in ns.
fn timed_loop<T>(
    count: usize,
    seconds: f64,
    mut call: impl FnMut(usize) -> T,
    mut check: impl FnMut(usize, T),
) -> Vec<u64> {
    let mut lat = Vec::with_capacity(count.min(1 << 16));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    for i in 0..count {
        let t0 = Instant::now();
        let answer = call(i);
        lat.push(t0.elapsed().as_nanos() as u64);
        check(i, answer);
        if i + 1 >= MIN_ITERS && Instant::now() > deadline {
            break;
        }
    }
    lat
}

impl<'a> Workload<'a> {
    fn new(client: &'a Client, topology: Topology, cfg: &'a StoreBenchConfig) -> Self {
        let max = cfg.sizes.iter().copied().max().unwrap_or(0);
        let mut pattern = vec![0u8; max + WINDOW];
        // xorshift: cheap, deterministic, not compressible by accident.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for b in pattern.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        Workload {
            client,
            topology,
            cfg,
            pattern,
            rc: ReplicaPolicy::default(),
        }
    }

    fn expected(&self, i: usize, size: usize) -> &[u8] {
        let off = (i * STRIDE) % WINDOW;
        &self.pattern[off..off + size]
    }

    fn key(op: &str, size: usize, i: usize) -> String {
        format!("bench/{op}/{size}/{i}")
    }

    fn iters(&self, size: usize, per_call: usize) -> usize {
        let by_bytes =
            (self.cfg.segment_size as f64 * self.cfg.budget_fraction) as usize / (size * per_call);
        by_bytes.clamp(1, self.cfg.max_iters)
    }

    fn wants(&self, op: Op) -> bool {
        self.cfg.ops.contains(&op)
    }

    fn result(
        &self,
        op: Op,
        size: usize,
        per_call: usize,
        mut lat: Vec<u64>,
        errors: usize,
        verify_errors: usize,
    ) -> CaseResult {
        CaseResult {
            topology: self.topology,
            mode: self.cfg.mode.clone(),
            op,
            size,
            batch: per_call,
            summary: summarize(&mut lat, (size * per_call) as u64, per_call as u64),
            errors,
            verify_errors,
        }
    }

    fn cleanup(&self) -> Result<()> {
        // The benchmark's keys, forced (a reader's lease would keep some):
        // `remove_all(true)` is an admin call on our master, and a store left
        // full would make the next phase measure eviction and fresh pages.
        self.client.remove_by_regex("^bench/", true).map(drop)
    }

    /// Writes one phase's budget of `size`-byte values, then removes it:
    /// the first write to a segment page costs a page fault (on a VM whose
    /// host hands memory out lazily, ~7 µs per 4 KiB), and the store reuses
    /// freed space, so afterwards every phase runs on warm memory.
    fn touch_store(&self, size: usize) -> Result<()> {
        for i in 0..self.iters(size, 1) {
            self.client.put(
                &Self::key("touch", size, i),
                self.expected(i, size),
                &self.rc,
            )?;
        }
        self.cleanup()
    }

    fn warmup(&self, size: usize) -> Result<()> {
        let k = Self::key("warm", size, 0);
        for _ in 0..3 {
            self.client.put(&k, self.expected(0, size), &self.rc)?;
            self.client.get(&k)?;
            self.client.remove(&k, true)?;
        }
        Ok(())
    }

    fn size(&mut self, size: usize) -> Result<Vec<CaseResult>> {
        let mut out = Vec::new();
        if self.wants(Op::Put) || self.wants(Op::Get) {
            self.bytes_api(size, &mut out)?;
        }
        if self.wants(Op::PutBatch) || self.wants(Op::GetBatch) {
            self.batch_api(size, &mut out)?;
        }
        if self.wants(Op::PutFrom) || self.wants(Op::GetInto) {
            self.zero_copy(size, &mut out)?;
        }
        Ok(out)
    }

    fn bytes_api(&self, size: usize, out: &mut Vec<CaseResult>) -> Result<()> {
        let (c, secs) = (self.client, self.cfg.seconds);
        let count = self.iters(size, 1);
        let keys: Vec<String> = (0..count).map(|i| Self::key("kv", size, i)).collect();
        let mut errors = 0;
        let lat = timed_loop(
            count,
            secs,
            |i| c.put(&keys[i], self.expected(i, size), &self.rc),
            |_, r| errors += r.is_err() as usize,
        );
        let done = lat.len();
        if self.wants(Op::Put) {
            out.push(self.result(Op::Put, size, 1, lat, errors, 0));
        }
        if self.wants(Op::Get) {
            let (mut miss, mut bad) = (0, 0);
            let lat = timed_loop(
                count.max(done),
                secs,
                |i| c.get(&keys[i % done]),
                |i, r| match r {
                    Ok(v) if v.len() == size => {
                        bad += (v != self.expected(i % done, size)) as usize
                    }
                    _ => miss += 1,
                },
            );
            out.push(self.result(Op::Get, size, 1, lat, miss, bad));
        }
        self.cleanup()
    }

    fn batch_api(&self, size: usize, out: &mut Vec<CaseResult>) -> Result<()> {
        let (c, secs, b) = (self.client, self.cfg.seconds, self.cfg.batch);
        let count = self.iters(size, b);
        let keys: Vec<Vec<String>> = (0..count)
            .map(|j| {
                (0..b)
                    .map(|x| Self::key("batch", size, j * b + x))
                    .collect()
            })
            .collect();
        let mut errors = 0;
        let vals: Vec<Vec<&[u8]>> = (0..count)
            .map(|j| (0..b).map(|x| self.expected(j * b + x, size)).collect())
            .collect();
        let lat = timed_loop(
            count,
            secs,
            |j| c.put_batch(&keys[j], &vals[j], &self.rc),
            |_, r| errors += r.map_or(true, |rs| rs.iter().any(|r| r.is_err())) as usize,
        );
        let done = lat.len();
        if self.wants(Op::PutBatch) {
            out.push(self.result(Op::PutBatch, size, b, lat, errors, 0));
        }
        if self.wants(Op::GetBatch) {
            let (mut miss, mut bad) = (0, 0);
            let lat = timed_loop(
                count.max(done),
                secs,
                |j| c.get_batch(&keys[j % done]),
                |j, rs| {
                    let j = j % done;
                    for (x, r) in rs.into_iter().enumerate() {
                        match r {
                            Ok(v) if v.len() == size => {
                                bad += (v != self.expected(j * b + x, size)) as usize
                            }
                            _ => miss += 1,
                        }
                    }
                },
            );
            out.push(self.result(Op::GetBatch, size, b, lat, miss, bad));
        }
        self.cleanup()
    }

    fn zero_copy(&self, size: usize, out: &mut Vec<CaseResult>) -> Result<()> {
        let (c, secs) = (self.client, self.cfg.seconds);
        let src_len = size + WINDOW;
        // One registered region: the source pattern, then the destination.
        let mut region = vec![0u8; src_len + size].into_boxed_slice();
        region[..src_len].copy_from_slice(&self.pattern[..src_len]);
        let base = region.as_mut_ptr() as usize;
        c.register_buffer(base, region.len())?;
        let dst = base + src_len;
        let count = self.iters(size, 1);
        let keys: Vec<String> = (0..count).map(|i| Self::key("zc", size, i)).collect();
        let mut errors = 0;
        let lat = timed_loop(
            count,
            secs,
            |i| c.put_from(&keys[i], base + (i * STRIDE) % WINDOW, size, &self.rc),
            |_, r| errors += r.is_err() as usize,
        );
        let done = lat.len();
        if self.wants(Op::PutFrom) {
            out.push(self.result(Op::PutFrom, size, 1, lat, errors, 0));
        }
        if self.wants(Op::GetInto) {
            let (mut miss, mut bad) = (0, 0);
            let mut lat = Vec::new();
            let deadline = Instant::now() + Duration::from_secs_f64(secs);
            for i in 0..count.max(done) {
                let k = i % done;
                let t0 = Instant::now();
                let r = c.get_into(&keys[k], dst, size);
                lat.push(t0.elapsed().as_nanos() as u64);
                if !matches!(r, Ok(n) if n == size as u64) {
                    miss += 1;
                } else {
                    // SAFETY: `dst..dst+size` is the tail of `region`, alive
                    // and not borrowed elsewhere while we read it.
                    let got = unsafe { std::slice::from_raw_parts(dst as *const u8, size) };
                    bad += (got != self.expected(k, size)) as usize;
                }
                if i + 1 >= MIN_ITERS && Instant::now() > deadline {
                    break;
                }
            }
            out.push(self.result(Op::GetInto, size, 1, lat, miss, bad));
        }
        c.unregister_buffer(base)?;
        drop(region);
        self.cleanup()
    }
}

/// Throughput and p50 latency per case, drawn.
pub fn charts(results: &[CaseResult]) -> Vec<Bars> {
    let label = |r: &CaseResult| {
        format!(
            "{}/{} {} {}",
            r.topology.name(),
            r.mode,
            r.op.name(),
            stats::fmt_size(r.size)
        )
    };
    let rows = |f: fn(&CaseResult) -> f64| results.iter().map(|r| (label(r), f(r))).collect();
    vec![
        Bars::new("Throughput by case", "GB/s", rows(|r| r.summary.gb_s)),
        Bars::new("p50 latency per call", "µs", rows(|r| r.summary.p50_us)),
    ]
}

/// The report as a markdown table.
pub fn render(results: &[CaseResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            vec![
                format!("{}/{}", r.topology.name(), r.mode),
                r.op.name().into(),
                stats::fmt_size(r.size),
                r.summary.n.to_string(),
                format!("{:.1}", r.summary.p50_us),
                format!("{:.1}", r.summary.p99_us),
                format!("{:.0}", r.summary.ops_s),
                format!("{:.3}", r.summary.gb_s),
                format!("{}/{}", r.errors, r.verify_errors),
            ]
        })
        .collect();
    stats::table(
        &[
            "run", "op", "size", "calls", "p50 µs", "p99 µs", "ops/s", "GB/s", "err/bad",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for op in ALL_OPS {
            assert_eq!(Op::parse(op.name()).unwrap(), op);
        }
        assert!(Op::parse("nope").is_err());
        assert_eq!(Topology::parse("remote").unwrap(), Topology::Remote);
        assert!(Topology::parse("far").is_err());
    }

    #[test]
    fn timed_loop_honours_count_and_minimum() {
        let mut calls = 0;
        let mut checked = Vec::new();
        let lat = timed_loop(
            5,
            0.0,
            |i| {
                calls += 1;
                i * 2
            },
            |i, a| checked.push((i, a)),
        );
        assert_eq!((lat.len(), calls), (5, 5));
        assert_eq!(checked, [(0, 0), (1, 2), (2, 4), (3, 6), (4, 8)]);
        // A zero budget still makes MIN_ITERS calls.
        let lat = timed_loop(100, 0.0, |_| (), |_, ()| {});
        assert_eq!(lat.len(), MIN_ITERS);
    }
}
