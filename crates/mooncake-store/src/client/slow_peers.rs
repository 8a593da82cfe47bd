//! Hedged reads' bookkeeping: how long reads from each peer take, when a
//! read from a peer is late enough to ask another replica, and which peers
//! this client skips for a while because a read from them was late. Pure
//! logic: the clock is an argument.
//!
//! A peer that stalls (stopped, swapping, a dead link) is only Suspected by
//! the master after `--client_suspect_ms`; until then its replicas are
//! still listed. A read from it that has not answered within its hedge
//! delay is read again from another replica, and the peer goes on this
//! client's slow list: later reads put its replicas last at once. After
//! `hold` one read tries it again (a probe, itself hedged); a read that
//! completes takes it off the list.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::types::MemoryDescriptor;

/// Latencies kept per peer for its p99.
const WINDOW: usize = 128;
/// Fewer samples than this: the floor alone sets the delay.
const MIN_SAMPLES: usize = 16;
/// No hedge waits longer than this, however slow a peer usually is.
pub(crate) const MAX_HEDGE_DELAY: Duration = Duration::from_secs(1);

/// Hedging's settings (`MC_STORE_HEDGE_READ_MS`, `MC_STORE_SLOW_PEER_HOLD_MS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HedgeConfig {
    /// The shortest wait before a read is hedged.
    pub floor: Duration,
    /// How long a late peer is skipped before a read tries it again.
    pub hold: Duration,
}

#[derive(Default)]
struct Peer {
    /// Recent read latencies, microseconds, oldest first.
    recent: VecDeque<u64>,
    /// Skipped until then; past it, the next read probes the peer.
    slow_until: Option<Instant>,
}

/// Per-peer latencies and the slow list.
pub(crate) struct SlowPeers {
    config: HedgeConfig,
    peers: HashMap<String, Peer>,
}

impl SlowPeers {
    pub(crate) fn new(config: HedgeConfig) -> Self {
        SlowPeers {
            config,
            peers: HashMap::new(),
        }
    }

    /// How long a read from `peer` runs before it is hedged: the p99 of
    /// its recent reads, at least the floor, at most [`MAX_HEDGE_DELAY`].
    pub(crate) fn hedge_delay(&self, peer: &str) -> Duration {
        let p99 = self.peers.get(peer).and_then(|p| {
            if p.recent.len() < MIN_SAMPLES {
                return None;
            }
            let mut v: Vec<u64> = p.recent.iter().copied().collect();
            v.sort_unstable();
            let at = ((v.len() as f64) * 0.99).ceil() as usize;
            Some(Duration::from_micros(v[at.clamp(1, v.len()) - 1]))
        });
        p99.unwrap_or_default()
            .max(self.config.floor)
            .min(MAX_HEDGE_DELAY.max(self.config.floor))
    }

    /// A read from `peer` completed after `took`: counted, and the peer
    /// answers, so it is no longer skipped.
    pub(crate) fn record(&mut self, peer: &str, took: Duration) {
        let p = self.peers.entry(peer.to_owned()).or_default();
        if p.recent.len() == WINDOW {
            p.recent.pop_front();
        }
        p.recent
            .push_back(took.as_micros().min(u64::MAX as u128) as u64);
        p.slow_until = None;
    }

