//! Promotions that could not be queued when their object was read (memory
//! at the eviction watermark) and are retried later, as the reference's
//! promotion candidates are: first after 10 ms, then backing off by
//! doubling up to 1 s; given up after 8 retries or a minute without a read.
//! A new read of the key starts its retries over. The most read keys are
//! retried first (the reference scans its shards in order; reads are the
//! heat a promotion is for). Volatile: a new leader starts without any, as
//! the reference's reload does.
//!
//! Also the pace at which queued promotions are handed to their owners
//! ([`Pacer`]).
//!
//! Pure: the caller passes the clock (ms).

use std::collections::HashMap;
use std::hash::Hash;

/// At most this many keys wait for a retry; more are dropped.
pub(crate) const CANDIDATE_LIMIT: usize = 50_000;
pub(crate) const MAX_RETRIES: u32 = 8;
pub(crate) const CANDIDATE_TTL_MS: u64 = 60_000;
const INITIAL_BACKOFF_MS: u64 = 10;
const MAX_BACKOFF_MS: u64 = 1_000;

#[derive(Debug, Clone, Copy)]
struct Candidate {
    reads: u32,
    last_seen: u64,
    retry_at: u64,
    retries: u32,
}

#[derive(Default)]
pub(crate) struct Candidates {
    by_key: HashMap<Box<str>, Candidate>,
}

/// The wait before retry number `retries` (1-based).
fn backoff_ms(retries: u32) -> u64 {
    let doublings = retries.saturating_sub(1).min(16);
    (INITIAL_BACKOFF_MS << doublings).min(MAX_BACKOFF_MS)
}

impl Candidates {
    /// `key` was read and could not be queued: due at once, its retries
    /// start over. False when the limit is reached.
    pub(crate) fn record(&mut self, key: &str, now: u64) -> bool {
        if let Some(c) = self.by_key.get_mut(key) {
            *c = Candidate {
                reads: c.reads.saturating_add(1),
                last_seen: now,
                retry_at: now,
                retries: 0,
            };
            return true;
        }
        self.insert(key, 1, now, now)
    }

    /// `key`, read `reads` times, was queued but memory had no room when
    /// its promotion was to start: it waits a backoff like a failed retry.
    pub(crate) fn defer(&mut self, key: &str, reads: u32, now: u64) -> bool {
        if let Some(c) = self.by_key.get_mut(key) {
            c.reads = c.reads.max(reads);
            self.back_off(key, now);
            return true;
        }
        let ok = self.insert(key, reads, now, now);
        self.back_off(key, now);
        ok
    }

    fn insert(&mut self, key: &str, reads: u32, last_seen: u64, retry_at: u64) -> bool {
        if self.by_key.len() >= CANDIDATE_LIMIT {
            return false;
        }
        let c = Candidate {
            reads,
            last_seen,
            retry_at,
            retries: 0,
        };
        self.by_key.insert(key.into(), c);
        true
    }

    /// Up to `max` keys due at `now`, the most read first, then the
    /// longest waiting; keys past their last retry or their TTL are
    /// dropped on the way.
    pub(crate) fn due(&mut self, now: u64, max: usize) -> Vec<String> {
        self.by_key.retain(|_, c| {
            c.retries < MAX_RETRIES && now.saturating_sub(c.last_seen) < CANDIDATE_TTL_MS
        });
        let mut due: Vec<(std::cmp::Reverse<u32>, u64, &str)> = self
            .by_key
            .iter()
            .filter(|(_, c)| c.retry_at <= now)
            .map(|(k, c)| (std::cmp::Reverse(c.reads), c.retry_at, k.as_ref()))
            .collect();
        due.sort_unstable();
        due.into_iter()
            .take(max)
            .map(|(_, _, k)| k.to_owned())
            .collect()
    }

    /// A retry of `key` failed again for a passing reason: it waits
    /// longer, or is given up.
    pub(crate) fn back_off(&mut self, key: &str, now: u64) {
        let Some(c) = self.by_key.get_mut(key) else {
            return;
        };
        c.retries += 1;
        if c.retries >= MAX_RETRIES || now.saturating_sub(c.last_seen) >= CANDIDATE_TTL_MS {
            self.by_key.remove(key);
        } else {
            c.retry_at = now.saturating_add(backoff_ms(c.retries));
        }
    }

