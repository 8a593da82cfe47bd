//! Slice spraying: which path carries the next slice. Pure logic: the
//! caller passes times and which paths are usable, nothing here reads a
//! clock or touches a socket.
//!
//! Each path keeps an EWMA of its observed throughput and the bytes it has
//! in flight. A slice goes to the usable path with the smallest predicted
//! completion time, `(inflight_bytes + slice) / bandwidth`, among those
//! below the queue-depth cap; so a path that completes slower (lower
//! bandwidth) or is more queued (more bytes ahead) gets fewer slices.

use std::time::Duration;

/// Telemetry of one path.
#[derive(Clone, Debug)]
pub struct PathLoad {
    /// Estimated throughput, bytes per second.
    pub bandwidth: f64,
    pub inflight_bytes: u64,
    pub inflight_slices: usize,
    /// EWMA of one slice's completion time (queueing included), seconds.
    pub latency: f64,
    pub completed_slices: u64,
    /// The estimate was last changed by a failure, not a measurement.
    pub cut: bool,
    /// The scheduler's pick count when this path last got a slice.
    last_pick: u64,
}

/// What a completion reports back: the bytes that were ahead of the slice
/// on its path when it was dispatched (itself included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub path: usize,
    pub bytes: u64,
    pub ahead: u64,
}

#[derive(Clone, Debug)]
pub struct Scheduler {
    paths: Vec<PathLoad>,
    /// Weight of the old estimate in the EWMA (the reference's
    /// `bandwidth_learning_rate`: 0 = the last observation only).
    alpha: f64,
    max_inflight: usize,
    initial_bandwidth: f64,
    /// Most predicted seconds of work queued on one path (None: no bound).
    horizon: Option<f64>,
    picks: u64,
}

/// An idle usable path gets a slice at least once in this many picks, so
/// that one bad measurement cannot keep it idle (and its estimate wrong)
/// for good.
pub const EXPLORE_EVERY: u64 = 32;

/// Slices a path may hold before its first completion: its estimate is
/// still a guess, and a slow path must not get a full queue on it.
const PROBATION_SLICES: usize = 2;

impl Scheduler {
    /// `paths` paths that start equal at `initial_bandwidth` bytes/s.
    pub fn new(paths: usize, alpha: f64, max_inflight: usize, initial_bandwidth: f64) -> Self {
        let initial_bandwidth = initial_bandwidth.max(1.0);
        Scheduler {
            paths: (0..paths)
                .map(|_| PathLoad {
                    bandwidth: initial_bandwidth,
                    inflight_bytes: 0,
                    inflight_slices: 0,
                    latency: 0.0,
                    completed_slices: 0,
                    cut: false,
                    last_pick: 0,
                })
                .collect(),
            alpha: alpha.clamp(0.0, 1.0),
            max_inflight: max_inflight.max(1),
            initial_bandwidth,
            horizon: None,
            picks: 0,
        }
    }

    /// Bounds each path's queue to `secs` of predicted work (at least one
    /// slice), so that queued slices finish well within their timeout.
    pub fn with_horizon(mut self, secs: f64) -> Self {
        self.horizon = Some(secs.max(0.0));
        self
    }

    pub fn paths(&self) -> &[PathLoad] {
        &self.paths
    }

    /// Picks the path for a slice of `bytes` among those `usable` says
    /// may take traffic, and counts it in flight there. `None`: no path is
    /// usable, or the one predicted to finish the slice first is at its
    /// queue-depth cap: waiting for it beats a slower path, which would
    /// finish the slice later (and the transfer with it).
    pub fn pick(&mut self, bytes: u64, usable: impl Fn(usize) -> bool) -> Option<Ticket> {
        let idle = (0..self.paths.len()).find(|&i| {
            let p = &self.paths[i];
            usable(i) && p.inflight_slices == 0 && self.picks - p.last_pick >= EXPLORE_EVERY
        });
        if let Some(path) = idle {
            return Some(self.take(path, bytes));
        }
        let mut best: Option<(usize, f64)> = None;
        for (i, p) in self.paths.iter().enumerate() {
            if !usable(i) {
                continue;
            }
            let predicted = (p.inflight_bytes + bytes) as f64 / p.bandwidth;
            // Ties go to the less queued path, then the lower index.
            if best.is_none_or(|(_, b)| predicted < b) {
                best = Some((i, predicted));
            }
        }
        let (path, predicted) = best?;
        let p = &mut self.paths[path];
        let cap = if p.completed_slices == 0 {
            PROBATION_SLICES.min(self.max_inflight)
        } else {
            self.max_inflight
        };
        let beyond = self
            .horizon
            .is_some_and(|h| p.inflight_slices > 0 && predicted > h);
        if p.inflight_slices >= cap || beyond {
            return None;
        }
        Some(self.take(path, bytes))
    }

    fn take(&mut self, path: usize, bytes: u64) -> Ticket {
        self.picks += 1;
        let p = &mut self.paths[path];
        p.last_pick = self.picks;
        p.inflight_bytes += bytes;
        p.inflight_slices += 1;
        Ticket {
            path,
            bytes,
            ahead: p.inflight_bytes,
        }
    }

