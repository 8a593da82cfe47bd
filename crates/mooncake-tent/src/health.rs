//! A path's health: in rotation, out of it after failures or a stall,
//! probed after a cooldown, back on the first success. Pure: times are
//! passed in.
//!
//! ```text
//!  Healthy ──(threshold failures in the window, or a stall)──► Down{retry_at}
//!     ▲                                                          │ now ≥ retry_at
//!     │ success (data slice or probe)                            ▼
//!     └───────────────────────────────────────────────────── Probing
//!                                  probe failed: Down, cooldown doubled (capped)
//! ```
//!
//! As the reference's rail monitor, a success anywhere (a slice that was
//! still in flight when the path was taken out) brings it back at once and
//! resets the backoff.

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathState {
    Healthy,
    /// Out of rotation until `retry_at`, then probed.
    Down {
        retry_at: Instant,
    },
    /// A probe is in flight; still out of rotation.
    Probing,
}

#[derive(Clone, Copy, Debug)]
pub struct HealthPolicy {
    /// Failures within `window` that take a healthy path out.
    pub error_threshold: u32,
    pub window: Duration,
    /// First wait before a probe; doubles per failed probe up to `max_cooldown`.
    pub cooldown: Duration,
    pub max_cooldown: Duration,
}

#[derive(Clone, Debug)]
pub struct PathHealth {
    state: PathState,
    errors: u32,
    first_error: Option<Instant>,
    cooldown: Duration,
    policy: HealthPolicy,
    /// Times the path left rotation.
    pub trips: u64,
}

impl PathHealth {
    pub fn new(policy: HealthPolicy) -> Self {
        PathHealth {
            state: PathState::Healthy,
            errors: 0,
            first_error: None,
            cooldown: policy.cooldown,
            policy,
            trips: 0,
        }
    }

    pub fn state(&self) -> PathState {
        self.state
    }

    /// May take new slices.
    pub fn usable(&self) -> bool {
        self.state == PathState::Healthy
    }

    /// A slice or probe succeeded: back in rotation, backoff forgotten.
    pub fn success(&mut self) {
        self.state = PathState::Healthy;
        self.errors = 0;
        self.first_error = None;
        self.cooldown = self.policy.cooldown;
    }

    /// A slice failed. Returns whether this took the path out of rotation.
    pub fn failure(&mut self, now: Instant) -> bool {
        match self.state {
            PathState::Healthy => {
                let fresh = self
                    .first_error
                    .is_some_and(|t| now.saturating_duration_since(t) <= self.policy.window);
                if !fresh {
                    self.first_error = Some(now);
                    self.errors = 0;
                }
                self.errors += 1;
                if self.errors >= self.policy.error_threshold.max(1) {
                    self.trip(now);
                    return true;
                }
                false
            }
            // Already out: a late failure of an old slice changes nothing.
            PathState::Down { .. } | PathState::Probing => false,
        }
    }

    /// A slice ran far past its expected time: out of rotation now.
    pub fn stalled(&mut self, now: Instant) -> bool {
        if self.state == PathState::Healthy {
            self.trip(now);
            return true;
        }
        false
    }

    fn trip(&mut self, now: Instant) {
        self.trips += 1;
        self.state = PathState::Down {
            retry_at: now + self.cooldown,
        };
    }

    /// Whether a probe should start now; if so the path is `Probing`.
    pub fn start_probe(&mut self, now: Instant) -> bool {
        match self.state {
            PathState::Down { retry_at } if now >= retry_at => {
                self.state = PathState::Probing;
                true
            }
            _ => false,
        }
    }

    /// The probe failed: down again, for twice as long (capped).
    pub fn probe_failed(&mut self, now: Instant) {
        if self.state == PathState::Probing {
            self.cooldown = (self.cooldown * 2).min(self.policy.max_cooldown);
            self.state = PathState::Down {
                retry_at: now + self.cooldown,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn policy(threshold: u32) -> HealthPolicy {
        HealthPolicy {
            error_threshold: threshold,
            window: 1000 * MS,
            cooldown: 100 * MS,
            max_cooldown: 400 * MS,
        }
    }

    #[test]
    fn full_cycle() {
        let t0 = Instant::now();
        let mut h = PathHealth::new(policy(1));
        assert!(h.usable());
        assert!(h.failure(t0));
        assert!(!h.usable());
        assert_eq!(
            h.state(),
            PathState::Down {
                retry_at: t0 + 100 * MS
            }
        );
        assert!(!h.start_probe(t0 + 50 * MS), "cooling down");
        assert!(h.start_probe(t0 + 100 * MS));
        assert_eq!(h.state(), PathState::Probing);
        assert!(!h.usable(), "out of rotation while probing");
        assert!(!h.start_probe(t0 + 100 * MS), "one probe at a time");
        h.probe_failed(t0 + 110 * MS);
        assert_eq!(
            h.state(),
            PathState::Down {
                retry_at: t0 + 310 * MS
            }
        );
        assert!(h.start_probe(t0 + 310 * MS));
        h.probe_failed(t0 + 320 * MS);
        assert!(h.start_probe(t0 + 720 * MS), "cooldown capped at 400 ms");
        h.probe_failed(t0 + 720 * MS);
        assert_eq!(
            h.state(),
            PathState::Down {
                retry_at: t0 + 1120 * MS
            }
        );
        assert!(h.start_probe(t0 + 1120 * MS));
        h.success();
        assert!(h.usable());
        assert_eq!(h.trips, 1);
        // Backoff forgotten: the next trip cools down 100 ms again.
        let t1 = t0 + 2000 * MS;
        assert!(h.failure(t1));
        assert_eq!(
            h.state(),
            PathState::Down {
                retry_at: t1 + 100 * MS
            }
        );
    }

    #[test]
    fn threshold_within_window() {
        let t0 = Instant::now();
        let mut h = PathHealth::new(policy(3));
        assert!(!h.failure(t0));
        assert!(!h.failure(t0 + 10 * MS));
        // The window expired: counting starts over.
        assert!(!h.failure(t0 + 1500 * MS));
        assert!(!h.failure(t0 + 1600 * MS));
        assert!(h.failure(t0 + 1700 * MS));
        assert!(!h.usable());
        assert!(!h.failure(t0 + 1800 * MS), "already out");
    }

    #[test]
    fn stall_and_late_success() {
        let t0 = Instant::now();
        let mut h = PathHealth::new(policy(3));
        assert!(h.stalled(t0), "a stall trips at once");
        assert!(!h.stalled(t0));
        // The stalled slice completes after all: the path is back.
        h.success();
        assert!(h.usable());
    }
}