    /// `key` was queued, or needs no promotion any more.
    pub(crate) fn remove(&mut self, key: &str) {
        self.by_key.remove(key);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(crate) fn clear(&mut self) {
        self.by_key.clear();
    }
}

/// Hands each tier owner at most its round's promotions per round, as the
/// reference's owner pulls them once per offload heartbeat (ours polls far
/// more often): a poll that takes some starts the owner's next round
/// `round_ms` later,
/// and a poll before then gets none (they stay queued, and reads keep
/// being served from the disk copy). An owner with nothing handed out
/// for a round gets its next promotion at once. Each owner's round is the
/// one its poll names (its offload heartbeat). Volatile, and needs nothing
/// from the log: every poll carries its round, so after a failover the
/// new leader paces an owner by its own round from its first poll.
pub(crate) struct Pacer<K> {
    next_round: HashMap<K, u64>,
}

impl<K> Default for Pacer<K> {
    fn default() -> Self {
        Pacer {
            next_round: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Copy> Pacer<K> {
    /// How many promotions `owner` may take at `now`: `per_round`, or
    /// none before its next round.
    pub(crate) fn allowance(&self, owner: K, now: u64, per_round: usize) -> usize {
        match self.next_round.get(&owner) {
            Some(&at) if now < at => 0,
            _ => per_round,
        }
    }

    /// `owner` took `n` promotions at `now`.
    pub(crate) fn took(&mut self, owner: K, n: usize, now: u64, round_ms: u64) {
        if n > 0 {
            self.next_round.insert(owner, now.saturating_add(round_ms));
        }
    }

    pub(crate) fn forget(&mut self, owner: K) {
        self.next_round.remove(&owner);
    }

    pub(crate) fn clear(&mut self) {
        self.next_round.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUND: u64 = 10_000;

    #[test]
    fn the_first_promotion_goes_at_once_then_one_round_per_interval() {
        let mut p = Pacer::default();
        assert_eq!(p.allowance(1, 5, 1), 1);
        p.took(1, 1, 5, ROUND);
        assert_eq!(p.allowance(1, 6, 1), 0, "polled again at once");
        assert_eq!(p.allowance(1, ROUND + 4, 1), 0);
        assert_eq!(p.allowance(1, ROUND + 5, 1), 1);
        p.took(1, 1, ROUND + 7, ROUND);
        assert_eq!(p.allowance(1, 2 * ROUND + 6, 1), 0);
        assert_eq!(p.allowance(1, 2 * ROUND + 7, 1), 1);
    }

    #[test]
    fn a_round_hands_out_up_to_its_size_and_owners_are_paced_apart() {
        let mut p = Pacer::default();
        assert_eq!(p.allowance(1, 0, 4), 4);
        p.took(1, 3, 0, 100);
        assert_eq!(p.allowance(1, 50, 4), 0);
        assert_eq!(p.allowance(2, 50, 4), 4, "another owner has its own rounds");
        p.took(2, 1, 50, 100);
        assert_eq!(p.allowance(1, 100, 4), 4);
        assert_eq!(p.allowance(2, 100, 4), 0);
    }

    #[test]
    fn each_owner_is_paced_by_its_own_round() {
        let mut p = Pacer::default();
        p.took(1, 1, 0, 1_000);
        p.took(2, 1, 0, ROUND);
        assert_eq!(p.allowance(1, 999, 1), 0);
        assert_eq!(p.allowance(1, 1_000, 1), 1, "one round of its own 1 s");
        assert_eq!(p.allowance(2, 1_000, 1), 0, "the other keeps its 10 s");
        assert_eq!(p.allowance(2, ROUND, 1), 1);
    }

    #[test]
    fn a_poll_that_took_nothing_starts_no_round() {
        let mut p = Pacer::default();
        p.took(1, 0, 0, 100);
        assert_eq!(p.allowance(1, 1, 1), 1);
    }

    #[test]
    fn a_forgotten_owner_starts_afresh() {
        let mut p = Pacer::default();
        p.took(1, 1, 0, 100);
        p.took(2, 1, 0, 100);
        p.forget(1);
        assert_eq!(p.allowance(1, 1, 1), 1);
        assert_eq!(p.allowance(2, 1, 1), 0);
        p.clear();
        assert_eq!(p.allowance(2, 1, 1), 1);
    }

    #[test]
    fn backoff_doubles_from_10_ms_to_1_s() {
        let waits: Vec<u64> = (1..=9).map(backoff_ms).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
    }

    #[test]
    fn a_candidate_is_due_at_once_then_after_its_backoff() {
        let mut c = Candidates::default();
        assert!(c.record("k", 100));
        assert_eq!(c.due(100, 10), ["k"]);
        c.back_off("k", 100);
        assert!(c.due(109, 10).is_empty());
        assert_eq!(c.due(110, 10), ["k"]);
        c.back_off("k", 110);
        assert!(c.due(129, 10).is_empty());
        assert_eq!(c.due(130, 10), ["k"]);
    }

    #[test]
    fn a_candidate_is_given_up_after_eight_retries() {
        let mut c = Candidates::default();
        c.record("k", 0);
        let mut now = 0;
        for _ in 0..MAX_RETRIES {
            assert_eq!(c.due(now, 10), ["k"]);
            c.back_off("k", now);
            now += 1_000;
        }
        assert!(c.due(now, 10).is_empty());
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_new_read_starts_the_retries_over() {
        let mut c = Candidates::default();
        c.record("k", 0);
        for _ in 0..5 {
            c.back_off("k", 0);
        }
        assert!(c.due(100, 10).is_empty());
        c.record("k", 100);
        assert_eq!(c.due(100, 10), ["k"]);
    }

    #[test]
    fn a_candidate_not_read_for_a_minute_is_dropped() {
        let mut c = Candidates::default();
        c.record("k", 0);
        c.back_off("k", 0);
        assert!(c.due(CANDIDATE_TTL_MS, 10).is_empty());
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn the_most_read_come_first() {
        let mut c = Candidates::default();
        c.record("once", 0);
        c.record("twice", 1);
        c.record("twice", 2);
        assert!(c.defer("queued-and-read-3-times", 3, 0));
        assert_eq!(
            c.due(5, 10),
            ["twice", "once"],
            "the deferred one waits 10 ms"
        );
        assert_eq!(c.due(10, 10), ["queued-and-read-3-times", "twice", "once"]);
    }

    #[test]
    fn the_longest_waiting_come_first_and_at_most_max() {
        let mut c = Candidates::default();
        c.record("late", 5);
        c.record("early", 1);
        c.record("mid", 3);
        assert_eq!(c.due(10, 2), ["early", "mid"]);
    }

    #[test]
    fn the_limit_bounds_the_candidates() {
        let mut c = Candidates::default();
        for i in 0..CANDIDATE_LIMIT {
            assert!(c.record(&format!("k{i}"), 0));
        }
        assert!(!c.record("one-more", 0));
        assert!(c.record("k0", 1), "a known key is refreshed");
    }
}