    /// A read from `peer` completed, its latency unknown: no longer skipped.
    pub(crate) fn answered(&mut self, peer: &str) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.slow_until = None;
        }
    }

    /// A read from `peer` was late and hedged: skip it for `hold`.
    pub(crate) fn mark_slow(&mut self, peer: &str, now: Instant) {
        self.peers.entry(peer.to_owned()).or_default().slow_until = Some(now + self.config.hold);
    }

    /// Whether a read should pass over `peer` now: its hold is not over.
    fn skipped(&self, peer: &str, now: Instant) -> bool {
        self.peers
            .get(peer)
            .and_then(|p| p.slow_until)
            .is_some_and(|until| now < until)
    }

    /// Moves replicas on skipped peers after the others, keeping the order
    /// otherwise (a replica is still read when none else is left). When
    /// the replica read first is on a slow peer whose hold is over, this
    /// read is its probe: the hold starts again for the others until a read
    /// completes ([`Self::record`]). Only the read that goes to the peer
    /// takes the probe; one that merely lists it behind another replica
    /// leaves it for the next read that does.
    pub(crate) fn order(&mut self, replicas: &mut [MemoryDescriptor], now: Instant) {
        if replicas.is_empty() || self.peers.values().all(|p| p.slow_until.is_none()) {
            return;
        }
        if replicas.len() > 1 {
            let keys: Vec<bool> = replicas
                .iter()
                .map(|r| self.skipped(&r.transport_endpoint, now))
                .collect();
            let mut idx: Vec<usize> = (0..replicas.len()).collect();
            idx.sort_by_key(|&i| keys[i]);
            let sorted: Vec<MemoryDescriptor> = idx.iter().map(|&i| replicas[i].clone()).collect();
            replicas.clone_from_slice(&sorted);
        }
        let hold = self.config.hold;
        if let Some(until) = self
            .peers
            .get_mut(&replicas[0].transport_endpoint)
            .and_then(|p| p.slow_until.as_mut())
        {
            if now >= *until {
                *until = now + hold;
            }
        }
    }

    /// The peers skipped now, sorted.
    pub(crate) fn slow(&self, now: Instant) -> Vec<String> {
        let mut v: Vec<String> = self
            .peers
            .iter()
            .filter(|(_, p)| p.slow_until.is_some_and(|u| now < u))
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn table() -> SlowPeers {
        SlowPeers::new(HedgeConfig {
            floor: 20 * MS,
            hold: 1000 * MS,
        })
    }

    fn at(endpoint: &str) -> MemoryDescriptor {
        MemoryDescriptor {
            segment_name: endpoint.into(),
            transport_endpoint: endpoint.into(),
            buffer_address: 0,
            size: 1,
            suspected: false,
        }
    }

    fn endpoints(v: &[MemoryDescriptor]) -> Vec<&str> {
        v.iter().map(|d| d.transport_endpoint.as_str()).collect()
    }

    #[test]
    fn delay_is_the_peers_p99_between_floor_and_cap() {
        let mut t = table();
        assert_eq!(t.hedge_delay("a:1"), 20 * MS, "unknown peer: the floor");
        for _ in 0..(MIN_SAMPLES - 1) {
            t.record("a:1", 90 * MS);
        }
        assert_eq!(t.hedge_delay("a:1"), 20 * MS, "too few samples");
        // 127 fast reads and one slow: the p99 is a fast one.
        for i in 0..WINDOW {
            t.record("a:1", if i == 0 { 500 * MS } else { 30 * MS });
        }
        assert_eq!(t.hedge_delay("a:1"), 30 * MS);
        for _ in 0..WINDOW {
            t.record("a:1", 5 * MS);
        }
        assert_eq!(t.hedge_delay("a:1"), 20 * MS, "fast peer: the floor");
        for _ in 0..WINDOW {
            t.record("b:1", Duration::from_secs(9));
        }
        assert_eq!(t.hedge_delay("b:1"), MAX_HEDGE_DELAY);
        assert_eq!(t.hedge_delay("a:1"), 20 * MS, "per peer");
    }

    /// The endpoint a read of `replicas` goes to first.
    fn first(t: &mut SlowPeers, replicas: &[&str], now: Instant) -> String {
        let mut v: Vec<MemoryDescriptor> = replicas.iter().map(|e| at(e)).collect();
        t.order(&mut v, now);
        v[0].transport_endpoint.clone()
    }

    #[test]
    fn a_slow_peer_is_skipped_then_probed_once_until_it_answers() {
        let mut t = table();
        let now = Instant::now();
        assert_eq!(first(&mut t, &["a:1", "b:1"], now), "a:1");
        t.mark_slow("a:1", now);
        assert_eq!(first(&mut t, &["a:1", "b:1"], now + 999 * MS), "b:1");
        assert_eq!(first(&mut t, &["b:1", "a:1"], now), "b:1", "per peer");
        assert_eq!(t.slow(now), ["a:1"]);
        // Hold over: one read probes, the others still skip.
        let later = now + 1000 * MS;
        assert_eq!(first(&mut t, &["a:1", "b:1"], later), "a:1", "the probe");
        assert_eq!(
            first(&mut t, &["a:1", "b:1"], later),
            "b:1",
            "others while it probes"
        );
        assert_eq!(first(&mut t, &["a:1", "b:1"], later + 999 * MS), "b:1");
        assert_eq!(
            first(&mut t, &["a:1", "b:1"], later + 1000 * MS),
            "a:1",
            "the next probe"
        );
        // A completed read: answers again.
        t.record("a:1", MS);
        assert_eq!(first(&mut t, &["a:1", "b:1"], later + 1001 * MS), "a:1");
        assert!(t.slow(later).is_empty());
        t.mark_slow("a:1", later);
        t.answered("a:1");
        assert_eq!(first(&mut t, &["a:1", "b:1"], later), "a:1");
    }

    #[test]
    fn only_a_read_that_goes_to_a_slow_peer_takes_its_probe() {
        let mut t = table();
        let now = Instant::now();
        t.mark_slow("a:1", now);
        let later = now + 1000 * MS;
        // Reads of objects listed on another peer first pass it by, as
        // many as there are: none of them uses up the probe.
        for i in 0..5 {
            assert_eq!(first(&mut t, &["b:1", "a:1"], later + i * MS), "b:1");
        }
        assert!(t.slow(later + 5 * MS).is_empty(), "hold over, not probed");
        // The first read that lists it first probes it; the others skip.
        assert_eq!(first(&mut t, &["a:1", "b:1"], later + 6 * MS), "a:1");
        assert_eq!(t.slow(later + 6 * MS), ["a:1"]);
        assert_eq!(first(&mut t, &["a:1", "b:1"], later + 7 * MS), "b:1");
        // A sole replica is read whatever its state, and is the probe.
        let end = later + 6 * MS + 1000 * MS;
        assert_eq!(first(&mut t, &["a:1"], end), "a:1");
        assert_eq!(first(&mut t, &["a:1", "b:1"], end), "b:1");
    }

    #[test]
    fn order_puts_skipped_peers_last_and_keeps_the_rest() {
        let mut t = table();
        let now = Instant::now();
        let mut v = vec![at("a:1"), at("b:1"), at("a:1"), at("c:1")];
        t.order(&mut v, now);
        assert_eq!(endpoints(&v), ["a:1", "b:1", "a:1", "c:1"], "none slow");
        t.mark_slow("a:1", now);
        t.order(&mut v, now);
        assert_eq!(endpoints(&v), ["b:1", "c:1", "a:1", "a:1"]);
        let mut only = vec![at("a:1")];
        t.order(&mut only, now);
        assert_eq!(endpoints(&only), ["a:1"], "still read when alone");
        // Past the hold the replica keeps its place: this read probes.
        let mut v = vec![at("a:1"), at("b:1")];
        t.order(&mut v, now + 1000 * MS);
        assert_eq!(endpoints(&v), ["a:1", "b:1"]);
    }
}