    /// A slice finished after `elapsed`: the path moved the `ahead` bytes
    /// queued at dispatch in that time, which is its observed throughput.
    pub fn completed(&mut self, t: Ticket, elapsed: Duration) {
        let secs = elapsed.as_secs_f64().max(1e-6);
        let alpha = self.alpha;
        let p = self.release(t);
        let observed = t.ahead as f64 / secs;
        p.bandwidth = alpha * p.bandwidth + (1.0 - alpha) * observed;
        p.latency = if p.completed_slices == 0 {
            secs
        } else {
            alpha * p.latency + (1.0 - alpha) * secs
        };
        p.completed_slices += 1;
        p.cut = false;
    }

    /// A slice failed: out of flight; the path's estimate is halved so
    /// that, back in rotation, it earns its share again.
    pub fn failed(&mut self, t: Ticket) {
        let floor = self.initial_bandwidth / 1024.0;
        let p = self.release(t);
        p.bandwidth = (p.bandwidth / 2.0).max(floor);
        p.cut = true;
    }

    /// A path back in rotation whose estimate was last cut by failures
    /// starts from the others' mean (if its own is lower): it would
    /// otherwise stay idle, and an idle path never corrects its estimate.
    /// An estimate measured by completions (a slow path) is kept.
    pub fn restore(&mut self, path: usize) {
        if !self.paths[path].cut {
            return;
        }
        let others: Vec<f64> = self
            .paths
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != path)
            .map(|(_, p)| p.bandwidth)
            .collect();
        let mean = if others.is_empty() {
            self.initial_bandwidth
        } else {
            others.iter().sum::<f64>() / others.len() as f64
        };
        let p = &mut self.paths[path];
        p.bandwidth = p.bandwidth.max(mean);
        p.cut = false;
    }

    fn release(&mut self, t: Ticket) -> &mut PathLoad {
        let p = &mut self.paths[t.path];
        p.inflight_bytes = p.inflight_bytes.saturating_sub(t.bytes);
        p.inflight_slices = p.inflight_slices.saturating_sub(1);
        p
    }

    /// How long a slice dispatched with `ahead` bytes in front of it may
    /// run on `path` before the path counts as stalled: `factor` times the
    /// time its estimate predicts, never under `floor`.
    pub fn stall_after(&self, path: usize, ahead: u64, factor: f64, floor: Duration) -> Duration {
        let p = &self.paths[path];
        let predicted = ahead as f64 / p.bandwidth * factor;
        Duration::from_secs_f64(predicted.min(86_400.0)).max(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn equal_paths_share_evenly() {
        let mut s = Scheduler::new(2, 0.5, 2, 1e9);
        let picks: Vec<_> = (0..4)
            .map(|_| s.pick(100, |_| true).unwrap().path)
            .collect();
        assert_eq!(picks, vec![0, 1, 0, 1]);
        assert!(s.pick(100, |_| true).is_none(), "both at the depth cap");
    }

    #[test]
    fn probation_and_horizon_bound_a_queue() {
        let mut s = Scheduler::new(1, 0.0, 8, 1e9).with_horizon(0.5);
        assert!(s.pick(100, |_| true).is_some());
        assert!(s.pick(100, |_| true).is_some());
        assert!(
            s.pick(100, |_| true).is_none(),
            "two slices before a completion"
        );
        // A measured 1 MB/s: 0.5 s of work is 500 kB.
        let mut s = Scheduler::new(1, 0.0, 8, 1e9).with_horizon(0.5);
        let t = s.pick(100_000, |_| true).unwrap();
        s.completed(t, Duration::from_millis(100));
        let n = (0..8)
            .take_while(|_| s.pick(100_000, |_| true).is_some())
            .count();
        assert_eq!(n, 5, "500 kB queued at most");
    }

    #[test]
    fn an_idle_path_is_explored() {
        let mut s = Scheduler::new(2, 0.0, 4, 1e9);
        let t = s.pick(100, |i| i == 1).unwrap();
        s.completed(t, Duration::from_secs(1)); // one terrible sample
        let mut on_slow = 0;
        for _ in 0..200 {
            let t = s.pick(1 << 20, |_| true).unwrap();
            if t.path == 1 {
                on_slow += 1;
            }
            s.completed(t, Duration::from_millis(1)); // both fast really
        }
        assert!(on_slow >= 200 / (EXPLORE_EVERY as usize + 1), "{on_slow}");
        assert!(s.paths()[1].bandwidth > 1e8, "estimate corrected");
    }

    #[test]
    fn unusable_paths_get_nothing() {
        let mut s = Scheduler::new(3, 0.5, 8, 1e9);
        for _ in 0..6 {
            let t = s.pick(10, |i| i == 2).unwrap();
            assert_eq!(t.path, 2);
            s.completed(t, MS);
        }
        assert!(s.pick(10, |_| false).is_none());
    }

    /// A path that completes four times slower ends up with about a fifth
    /// of the slices when both are kept busy.
    #[test]
    fn slow_path_gets_fewer_slices() {
        let mut s = Scheduler::new(2, 0.2, 4, 1e6);
        let slice = 1_000_000u64;
        // Simulated time: path 0 moves 100 MB/s, path 1 25 MB/s.
        let rate = [100e6, 25e6];
        let mut busy_until = [0.0f64; 2];
        let mut inflight: Vec<(f64, f64, Ticket)> = Vec::new();
        let mut now = 0.0;
        let mut counts = [0u32; 2];
        for _ in 0..2000 {
            while let Some(t) = s.pick(slice, |_| true) {
                let start = busy_until[t.path].max(now);
                busy_until[t.path] = start + slice as f64 / rate[t.path];
                inflight.push((busy_until[t.path], now, t));
                counts[t.path] += 1;
            }
            // The earliest completion.
            let (k, _) = inflight
                .iter()
                .enumerate()
                .min_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
                .unwrap();
            let (done, dispatched, t) = inflight.swap_remove(k);
            now = done;
            s.completed(t, Duration::from_secs_f64(done - dispatched));
        }
        let share = f64::from(counts[1]) / f64::from(counts[0] + counts[1]);
        assert!(
            (0.12..0.25).contains(&share),
            "slow share {share} ({counts:?})"
        );
        let bw = &s.paths();
        assert!(bw[0].bandwidth > 3.0 * bw[1].bandwidth, "{bw:?}");
    }

    /// With the faster path full, a slice waits for it rather than go to
    /// a path predicted to finish it later.
    #[test]
    fn waits_for_a_full_faster_path() {
        let mut s = Scheduler::new(2, 0.0, 2, 1e6);
        let t = s.pick(100, |_| true).unwrap();
        s.completed(t, Duration::from_micros(1)); // path 0: ~100 MB/s
        let t = s.pick(100, |i| i == 1).unwrap();
        s.completed(t, Duration::from_millis(1)); // path 1: ~100 kB/s
        assert_eq!(s.pick(1000, |_| true).unwrap().path, 0);
        assert_eq!(s.pick(1000, |_| true).unwrap().path, 0);
        assert!(s.pick(1000, |_| true).is_none(), "path 1 would be slower");
        // Path 0 out of rotation: path 1 is the best there is.
        assert_eq!(s.pick(1000, |i| i == 1).unwrap().path, 1);
    }

    #[test]
    fn queue_depth_counts_before_any_telemetry() {
        let mut s = Scheduler::new(2, 0.5, 8, 1e9);
        // Big slice on path 0; the next small ones go to path 1 first.
        assert_eq!(s.pick(10_000, |_| true).unwrap().path, 0);
        assert_eq!(s.pick(100, |_| true).unwrap().path, 1);
        assert_eq!(s.pick(100, |_| true).unwrap().path, 1);
    }

    #[test]
    fn failures_halve_and_release() {
        let mut s = Scheduler::new(2, 0.5, 1, 1e9);
        let t = s.pick(100, |_| true).unwrap();
        assert_eq!(t.path, 0);
        s.failed(t);
        assert_eq!(s.paths()[0].inflight_slices, 0);
        assert_eq!(s.paths()[0].inflight_bytes, 0);
        assert!((s.paths()[0].bandwidth - 5e8).abs() < 1.0);
        // Path 1 is now the faster estimate.
        assert_eq!(s.pick(100, |_| true).unwrap().path, 1);
    }

    #[test]
    fn a_restored_path_gets_traffic_again() {
        let mut s = Scheduler::new(2, 0.5, 2, 1e9);
        for _ in 0..10 {
            let t = s.pick(100, |i| i == 1).unwrap();
            s.failed(t);
        }
        // Path 0 full: path 1's cut estimate would rather wait.
        s.pick(1 << 20, |_| true).unwrap();
        s.pick(1 << 20, |_| true).unwrap();
        assert!(s.pick(1 << 20, |_| true).is_none());
        s.restore(1);
        assert_eq!(s.paths()[1].bandwidth, 1e9);
        assert_eq!(s.pick(1 << 20, |_| true).unwrap().path, 1);
        // A measured slow estimate stays.
        let mut s = Scheduler::new(2, 0.0, 2, 1e9);
        let t = s.pick(1000, |i| i == 1).unwrap();
        s.completed(t, Duration::from_millis(1));
        s.restore(1);
        assert!((s.paths()[1].bandwidth - 1e6).abs() < 1.0);
    }

    #[test]
    fn stall_threshold_scales_with_estimate() {
        let mut s = Scheduler::new(1, 0.0, 4, 1e6);
        let t = s.pick(1_000_000, |_| true).unwrap();
        s.completed(t, 100 * MS); // 10 MB/s observed
        assert!((s.paths()[0].bandwidth - 1e7).abs() < 1.0);
        assert_eq!(s.stall_after(0, 1_000_000, 10.0, 5 * MS), 1000 * MS);
        assert_eq!(s.stall_after(0, 1, 10.0, 5 * MS), 5 * MS);
    }
}
