//! Per-shard counts of objects by standing (complete, in flight, hard or
//! soft pinned), kept as objects change so that `/metrics` reads them in
//! O(shards) instead of walking every object.
//!
//! Every change to an object passes through a place that knows its
//! standing before and after (`ObjectMap::update`, `ObjectMap::retain`,
//! `ObjectMap::restore` and the `ObjectMut` guard `Shard::get_mut` hands
//! out), and [`Tally::moved`] turns the difference into counts.
//!
//! A soft pin lapses with time, without any change to its object, so soft
//! pins are counted through their deadlines: `SoftPins` keeps the
//! deadlines later than the last time it was swept, and sweeping to `now`
//! drops the ones due. Each deadline is dropped at most once, so the cost
//! is amortised over the reads that set them.

use std::collections::BTreeMap;

use super::ObjectMeta;

/// What the counts see of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Standing {
    complete: bool,
    pending: bool,
    hard_pin: bool,
    /// The soft pin's deadline, when the object has one.
    soft_pin_until: Option<u64>,
}

impl Standing {
    pub(crate) fn of(obj: &ObjectMeta) -> Self {
        Standing {
            complete: obj.is_complete(),
            pending: obj.pending.is_some(),
            hard_pin: obj.is_hard_pinned(),
            soft_pin_until: obj.has_soft_pin().then_some(obj.soft_pin_until),
        }
    }
}

/// Objects by standing, summed over shards.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) complete: u64,
    pub(crate) pending: u64,
    pub(crate) hard_pinned: u64,
    pub(crate) soft_pinned: u64,
}

impl Counts {
    pub(crate) fn add(&mut self, other: Counts) {
        self.complete += other.complete;
        self.pending += other.pending;
        self.hard_pinned += other.hard_pinned;
        self.soft_pinned += other.soft_pinned;
    }

    /// The counts by walking `objects` (the reference the tally must match).
    #[cfg(test)]
    pub(crate) fn scan<'a>(objects: impl Iterator<Item = &'a ObjectMeta>, now: u64) -> Self {
        let mut c = Counts::default();
        for obj in objects {
            c.complete += u64::from(obj.is_complete());
            c.pending += u64::from(obj.pending.is_some());
            c.hard_pinned += u64::from(obj.is_hard_pinned());
            c.soft_pinned += u64::from(obj.is_soft_pinned(now));
        }
        c
    }
}

/// One shard's counts.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    complete: u64,
    pending: u64,
    hard_pinned: u64,
    soft: SoftPins,
}

impl Tally {
    /// An object went from `before` to `after` (`None`: not in the shard).
    pub(crate) fn moved(&mut self, before: Option<Standing>, after: Option<Standing>) {
        if before == after {
            return;
        }
        if let Some(s) = before {
            self.count(s, false);
        }
        if let Some(s) = after {
            self.count(s, true);
        }
    }

    fn count(&mut self, s: Standing, add: bool) {
        let step = |n: &mut u64, on: bool| {
            if on {
                *n = if add { *n + 1 } else { *n - 1 };
            }
        };
        step(&mut self.complete, s.complete);
        step(&mut self.pending, s.pending);
        step(&mut self.hard_pinned, s.hard_pin);
        if let Some(until) = s.soft_pin_until {
            if add {
                self.soft.insert(until);
            } else {
                self.soft.remove(until);
            }
        }
    }

    /// The counts at `now`. Soft pins are counted as of the latest time
    /// this shard was asked about, should `now` be older.
    pub(crate) fn counts(&mut self, now: u64) -> Counts {
        Counts {
            complete: self.complete,
            pending: self.pending,
            hard_pinned: self.hard_pinned,
            soft_pinned: self.soft.live(now),
        }
    }
}

/// Soft-pin deadlines later than `swept_through`, as a multiset.
#[derive(Debug, Default)]
struct SoftPins {
    deadlines: BTreeMap<u64, u32>,
    /// How many deadlines `deadlines` holds.
    live: u64,
    /// Every deadline at or before this has lapsed and left `deadlines`.
    swept_through: u64,
}

impl SoftPins {
    fn insert(&mut self, until: u64) {
        if until > self.swept_through {
            *self.deadlines.entry(until).or_default() += 1;
            self.live += 1;
        }
    }

    fn remove(&mut self, until: u64) {
        if until <= self.swept_through {
            return; // lapsed and swept already
        }
        let n = self
            .deadlines
            .get_mut(&until)
            .expect("a deadline later than the sweep is held");
        *n -= 1;
        if *n == 0 {
            self.deadlines.remove(&until);
        }
        self.live -= 1;
    }

    /// Drops the deadlines due at `now`; how many pins are left.
    fn live(&mut self, now: u64) -> u64 {
        if now > self.swept_through {
            while let Some(entry) = self.deadlines.first_entry() {
                if *entry.key() > now {
                    break;
                }
                self.live -= u64::from(entry.remove());
            }
            self.swept_through = now;
        }
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soft(until: u64) -> Standing {
        Standing {
            complete: true,
            pending: false,
            hard_pin: false,
            soft_pin_until: Some(until),
        }
    }

    #[test]
    fn soft_pins_lapse_and_refresh() {
        let mut t = Tally::default();
        t.moved(None, Some(soft(100)));
        t.moved(None, Some(soft(100)));
        t.moved(None, Some(soft(200)));
        assert_eq!(t.counts(50).soft_pinned, 3);
        assert_eq!(t.counts(100).soft_pinned, 1);
        // A lapsed pin refreshed (a read), and one removed after lapsing.
        t.moved(Some(soft(100)), Some(soft(300)));
        t.moved(Some(soft(100)), None);
        assert_eq!(t.counts(150).soft_pinned, 2);
        // A refresh before the deadline moves it.
        t.moved(Some(soft(200)), Some(soft(400)));
        assert_eq!(t.counts(350).soft_pinned, 1);
        assert_eq!(t.counts(400).soft_pinned, 0);
        assert_eq!(t.counts(0).complete, 2);
    }
}
