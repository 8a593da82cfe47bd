//! TENT's metrics: the reference's `tent_*` families (bytes, requests,
//! failures and latency per transport and direction, failovers), plus the
//! paths' state, rendered as Prometheus text, JSON and a one-line summary.
//! Recording is a few relaxed atomic adds; `enabled` turns it off.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::selector::TransportKind;

/// Latency buckets, microseconds (fixed, as the reference's).
pub const LATENCY_BUCKETS_US: [u64; 12] = [
    10, 50, 100, 500, 1_000, 5_000, 10_000, 50_000, 100_000, 500_000, 1_000_000, 5_000_000,
];

#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    fn observe(&self, us: u64) {
        if let Some(i) = LATENCY_BUCKETS_US.iter().position(|&b| us <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }
}

/// One direction (read or write) over one transport.
#[derive(Default)]
struct Direction {
    bytes: AtomicU64,
    requests: AtomicU64,
    failures: AtomicU64,
    latency: Histogram,
}

#[derive(Default)]
struct PerTransport {
    read: Direction,
    write: Direction,
}

/// What `/health` and `tent_path_up` report about one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathReport {
    pub peer: String,
    pub path: String,
    pub up: bool,
}

pub struct Metrics {
    enabled: AtomicBool,
    shm: PerTransport,
    tcp: PerTransport,
    /// `(from, to)` path labels → slices moved from one path to another.
    failovers: Mutex<BTreeMap<(String, String), u64>>,
    path_down: AtomicU64,
    slice_retries: AtomicU64,
    paths: Mutex<BTreeMap<(String, String), bool>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            enabled: AtomicBool::new(true),
            shm: PerTransport::default(),
            tcp: PerTransport::default(),
            failovers: Mutex::default(),
            path_down: AtomicU64::new(0),
            slice_retries: AtomicU64::new(0),
            paths: Mutex::default(),
        }
    }
}

impl Metrics {
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn dir(&self, t: TransportKind, write: bool) -> &Direction {
        let pt = match t {
            TransportKind::Shm => &self.shm,
            TransportKind::Tcp => &self.tcp,
        };
        if write {
            &pt.write
        } else {
            &pt.read
        }
    }

    /// A request finished: `bytes` in `us` microseconds.
    pub fn completed(&self, t: TransportKind, write: bool, bytes: u64, us: u64) {
        if !self.is_enabled() {
            return;
        }
        let d = self.dir(t, write);
        d.bytes.fetch_add(bytes, Ordering::Relaxed);
        d.requests.fetch_add(1, Ordering::Relaxed);
        d.latency.observe(us);
    }

