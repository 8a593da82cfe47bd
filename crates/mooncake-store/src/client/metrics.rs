//! Store client metrics with the reference's names: bytes moved, latency
//! of each operation (µs histograms with the reference's buckets), master
//! RPCs, and ours on top: errors per operation and the route (own segment,
//! same-host shared memory, transfer engine) the bytes took.
//!
//! `MC_STORE_CLIENT_METRIC` (default on) turns them on;
//! `MC_STORE_CLIENT_METRIC_INTERVAL` (seconds, default 0 = never) logs
//! [`ClientMetrics::summary`] periodically, with the interval throughput
//! unless `MC_STORE_CLIENT_METRIC_BANDWIDTH=0`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use mooncake_common::gflags::parse_bool;
use mooncake_common::size::format_size;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::master_client::RpcObserver;

/// Latency buckets (µs), the reference's.
pub const LATENCY_BUCKETS_US: [f64; 27] = [
    50.0, 75.0, 125.0, 150.0, 200.0, 250.0, 300.0, 400.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0,
    3000.0, 5000.0, 7000.0, 15000.0, 20000.0, 50000.0, 100000.0, 200000.0, 500000.0, 1e6, 2e6, 5e6,
    1e7, 2e7,
];

/// Families the reference declares `counter` without the `_total` suffix.
const BARE_COUNTERS: [&str; 10] = [
    "mooncake_transfer_engine_requests",
    "mooncake_transfer_engine_bytes",
    "mooncake_transfer_read_bytes",
    "mooncake_transfer_write_bytes",
    "mooncake_client_rpc_count",
    "mooncake_transfer_read_operation_count",
    "mooncake_transfer_read_operation_bytes",
    "mooncake_transfer_write_operation_count",
    "mooncake_transfer_write_operation_bytes",
    "mooncake_transfer_route_bytes",
];

type Labels = Vec<(String, String)>;

fn histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_US.into_iter())
}

/// What one interface call did: keys served and failed, bytes moved.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    pub ok: u64,
    pub failed: u64,
    pub bytes: u64,
}

/// Where a piece of a value went or came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// This process's own segment (memcpy).
    Local,
    /// A same-host peer's shared memory, copied directly.
    Shm,
    /// The transfer engine (TCP, or the engine's own shared-memory transport).
    Engine,
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Local => "local",
            Route::Shm => "shm",
            Route::Engine => "engine",
        }
    }
}

/// Counts and latency buckets kept beside the Prometheus families, for the
/// text summary.
#[derive(Default, Clone)]
struct Tally {
    batch: bool,
    count: u64,
    bytes: u64,
    buckets: Vec<u64>,
}

impl Tally {
    fn add(&mut self, bytes: u64, us: f64) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; LATENCY_BUCKETS_US.len() + 1];
        }
        self.count += 1;
        self.bytes += bytes;
        let i = LATENCY_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        self.buckets[i] += 1;
    }

    /// `count=.., p95<..μs, max<..μs`, as the reference prints it.
    fn describe(&self) -> String {
        if self.count == 0 {
            return "No data".into();
        }
        let bound = |i: usize| {
            LATENCY_BUCKETS_US
                .get(i)
                .map_or("+Inf".to_string(), |b| format!("{b}"))
        };
        let target = (self.count as f64 * 0.95).ceil() as u64;
        let mut seen = 0;
        let p95 = self
            .buckets
            .iter()
            .position(|&n| {
                seen += n;
                seen >= target
            })
            .unwrap_or(0);
        let max = self.buckets.iter().rposition(|&n| n > 0).unwrap_or(0);
        format!(
            "count={}, p95<{}μs, max<{}μs",
            self.count,
            bound(p95),
            bound(max)
        )
    }
}

/// The series one operation updates, looked up in their families once:
/// each call then touches atomics only, instead of building a label set and
/// hashing it into every family it updates. Kept with the operation's tally,
/// so a call takes one lock and one map lookup for both.
struct OpEntry {
    count: Gauge,
    bytes: Gauge,
    latency: Histogram,
    tally: Tally,
}

