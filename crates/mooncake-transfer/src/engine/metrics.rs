//! Transfer engine metrics (`MC_TE_METRIC=1`), as the reference reports
//! them: every `MC_TE_METRIC_INTERVAL_SECONDS` (default 5) one log line with
//! the throughput and the distribution of batch completion latencies over
//! the interval; ours adds the bytes each transport carried.
//!
//! Requests and bytes per transport are always counted (two atomic adds per
//! routed group); completion latencies only when metrics are on.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use mooncake_common::gflags::parse_bool;
use parking_lot::Mutex;

use super::BatchId;

/// Completion latency buckets (µs), the reference's.
pub(crate) const TASK_LATENCY_BUCKETS_US: [u64; 19] = [
    10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000,
    1000000, 2000000, 5000000, 10000000,
];

const TRANSPORTS: [&str; 3] = ["local", "shm", "tcp"];

/// `MC_TE_METRIC` and `MC_TE_METRIC_INTERVAL_SECONDS`: `Some(interval)`
/// when the periodic report is on.
pub(crate) fn config_from_env(var: impl Fn(&str) -> Option<String>) -> Option<Duration> {
    let on = var("MC_TE_METRIC").is_some_and(|v| parse_bool(&v).unwrap_or(false));
    if !on {
        return None;
    }
    let secs = match var("MC_TE_METRIC_INTERVAL_SECONDS") {
        None => 5,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(s) if s > 0 => s,
            _ => {
                tracing::warn!("MC_TE_METRIC_INTERVAL_SECONDS={v:?} is not a positive number of seconds; using 5");
                5
            }
        },
    };
    Some(Duration::from_secs(secs))
}

#[derive(Default)]
pub(crate) struct EngineMetrics {
    /// Requests and bytes routed to local, shm, tcp (the order of `transports()`).
    pub requests: [AtomicU64; 3],
    pub bytes: [AtomicU64; 3],
    /// Whether completion latencies are recorded.
    timing: AtomicBool,
    /// First submission of each batch not yet seen finished.
    started: Mutex<HashMap<BatchId, Instant>>,
    /// Completions per latency bucket (the last one: above every bound).
    latency: [AtomicU64; 20],
}