    pub fn failed(&self, t: TransportKind, write: bool) {
        if self.is_enabled() {
            self.dir(t, write).failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A slice that failed on `from` is carried again (on `to`).
    pub fn failover(&self, from: &str, to: &str) {
        if self.is_enabled() {
            *self
                .failovers
                .lock()
                .entry((from.to_string(), to.to_string()))
                .or_default() += 1;
        }
    }

    pub fn slice_retried(&self) {
        self.slice_retries.fetch_add(1, Ordering::Relaxed);
    }

    /// A path's state changed (`up`: in rotation).
    pub fn path_state(&self, peer: &str, path: &str, up: bool) {
        let mut paths = self.paths.lock();
        let was = paths.insert((peer.to_string(), path.to_string()), up);
        if !up && was != Some(false) {
            self.path_down.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn paths(&self) -> Vec<PathReport> {
        self.paths
            .lock()
            .iter()
            .map(|((peer, path), &up)| PathReport {
                peer: peer.clone(),
                path: path.clone(),
                up,
            })
            .collect()
    }

    /// Slices retried so far (after a failure or stall of their path).
    pub fn slice_retries(&self) -> u64 {
        self.slice_retries.load(Ordering::Relaxed)
    }

    /// Times a path left rotation.
    pub fn path_down_total(&self) -> u64 {
        self.path_down.load(Ordering::Relaxed)
    }

    pub fn prometheus(&self) -> String {
        let mut o = String::new();
        let kinds = [TransportKind::Tcp, TransportKind::Shm];
        for (dir, write) in [("read", false), ("write", true)] {
            for (what, help, get) in [
                ("bytes", "bytes", 0),
                ("requests", "requests", 1),
                ("failures", "failed requests", 2),
            ] {
                let _ = writeln!(
                    o,
                    "# HELP tent_{dir}_{what}_total Total {help} ({dir}) via TENT\n# TYPE tent_{dir}_{what}_total counter"
                );
                for t in kinds {
                    let d = self.dir(t, write);
                    let v = [&d.bytes, &d.requests, &d.failures][get].load(Ordering::Relaxed);
                    let _ = writeln!(
                        o,
                        "tent_{dir}_{what}_total{{transport=\"{}\"}} {v}",
                        t.name()
                    );
                }
            }
            let _ = writeln!(
                o,
                "# HELP tent_{dir}_latency_us {dir} latency distribution in microseconds\n# TYPE tent_{dir}_latency_us histogram"
            );
            for t in kinds {
                let h = &self.dir(t, write).latency;
                let mut cum = 0;
                for (i, b) in LATENCY_BUCKETS_US.iter().enumerate() {
                    cum += h.buckets[i].load(Ordering::Relaxed);
                    let _ = writeln!(
                        o,
                        "tent_{dir}_latency_us_bucket{{transport=\"{}\",le=\"{b}\"}} {cum}",
                        t.name()
                    );
                }
                let n = h.count.load(Ordering::Relaxed);
                let name = t.name();
                let _ = writeln!(
                    o,
                    "tent_{dir}_latency_us_bucket{{transport=\"{name}\",le=\"+Inf\"}} {n}"
                );
                let _ = writeln!(
                    o,
                    "tent_{dir}_latency_us_sum{{transport=\"{name}\"}} {}",
                    h.sum_us.load(Ordering::Relaxed)
                );
                let _ = writeln!(o, "tent_{dir}_latency_us_count{{transport=\"{name}\"}} {n}");
            }
        }
        let _ = writeln!(
            o,
            "# HELP tent_transport_failover_total Slices moved from a failed or stalled path to another\n# TYPE tent_transport_failover_total counter"
        );
        for ((from, to), n) in self.failovers.lock().iter() {
            let _ = writeln!(
                o,
                "tent_transport_failover_total{{from=\"{from}\",to=\"{to}\"}} {n}"
            );
        }
        let _ = writeln!(
            o,
            "# HELP tent_slice_retries_total Slices carried again after their path failed\n# TYPE tent_slice_retries_total counter\ntent_slice_retries_total {}",
            self.slice_retries()
        );
        let _ = writeln!(
            o,
            "# HELP tent_path_down_total Times a path left rotation\n# TYPE tent_path_down_total counter\ntent_path_down_total {}",
            self.path_down_total()
        );
        let _ = writeln!(
            o,
            "# HELP tent_path_up Whether a path is in rotation\n# TYPE tent_path_up gauge"
        );
        for p in self.paths() {
            let _ = writeln!(
                o,
                "tent_path_up{{peer=\"{}\",path=\"{}\"}} {}",
                p.peer,
                p.path,
                u8::from(p.up)
            );
        }
        o
    }

    fn total(&self, write: bool, get: impl Fn(&Direction) -> &AtomicU64) -> u64 {
        [TransportKind::Tcp, TransportKind::Shm]
            .iter()
            .map(|&t| get(self.dir(t, write)).load(Ordering::Relaxed))
            .sum()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "tent_read_bytes_total": self.total(false, |d| &d.bytes),
            "tent_write_bytes_total": self.total(true, |d| &d.bytes),
            "tent_read_requests_total": self.total(false, |d| &d.requests),
            "tent_write_requests_total": self.total(true, |d| &d.requests),
            "tent_read_failures_total": self.total(false, |d| &d.failures),
            "tent_write_failures_total": self.total(true, |d| &d.failures),
            "tent_transport_failover_total": self.failovers.lock().values().sum::<u64>(),
            "tent_slice_retries_total": self.slice_retries(),
            "tent_path_down_total": self.path_down_total(),
        })
    }

    pub fn summary(&self) -> String {
        let side = |write| {
            format!(
                "{} ({} reqs, {} fails)",
                human(self.total(write, |d| &d.bytes)),
                self.total(write, |d| &d.requests),
                self.total(write, |d| &d.failures)
            )
        };
        let up = self.paths().iter().filter(|p| p.up).count();
        format!(
            "Read: {} | Write: {} | Paths up: {}/{} | Failovers: {}",
            side(false),
            side(true),
            up,
            self.paths().len(),
            self.failovers.lock().values().sum::<u64>()
        )
    }
}

fn human(bytes: u64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", units[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_reference_families() {
        let m = Metrics::default();
        m.completed(TransportKind::Tcp, false, 1 << 20, 25_000);
        m.completed(TransportKind::Tcp, true, 512 << 10, 7);
        m.failed(TransportKind::Tcp, false);
        m.failover("p0", "p1");
        m.path_state("peer", "p0", false);
        m.path_state("peer", "p0", false);
        m.path_state("peer", "p1", true);
        let text = m.prometheus();
        assert!(
            text.contains("tent_read_bytes_total{transport=\"tcp\"} 1048576"),
            "{text}"
        );
        assert!(text.contains("tent_write_requests_total{transport=\"tcp\"} 1"));
        assert!(text.contains("tent_read_failures_total{transport=\"tcp\"} 1"));
        assert!(text.contains("tent_read_latency_us_bucket{transport=\"tcp\",le=\"50000\"} 1"));
        assert!(text.contains("tent_read_latency_us_bucket{transport=\"tcp\",le=\"10000\"} 0"));
        assert!(text.contains("tent_write_latency_us_bucket{transport=\"tcp\",le=\"10\"} 1"));
        assert!(text.contains("tent_transport_failover_total{from=\"p0\",to=\"p1\"} 1"));
        assert!(text.contains("tent_path_up{peer=\"peer\",path=\"p0\"} 0"));
        assert!(text.contains("tent_path_down_total 1"), "counted once");
        let j = m.json();
        assert_eq!(j["tent_read_bytes_total"], 1 << 20);
        assert_eq!(j["tent_write_failures_total"], 0);
        assert_eq!(
            m.summary(),
            "Read: 1.00 MB (1 reqs, 1 fails) | Write: 512.00 KB (1 reqs, 0 fails) | Paths up: 1/2 | Failovers: 1"
        );
        m.set_enabled(false);
        m.completed(TransportKind::Tcp, false, 5, 5);
        assert_eq!(m.json()["tent_read_bytes_total"], 1 << 20);
    }
}