/// One RPC's series and tally (see [`OpEntry`]).
struct RpcEntry {
    count: Gauge,
    latency: Histogram,
    tally: Tally,
}

/// Entries per (flag, static name), in first-use order. Callers name them
/// with `&'static str`s, so a lookup compares pointers first and the text
/// only for a name seen through another pointer: cheaper than hashing or
/// ordering strings on every call, for the dozen names a client uses.
struct NameTable<V>(Vec<(bool, &'static str, V)>);

impl<V> NameTable<V> {
    fn new() -> Self {
        Self(Vec::new())
    }

    fn get_or_insert_with(
        &mut self,
        flag: bool,
        name: &'static str,
        make: impl FnOnce() -> V,
    ) -> &mut V {
        let found = self
            .0
            .iter()
            .position(|(f, n, _)| *f == flag && std::ptr::eq(*n, name))
            .or_else(|| self.0.iter().position(|(f, n, _)| *f == flag && *n == name));
        let i = found.unwrap_or_else(|| {
            self.0.push((flag, name, make()));
            self.0.len() - 1
        });
        &mut self.0[i].2
    }

    fn iter(&self) -> impl Iterator<Item = (bool, &'static str, &V)> {
        self.0.iter().map(|(f, n, v)| (*f, *n, v))
    }
}

/// What the periodic report remembers between two reports.
struct Interval {
    at: Instant,
    read: u64,
    write: u64,
}

pub struct ClientMetrics {
    registry: Registry,
    mode: Labels,
    read_bytes: Family<Labels, Gauge>,
    write_bytes: Family<Labels, Gauge>,
    get_latency: Histogram,
    put_latency: Histogram,
    batch_get_latency: Histogram,
    batch_put_latency: Histogram,
    rpc_count: Family<Labels, Gauge>,
    rpc_latency: Family<Labels, Histogram>,
    read_ops: Family<Labels, Gauge>,
    read_op_bytes: Family<Labels, Gauge>,
    read_op_latency: Family<Labels, Histogram>,
    write_ops: Family<Labels, Gauge>,
    write_op_bytes: Family<Labels, Gauge>,
    write_op_latency: Family<Labels, Histogram>,
    op_errors: Family<Labels, Counter>,
    route_bytes: Family<Labels, Gauge>,
    engine_requests: Family<Labels, Gauge>,
    engine_bytes: Family<Labels, Gauge>,
    totals: [AtomicU64; 2],
    /// Per (write, op): the interface series and tally; per RPC: count,
    /// latency and tally.
    ops: Mutex<NameTable<OpEntry>>,
    rpcs: Mutex<NameTable<RpcEntry>>,
    /// Per route and direction (read, write), created at first use.
    route_series: [[OnceLock<Gauge>; 2]; 3],
    /// `mooncake_transfer_{read,write}_bytes` of this client.
    mode_totals: [OnceLock<Gauge>; 2],
    interval: Mutex<Interval>,
    started: Instant,
    /// The engine's per-transport request counts, read at scrape time.
    engine: OnceLock<EngineCounts>,
}

/// Requests, then bytes, per transport (local, shm, tcp).
type EngineCounts = Box<dyn Fn() -> [[u64; 3]; 2] + Send + Sync>;

/// Whether `MC_STORE_CLIENT_METRIC` leaves metrics on (the default).
pub fn enabled_by_env(var: impl Fn(&str) -> Option<String>) -> bool {
    var("MC_STORE_CLIENT_METRIC").is_none_or(|v| parse_bool(&v).unwrap_or(false))
}

/// `MC_STORE_CLIENT_METRIC_INTERVAL`: the period of the summary log.
pub fn report_interval_by_env(var: impl Fn(&str) -> Option<String>) -> Option<Duration> {
    let v = var("MC_STORE_CLIENT_METRIC_INTERVAL")?;
    match v.trim().trim_start_matches('+').parse::<u64>() {
        Ok(0) => None,
        Ok(s) => Some(Duration::from_secs(s)),
        Err(_) => {
            tracing::warn!("MC_STORE_CLIENT_METRIC_INTERVAL={v:?} is not a number of seconds; no periodic report");
            None
        }
    }
}

impl ClientMetrics {
    /// `mode`: `real` or `dummy` (the `client_mode` label).
    pub fn new(mode: &str, cluster_id: Option<&str>) -> ClientMetrics {
        let mut mode_labels = vec![("client_mode".to_string(), mode.to_string())];
        if let Some(id) = cluster_id.filter(|id| !id.is_empty()) {
            mode_labels.push(("cluster_id".to_string(), id.to_string()));
        }
        let m = ClientMetrics {
            registry: Registry::default(),
            mode: mode_labels,
            read_bytes: Family::default(),
            write_bytes: Family::default(),
            get_latency: histogram(),
            put_latency: histogram(),
            batch_get_latency: histogram(),
            batch_put_latency: histogram(),
            rpc_count: Family::default(),
            rpc_latency: Family::new_with_constructor(histogram),
            read_ops: Family::default(),
            read_op_bytes: Family::default(),
            read_op_latency: Family::new_with_constructor(histogram),
            write_ops: Family::default(),
            write_op_bytes: Family::default(),
            write_op_latency: Family::new_with_constructor(histogram),
            op_errors: Family::default(),
            route_bytes: Family::default(),
            engine_requests: Family::default(),
            engine_bytes: Family::default(),
            totals: Default::default(),
            ops: Mutex::new(NameTable::new()),
            rpcs: Mutex::new(NameTable::new()),
            route_series: Default::default(),
            mode_totals: Default::default(),
            interval: Mutex::new(Interval {
                at: Instant::now(),
                read: 0,
                write: 0,
            }),
            started: Instant::now(),
            engine: OnceLock::new(),
        };
        m.with_registered()
    }

    fn with_registered(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "mooncake_transfer_read_bytes",
            "Total bytes read",
            self.read_bytes.clone(),
        );
        r.register(
            "mooncake_transfer_write_bytes",
            "Total bytes written",
            self.write_bytes.clone(),
        );
        let hists = [
            (
                "mooncake_transfer_batch_put_latency",
                "Batch Put transfer latency (us)",
                &self.batch_put_latency,
            ),
            (
                "mooncake_transfer_batch_get_latency",
                "Batch Get transfer latency (us)",
                &self.batch_get_latency,
            ),
            (
                "mooncake_transfer_get_latency",
                "Get transfer latency (us)",
                &self.get_latency,
            ),
            (
                "mooncake_transfer_put_latency",
                "Put transfer latency (us)",
                &self.put_latency,
            ),
        ];
        for (name, help, h) in hists {
            r.register(name, help, h.clone());
        }
        r.register(
            "mooncake_client_rpc_count",
            "Total number of RPC calls made by the client",
            self.rpc_count.clone(),
        );
        r.register(
            "mooncake_client_rpc_latency",
            "Latency of RPC calls made by the client (in us)",
            self.rpc_latency.clone(),
        );
        r.register(
            "mooncake_transfer_read_operation_count",
            "Total read operations by interface type",
            self.read_ops.clone(),
        );
        r.register(
            "mooncake_transfer_read_operation_bytes",
            "Total read bytes by interface type",
            self.read_op_bytes.clone(),
        );
        r.register(
            "mooncake_transfer_read_operation_latency",
            "Read operation latency by interface type (us)",
            self.read_op_latency.clone(),
        );
        r.register(
            "mooncake_transfer_write_operation_count",
            "Total write operations by interface type",
            self.write_ops.clone(),
        );
        r.register(
            "mooncake_transfer_write_operation_bytes",
            "Total write bytes by interface type",
            self.write_op_bytes.clone(),
        );
        r.register(
            "mooncake_transfer_write_operation_latency",
            "Write operation latency by interface type (us)",
            self.write_op_latency.clone(),
        );
        r.register(
            "mooncake_transfer_operation_errors",
            "Keys an operation failed for, by interface type",
            self.op_errors.clone(),
        );
        r.register("mooncake_transfer_route_bytes", "Bytes moved by route (local memcpy, same-host shared memory, transfer engine) and direction", self.route_bytes.clone());
        r.register(
            "mooncake_transfer_engine_requests",
            "Transfer engine requests by transport (local, shm, tcp)",
            self.engine_requests.clone(),
        );
        r.register(
            "mooncake_transfer_engine_bytes",
            "Bytes submitted to the transfer engine by transport (local, shm, tcp)",
            self.engine_bytes.clone(),
        );
        self
    }

    fn labels(&self, extra: &[(&str, &str)]) -> Labels {
        let mut l = self.mode.clone();
        l.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        l
    }

    /// One interface call (`op`, e.g. `put`, `batch_get_buffer`) that moved
    /// `bytes` for its `ok` keys and failed for `failed` keys; `batch`: the
    /// call took several keys.
    pub fn observe_op(
        &self,
        write: bool,
        op: &'static str,
        batch: bool,
        outcome: Outcome,
        took: Duration,
    ) {
        let Outcome { ok, failed, bytes } = outcome;
        let us = took.as_secs_f64() * 1e6;
        if failed > 0 {
            self.op_errors
                .get_or_create(&self.labels(&[("op_name", op)]))
                .inc_by(failed);
        }
        if ok == 0 {
            return;
        }
        let (count, op_bytes, lat, total, hist) = if write {
            let h = if batch {
                &self.batch_put_latency
            } else {
                &self.put_latency
            };
            (
                &self.write_ops,
                &self.write_op_bytes,
                &self.write_op_latency,
                &self.write_bytes,
                h,
            )
        } else {
            let h = if batch {
                &self.batch_get_latency
            } else {
                &self.get_latency
            };
            (
                &self.read_ops,
                &self.read_op_bytes,
                &self.read_op_latency,
                &self.read_bytes,
                h,
            )
        };
        {
            let mut ops = self.ops.lock();
            let e = ops.get_or_insert_with(write, op, || {
                let labels = self.labels(&[("op_name", op)]);
                OpEntry {
                    count: count.get_or_create(&labels).clone(),
                    bytes: op_bytes.get_or_create(&labels).clone(),
                    latency: lat.get_or_create(&labels).clone(),
                    tally: Tally::default(),
                }
            });
            e.count.inc();
            e.bytes.inc_by(bytes as i64);
            e.latency.observe(us);
            e.tally.batch = batch;
            e.tally.add(bytes, us);
        }
        self.mode_totals[usize::from(write)]
            .get_or_init(|| total.get_or_create(&self.mode).clone())
            .inc_by(bytes as i64);
        hist.observe(us);
        self.totals[usize::from(write)].fetch_add(bytes, Ordering::Relaxed);
    }

    /// `bytes` of a value moved over `route`.
    pub fn observe_route(&self, route: Route, write: bool, bytes: u64) {
        let slot = match route {
            Route::Local => 0,
            Route::Shm => 1,
            Route::Engine => 2,
        };
        self.route_series[slot][usize::from(write)]
            .get_or_init(|| {
                let dir = if write { "write" } else { "read" };
                let labels = self.labels(&[("route", route.name()), ("direction", dir)]);
                self.route_bytes.get_or_create(&labels).clone()
            })
            .inc_by(bytes as i64);
    }

    /// Where the engine's per-transport request counts (local, shm, tcp)
    /// are read at each scrape. The first source set stays.
    pub fn set_engine_source(&self, counts: impl Fn() -> [[u64; 3]; 2] + Send + Sync + 'static) {
        let _ = self.engine.set(Box::new(counts));
    }

    /// The Prometheus text format.
    pub fn render(&self) -> String {
        if let Some(counts) = self.engine.get() {
            let [requests, bytes] = counts();
            for (i, t) in ["local", "shm", "tcp"].into_iter().enumerate() {
                let labels = self.labels(&[("transport", t)]);
                self.engine_requests
                    .get_or_create(&labels)
                    .set(requests[i] as i64);
                self.engine_bytes
                    .get_or_create(&labels)
                    .set(bytes[i] as i64);
            }
        }
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        for name in BARE_COUNTERS {
            out = out.replacen(
                &format!("# TYPE {name} gauge\n"),
                &format!("# TYPE {name} counter\n"),
                1,
            );
        }
        out
    }

    /// The reference's text report; `bandwidth` adds the throughput since
    /// the previous report.
    pub fn summary(&self, bandwidth: bool) -> String {
        let read = self.totals[0].load(Ordering::Relaxed);
        let write = self.totals[1].load(Ordering::Relaxed);
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = |b: f64| format!("{}/s", format_size(b as u64));
        let mut s = String::from("=== Transfer Metrics Summary ===\n");
        let _ = writeln!(
            s,
            "Total Read: {}\nTotal Write: {}",
            format_size(read),
            format_size(write)
        );
        let _ = writeln!(
            s,
            "Average Read Throughput: {}\nAverage Write Throughput: {}",
            rate(read as f64 / secs),
            rate(write as f64 / secs)
        );
        let tallies: BTreeMap<(bool, &str), Tally> = self
            .ops
            .lock()
            .iter()
            .map(|(w, op, e)| ((w, op), e.tally.clone()))
            .collect();
        let merged = |write: bool, batch: bool| {
            let mut t = Tally::default();
            for ((w, _), v) in &tallies {
                if *w == write && v.batch == batch {
                    if t.buckets.is_empty() {
                        t.buckets = vec![0; v.buckets.len()];
                    }
                    t.count += v.count;
                    t.bytes += v.bytes;
                    for (a, b) in t.buckets.iter_mut().zip(&v.buckets) {
                        *a += b;
                    }
                }
            }
            t.describe()
        };
        let _ = writeln!(s, "\n=== Latency Summary (microseconds) ===\nGet: {}\nPut: {}\nBatch Get: {}\nBatch Put: {}", merged(false, false), merged(true, false), merged(false, true), merged(true, true));
        s.push_str("\n=== RPC Metrics Summary ===\n");
        let rpcs: BTreeMap<&str, Tally> = self
            .rpcs
            .lock()
            .iter()
            .map(|(_, name, e)| (name, e.tally.clone()))
            .collect();
        if rpcs.is_empty() {
            s.push_str("No RPC calls recorded\n");
        }
        for (name, t) in &rpcs {
            let _ = writeln!(s, "{name}: {}", t.describe());
        }
        s.push_str("\n=== Interface Operation Metrics Summary ===\n");
        for (title, write) in [("Read Interfaces:", false), ("Write Interfaces:", true)] {
            let _ = writeln!(s, "{title}");
            for ((_, op), t) in tallies.iter().filter(|((w, _), _)| *w == write) {
                let d = t.describe();
                let rest = d.strip_prefix(&format!("count={}", t.count)).unwrap_or("");
                let _ = writeln!(
                    s,
                    "{op}: count={}, bytes={}{rest}",
                    t.count,
                    format_size(t.bytes)
                );
            }
        }
        if bandwidth {
            let mut iv = self.interval.lock();
            let secs = iv.at.elapsed().as_secs_f64().max(1e-3);
            let (dr, dw) = (read - iv.read, write - iv.write);
            let _ = write!(
                s,
                "\n=== Interval Throughput Summary ===\nRead Throughput: {} ({} over {secs:.2}s)\nWrite Throughput: {} ({} over {secs:.2}s)\n",
                rate(dr as f64 / secs),
                format_size(dr),
                rate(dw as f64 / secs),
                format_size(dw),
            );
            *iv = Interval {
                at: Instant::now(),
                read,
                write,
            };
        }
        s
    }
}

impl RpcObserver for ClientMetrics {
    /// One master RPC (`rpc`: the request's name).
    fn observe_rpc(&self, rpc: &'static str, took: Duration) {
        let us = took.as_secs_f64() * 1e6;
        let mut rpcs = self.rpcs.lock();
        let e = rpcs.get_or_insert_with(false, rpc, || {
            let labels = self.labels(&[("rpc_name", rpc)]);
            RpcEntry {
                count: self.rpc_count.get_or_create(&labels).clone(),
                latency: self.rpc_latency.get_or_create(&labels).clone(),
                tally: Tally::default(),
            }
        });
        e.count.inc();
        e.latency.observe(us);
        e.tally.add(0, us);
    }
}

/// Logs [`ClientMetrics::summary`] every `every` until the metrics are
/// dropped.
pub fn spawn_reporter(metrics: &Arc<ClientMetrics>, every: Duration, bandwidth: bool) {
    let weak: Weak<ClientMetrics> = Arc::downgrade(metrics);
    let spawned = std::thread::Builder::new()
        .name("mc-client-metrics".into())
        .spawn(move || {
            let step = Duration::from_millis(200).min(every);
            let mut last = Instant::now();
            loop {
                std::thread::sleep(step);
                let Some(m) = weak.upgrade() else { return };
                if last.elapsed() >= every {
                    last = Instant::now();
                    tracing::info!("Client Metrics Report:\n{}", m.summary(bandwidth));
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("no client metrics report: {e}");
    }
}

/// The metrics the environment asks for (`None`: `MC_STORE_CLIENT_METRIC=0`),
/// with their periodic report started.
pub fn from_env(
    mode: &str,
    cluster_id: Option<&str>,
    var: impl Fn(&str) -> Option<String>,
) -> Option<Arc<ClientMetrics>> {
    if !enabled_by_env(&var) {
        tracing::info!("client metrics disabled by MC_STORE_CLIENT_METRIC");
        return None;
    }
    let m = Arc::new(ClientMetrics::new(mode, cluster_id));
    if let Some(every) = report_interval_by_env(&var) {
        let bandwidth =
            var("MC_STORE_CLIENT_METRIC_BANDWIDTH").is_none_or(|v| parse_bool(&v).unwrap_or(true));
        spawn_reporter(&m, every, bandwidth);
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_moves_its_families() {
        let m = ClientMetrics::new("real", None);
        let one = |bytes| Outcome {
            ok: 1,
            failed: 0,
            bytes,
        };
        m.observe_op(true, "put", false, one(1000), Duration::from_micros(60));
        m.observe_op(false, "get", false, one(1000), Duration::from_micros(120));
        let miss = Outcome {
            ok: 0,
            failed: 1,
            bytes: 0,
        };
        m.observe_op(false, "get", false, miss, Duration::from_micros(10));
        m.observe_route(Route::Local, true, 1000);
        m.observe_rpc("PutStart", Duration::from_micros(30));
        let t = m.render();
        for line in [
            "mooncake_transfer_write_bytes{client_mode=\"real\"} 1000",
            "mooncake_transfer_read_operation_count{client_mode=\"real\",op_name=\"get\"} 1",
            "mooncake_transfer_operation_errors_total{client_mode=\"real\",op_name=\"get\"} 1",
            "mooncake_transfer_route_bytes{client_mode=\"real\",route=\"local\",direction=\"write\"} 1000",
            "mooncake_client_rpc_count{client_mode=\"real\",rpc_name=\"PutStart\"} 1",
            "mooncake_transfer_put_latency_count 1",
            "# TYPE mooncake_transfer_read_bytes counter",
        ] {
            assert!(t.contains(line), "{line} not in\n{t}");
        }
        let s = m.summary(true);
        assert!(s.contains("Get: count=1, p95<125μs, max<125μs"), "{s}");
        assert!(s.contains("put: count=1, bytes=1000 B"), "{s}");
        assert!(s.contains("PutStart: count=1"), "{s}");
        assert!(s.contains("Interval Throughput"), "{s}");
    }

    #[test]
    fn environment() {
        let none = |_: &str| None;
        assert!(enabled_by_env(none));
        assert!(!enabled_by_env(|_: &str| Some("0".into())));
        assert_eq!(report_interval_by_env(none), None);
        assert_eq!(
            report_interval_by_env(|_: &str| Some("5".into())),
            Some(Duration::from_secs(5))
        );
        assert_eq!(report_interval_by_env(|_: &str| Some("x".into())), None);
    }
}