impl EngineMetrics {
    pub(crate) fn routed(&self, transport: usize, requests: usize, bytes: usize) {
        self.requests[transport].fetch_add(requests as u64, Ordering::Relaxed);
        self.bytes[transport].fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn submitted(&self, batch: BatchId) {
        if self.timing.load(Ordering::Relaxed) {
            self.started
                .lock()
                .entry(batch)
                .or_insert_with(Instant::now);
        }
    }

    /// The batch was seen finished (or freed): its latency counts once.
    pub(crate) fn finished(&self, batch: BatchId) {
        if !self.timing.load(Ordering::Relaxed) {
            return;
        }
        if let Some(t) = self.started.lock().remove(&batch) {
            self.record(t.elapsed());
        }
    }

    /// A freed batch no longer waits to be seen finished.
    pub(crate) fn forget(&self, batch: BatchId) {
        if self.timing.load(Ordering::Relaxed) {
            self.started.lock().remove(&batch);
        }
    }

    fn record(&self, took: Duration) {
        let us = took.as_micros() as u64;
        let i = TASK_LATENCY_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(TASK_LATENCY_BUCKETS_US.len());
        self.latency[i].fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Snapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            bytes: self.bytes.each_ref().map(load),
            latency: self.latency.each_ref().map(load),
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Snapshot {
    bytes: [u64; 3],
    latency: [u64; 20],
}

/// The reference's report line for the interval between two snapshots.
fn report(prev: &Snapshot, now: &Snapshot, secs: f64) -> Option<String> {
    let bytes: Vec<u64> = (0..3).map(|i| now.bytes[i] - prev.bytes[i]).collect();
    let total: u64 = bytes.iter().sum();
    let counts: Vec<u64> = (0..20).map(|i| now.latency[i] - prev.latency[i]).collect();
    let tasks: u64 = counts.iter().sum();
    if total == 0 && tasks == 0 {
        return None;
    }
    let mut s = format!("[Metrics] Transfer Engine Stats (over last {secs:.0}s):");
    if total > 0 {
        let _ = write!(
            s,
            " Throughput: {:.2} MB/s (",
            total as f64 / secs / (1024.0 * 1024.0)
        );
        let parts: Vec<String> = TRANSPORTS
            .iter()
            .zip(&bytes)
            .map(|(t, b)| format!("{t} {b} B"))
            .collect();
        let _ = write!(s, "{})", parts.join(", "));
    }
    if tasks > 0 {
        let _ = write!(s, " | Latency Distribution (count={tasks}): ");
        let mut first = true;
        for (i, &n) in counts.iter().enumerate() {
            let pct = n as f64 * 100.0 / tasks as f64;
            if n == 0 || pct < 0.1 {
                continue;
            }
            if !first {
                s.push_str(", ");
            }
            first = false;
            match TASK_LATENCY_BUCKETS_US.get(i) {
                Some(&upper) => {
                    let lower = if i == 0 {
                        0
                    } else {
                        TASK_LATENCY_BUCKETS_US[i - 1]
                    };
                    let _ = write!(s, "{lower}-{upper}μs:{pct:.1}%");
                }
                None => {
                    let _ = write!(s, ">{}μs:{pct:.1}%", TASK_LATENCY_BUCKETS_US[18]);
                }
            }
        }
    }
    Some(s)
}

/// Turns latency recording on and logs a report every `every` until the
/// metrics are dropped (with the engine).
pub(crate) fn start_reporting(metrics: &Arc<EngineMetrics>, every: Duration) {
    metrics.timing.store(true, Ordering::Relaxed);
    let weak: Weak<EngineMetrics> = Arc::downgrade(metrics);
    let spawned = std::thread::Builder::new()
        .name("mc-te-metrics".into())
        .spawn(move || {
            tracing::info!(
                "Metrics reporting thread started (interval: {}s)",
                every.as_secs()
            );
            let mut prev = Snapshot::default();
            let mut last = Instant::now();
            loop {
                std::thread::sleep(Duration::from_millis(200).min(every));
                let Some(m) = weak.upgrade() else { return };
                if last.elapsed() < every {
                    continue;
                }
                let now = m.snapshot();
                if let Some(line) = report(&prev, &now, last.elapsed().as_secs_f64()) {
                    tracing::info!("{line}");
                }
                prev = now;
                last = Instant::now();
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("no transfer engine metrics report: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
        };
        assert_eq!(config_from_env(env(&[])), None);
        assert_eq!(config_from_env(env(&[("MC_TE_METRIC", "0")])), None);
        assert_eq!(
            config_from_env(env(&[("MC_TE_METRIC", "true")])),
            Some(Duration::from_secs(5))
        );
        let two = env(&[
            ("MC_TE_METRIC", "1"),
            ("MC_TE_METRIC_INTERVAL_SECONDS", "2"),
        ]);
        assert_eq!(config_from_env(two), Some(Duration::from_secs(2)));
        let bad = env(&[
            ("MC_TE_METRIC", "1"),
            ("MC_TE_METRIC_INTERVAL_SECONDS", "-1"),
        ]);
        assert_eq!(config_from_env(bad), Some(Duration::from_secs(5)));
    }

    #[test]
    fn the_report_covers_one_interval() {
        let m = EngineMetrics::default();
        m.timing.store(true, Ordering::Relaxed);
        let before = m.snapshot();
        m.routed(2, 1, 3 << 20);
        m.record(Duration::from_micros(15));
        m.record(Duration::from_micros(700));
        m.record(Duration::from_secs(30));
        let line = report(&before, &m.snapshot(), 1.0).unwrap();
        assert!(
            line.contains("Throughput: 3.00 MB/s (local 0 B, shm 0 B, tcp 3145728 B)"),
            "{line}"
        );
        assert!(line.contains("count=3"), "{line}");
        assert!(line.contains("10-20μs:33.3%"), "{line}");
        assert!(line.contains("500-1000μs:33.3%"), "{line}");
        assert!(line.contains(">10000000μs:33.3%"), "{line}");
        let now = m.snapshot();
        assert_eq!(report(&now, &now, 1.0), None, "nothing new, no line");
    }

    #[test]
    fn a_batch_counts_once() {
        let m = EngineMetrics::default();
        m.timing.store(true, Ordering::Relaxed);
        m.submitted(7);
        m.submitted(7);
        m.finished(7);
        m.finished(7);
        assert_eq!(m.snapshot().latency.iter().sum::<u64>(), 1);
    }
}
