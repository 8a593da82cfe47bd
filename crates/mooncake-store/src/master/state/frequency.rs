//! Frequency-aware victim order (`--eviction_policy=frequency`, ours).
//!
//! On prefix-cache traces most blocks are put once and never read, while a
//! block read since its put tends to be read again. So beside its lease
//! time (plain LRU) an object's place counts its reads
//! since the put, up to [`MAX_READS`] (a byte in what was padding of
//! `ObjectMeta`): each read ranks it as if its last use came
//! [`Weight::per_read`] ms later. That bonus is half the age of the last
//! round's boundary (how long an unused object now lasts in memory), so it
//! follows the load with no knob to tune; the first round, with no
//! boundary yet, is plain LRU. `benchmarks/evict_sim.py` measures the
//! orders on the FAST'25 traces (docs/benchmarks.md).
//!
//! Reads, like leases, are volatile: a restored or replayed object starts
//! at none.

use std::sync::atomic::{AtomicU64, Ordering};

use super::objects::ObjectMeta;
use crate::master::config::policy::EvictionPolicy;

/// Reads counted per object; more say nothing new.
pub(crate) const MAX_READS: u8 = 3;

/// The share of the boundary's age one read is worth: 1 / this.
const SHARE: u64 = 2;

/// A read of `obj`: one more, up to [`MAX_READS`].
pub(crate) fn count_read(obj: &mut ObjectMeta) {
    obj.reads = obj.reads.saturating_add(1).min(MAX_READS);
}

/// What a read is worth in the order, carried from one round to the next.
#[derive(Default)]
pub(crate) struct Weight {
    per_read: AtomicU64,
}

impl Weight {
    /// The order of a round: uses counted from `epoch`
    /// ([`super::leases::uses_now`]), reads weighted as `policy` says.
    pub(crate) fn order(&self, policy: EvictionPolicy, epoch: u32) -> Order {
        match policy {
            EvictionPolicy::Lru => Order::lru(epoch),
            EvictionPolicy::Frequency => Order {
                epoch,
                per_read: self.per_read(),
            },
        }
    }

    /// Ms of later use one read is worth now.
    pub(crate) fn per_read(&self) -> u64 {
        self.per_read.load(Ordering::Relaxed)
    }

    /// A round at `now` evicted up to `boundary`: the next one weighs a
    /// read as half of how long ago that boundary was used.
    pub(crate) fn note_boundary(&self, now: u64, boundary: Rank) {
        let age = now.saturating_sub(boundary.0);
        self.per_read.store(age / SHARE, Ordering::Relaxed);
    }
}

/// An object's place in the victim order, smallest first: its lease time
/// (plus what its reads are worth), then its last use counted from the
/// round's epoch (`eviction::Rank` says why that is exact).
pub(crate) type Rank = (u64, i32);

/// One round's ranking of candidates, smallest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Order {
    epoch: u32,
    per_read: u64,
}

impl Order {
    /// Plain LRU: reads are worth nothing.
    pub(crate) fn lru(epoch: u32) -> Self {
        Order { epoch, per_read: 0 }
    }

    pub(crate) fn rank(&self, obj: &ObjectMeta) -> Rank {
        let bonus = self.per_read.saturating_mul(u64::from(obj.reads));
        (
            obj.lease_until.saturating_add(bonus),
            obj.used.wrapping_sub(self.epoch) as i32,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(lease_until: u64, used: u32, reads: u8) -> ObjectMeta {
        ObjectMeta {
            lease_until,
            used,
            reads,
            ..ObjectMeta::absent()
        }
    }

    #[test]
    fn reads_count_up_to_the_cap() {
        let mut o = obj(0, 0, 0);
        for want in [1, 2, 3, 3] {
            count_read(&mut o);
            assert_eq!(o.reads, want);
        }
    }

    #[test]
    fn lru_ignores_reads_and_keeps_the_exact_order() {
        let w = Weight::default();
        w.note_boundary(1_000, (0, 0));
        let o = w.order(EvictionPolicy::Lru, 7);
        let (read, unread) = (obj(100, 7, 3), obj(100, 8, 0));
        assert_eq!(o, Order::lru(7));
        assert_eq!(o.rank(&read), (100, 0));
        assert!(
            o.rank(&read) < o.rank(&unread),
            "same ms: the older use first"
        );
    }

    #[test]
    fn the_first_round_is_plain_lru() {
        let o = Weight::default().order(EvictionPolicy::Frequency, 0);
        assert!(o.rank(&obj(100, 0, 3)) < o.rank(&obj(101, 1, 0)));
    }

    #[test]
    fn a_read_is_worth_half_the_age_of_the_last_boundary() {
        let w = Weight::default();
        // The last round, at 10 s, evicted what was last used at 6 s.
        w.note_boundary(10_000, (6_000, 0));
        assert_eq!(w.per_read(), 2_000);
        let o = w.order(EvictionPolicy::Frequency, 0);
        let read_twice = obj(5_000, 0, 2);
        let unread = obj(8_000, 1, 0);
        let read_once = obj(7_500, 2, 1);
        assert_eq!(o.rank(&read_twice), (9_000, 0));
        assert_eq!(o.rank(&read_once), (9_500, 2));
        let mut c = [o.rank(&read_once), o.rank(&read_twice), o.rank(&unread)];
        c.sort_unstable();
        assert_eq!(
            c[0],
            o.rank(&unread),
            "the newest object, never read, goes before older ones read since"
        );
        // A boundary in the future (leases) weighs reads at nothing.
        w.note_boundary(10_000, (12_000, 0));
        assert_eq!(w.per_read(), 0);
        let o = w.order(EvictionPolicy::Frequency, 0);
        assert!(o.rank(&read_twice) < o.rank(&unread));
    }

    #[test]
    fn ties_after_the_bonus_still_go_by_use() {
        let w = Weight::default();
        w.note_boundary(2_000, (0, 0));
        let o = w.order(EvictionPolicy::Frequency, 10);
        // 1000 + 1000 ties with 2000: the one used earlier goes first.
        let (a, b) = (obj(1_000, 12, 1), obj(2_000, 11, 0));
        assert_eq!(o.rank(&a).0, o.rank(&b).0);
        assert!(o.rank(&b) < o.rank(&a));
    }
}
