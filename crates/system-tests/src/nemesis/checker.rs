//! What the nemesis asserts, as pure logic over what the load saw: no
//! processes, no clock.
//!
//! Keys are unique (each is put at most once) and a key's value is derived
//! from the key itself ([`value_of`]), so every read is checked, not only
//! the final ones. A put or remove is *acknowledged* when its call
//! answered success; any error (refused, timed out, connection lost)
//! leaves its outcome unknown: the write may or may not have happened.

use std::collections::HashMap;

/// The value every put of `key` writes: 512 B to 8 KiB, length and bytes
/// derived from the key, so that a read can be checked without a ledger
/// and a value read under the wrong key differs.
pub fn value_of(key: &str) -> Vec<u8> {
    // FNV-1a: a stable hash of the key, the same in every build.
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let len = 512 + (h % (7 * 1024 + 512)) as usize;
    let mut x = h | 1;
    (0..len)
        .map(|_| {
            // xorshift64: cheap bytes that depend on every bit of the key.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// How a call ended, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Acked,
    /// An error: the call may or may not have taken effect.
    Unknown,
}

/// What was done to one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyOps {
    pub put: Option<Outcome>,
    pub remove: Option<Outcome>,
}

/// What the final read of a key must find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// An acknowledged put, nothing removed it: its value, byte-exact.
    Value,
    /// An acknowledged remove: absent.
    Absent,
    /// Unknown outcomes: absent, or present with its value byte-exact.
    Either,
}

impl KeyOps {
    pub fn expect(&self) -> Expect {
        match (self.put, self.remove) {
            (_, Some(Outcome::Acked)) => Expect::Absent,
            (Some(Outcome::Acked), None) => Expect::Value,
            _ => Expect::Either,
        }
    }
}

/// The final read of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Bytes(Vec<u8>),
    Absent,
}

/// A broken promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// An acknowledged put is gone.
    Lost,
    /// Bytes that differ from what was put for the key.
    Wrong,
    /// An acknowledged remove came back.
    Back,
}

/// Judges the final read of `key` against what was done to it.
pub fn judge(key: &str, ops: &KeyOps, found: &Found) -> Option<Violation> {
    match (ops.expect(), found) {
        (_, Found::Bytes(b)) if *b != value_of(key) => Some(Violation::Wrong),
        (Expect::Value, Found::Absent) => Some(Violation::Lost),
        (Expect::Absent, Found::Bytes(_)) => Some(Violation::Back),
        _ => None,
    }
}

/// What one load task saw, key by key.
#[derive(Debug, Default)]
pub struct History {
    pub keys: HashMap<String, KeyOps>,
    /// Reads during the run that returned bytes other than the key's value.
    pub wrong_reads: Vec<String>,
    /// Acknowledged puts, never removed, that a remove found absent.
    pub vanished: Vec<String>,
    pub acked_puts: u64,
    pub acked_removes: u64,
    pub good_reads: u64,
}

impl History {
    pub fn put(&mut self, key: &str, outcome: Outcome) {
        self.keys.entry(key.to_string()).or_default().put = Some(outcome);
        self.acked_puts += u64::from(outcome == Outcome::Acked);
    }

    pub fn remove(&mut self, key: &str, outcome: Outcome) {
        let ops = self.keys.entry(key.to_string()).or_default();
        // An acknowledged remove stays the strongest fact about the key.
        if ops.remove != Some(Outcome::Acked) {
            ops.remove = Some(outcome);
        }
        self.acked_removes += u64::from(outcome == Outcome::Acked);
    }

    /// A remove answered that `key` does not exist: nothing to assert
    /// later, but an acknowledged put nobody removed is gone.
    pub fn remove_found_absent(&mut self, key: &str) {
        let ops = self.keys.entry(key.to_string()).or_default();
        if ops.expect() == Expect::Value {
            self.vanished.push(key.to_string());
        }
        if ops.remove != Some(Outcome::Acked) {
            ops.remove = Some(Outcome::Unknown);
        }
    }

    /// A read during the run returned `got`: returns whether it is right.
    pub fn read(&mut self, key: &str, got: &[u8]) -> bool {
        let right = got == value_of(key).as_slice();
        if right {
            self.good_reads += 1;
        } else {
            self.wrong_reads.push(key.to_string());
        }
        right
    }

    /// Adds `other`'s keys (disjoint key spaces) and counts.
    pub fn merge(&mut self, other: History) {
        self.keys.extend(other.keys);
        self.wrong_reads.extend(other.wrong_reads);
        self.vanished.extend(other.vanished);
        self.acked_puts += other.acked_puts;
        self.acked_removes += other.acked_removes;
        self.good_reads += other.good_reads;
    }
}

/// The tally of the final check.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    pub checked: u64,
    pub lost: Vec<String>,
    pub wrong: Vec<String>,
    pub back: Vec<String>,
}

impl Tally {
    pub fn add(&mut self, key: &str, v: Option<Violation>) {
        self.checked += 1;
        match v {
            None => {}
            Some(Violation::Lost) => self.lost.push(key.to_string()),
            Some(Violation::Wrong) => self.wrong.push(key.to_string()),
            Some(Violation::Back) => self.back.push(key.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(put: Option<Outcome>, remove: Option<Outcome>) -> KeyOps {
        KeyOps { put, remove }
    }

    #[test]
    fn values_are_derived_from_the_key_alone() {
        assert_eq!(value_of("a-1"), value_of("a-1"));
        assert_ne!(value_of("a-1"), value_of("a-2"));
        for i in 0..200 {
            let n = value_of(&format!("k{i}")).len();
            assert!((512..=8 * 1024).contains(&n), "{n}");
        }
        // Not a constant fill: a value read at a shifted offset differs.
        let v = value_of("x");
        assert_ne!(v[..100], v[1..101]);
    }

    #[test]
    fn an_acknowledged_put_must_read_back_exactly() {
        let o = ops(Some(Outcome::Acked), None);
        assert_eq!(judge("k", &o, &Found::Bytes(value_of("k"))), None);
        assert_eq!(judge("k", &o, &Found::Absent), Some(Violation::Lost));
        let mut other = value_of("k");
        other[7] ^= 1;
        assert_eq!(judge("k", &o, &Found::Bytes(other)), Some(Violation::Wrong));
        assert_eq!(
            judge("k", &o, &Found::Bytes(value_of("j"))),
            Some(Violation::Wrong)
        );
    }

    #[test]
    fn an_acknowledged_remove_must_stay_removed() {
        for put in [Some(Outcome::Acked), Some(Outcome::Unknown), None] {
            let o = ops(put, Some(Outcome::Acked));
            assert_eq!(judge("k", &o, &Found::Absent), None);
            assert_eq!(
                judge("k", &o, &Found::Bytes(value_of("k"))),
                Some(Violation::Back)
            );
        }
    }

    #[test]
    fn unknown_outcomes_allow_either_but_never_wrong_bytes() {
        for o in [
            ops(Some(Outcome::Unknown), None),
            ops(Some(Outcome::Acked), Some(Outcome::Unknown)),
            ops(Some(Outcome::Unknown), Some(Outcome::Unknown)),
        ] {
            assert_eq!(o.expect(), Expect::Either);
            assert_eq!(judge("k", &o, &Found::Absent), None);
            assert_eq!(judge("k", &o, &Found::Bytes(value_of("k"))), None);
            assert_eq!(
                judge("k", &o, &Found::Bytes(vec![0; 600])),
                Some(Violation::Wrong)
            );
        }
    }

    #[test]
    fn a_later_unknown_remove_does_not_hide_an_acknowledged_one() {
        let mut h = History::default();
        h.put("k", Outcome::Acked);
        h.remove("k", Outcome::Acked);
        h.remove("k", Outcome::Unknown);
        assert_eq!(h.keys["k"].expect(), Expect::Absent);
        assert_eq!((h.acked_puts, h.acked_removes), (1, 1));
    }

    #[test]
    fn a_remove_that_finds_an_acknowledged_put_absent_counts_it_vanished() {
        let mut h = History::default();
        h.put("a", Outcome::Acked);
        h.put("u", Outcome::Unknown);
        h.remove_found_absent("a");
        h.remove_found_absent("u");
        assert_eq!(h.vanished, vec!["a".to_string()]);
        // Neither is asserted at the end: the loss is already counted.
        assert_eq!(h.keys["a"].expect(), Expect::Either);
        assert_eq!(h.keys["u"].expect(), Expect::Either);
    }

    #[test]
    fn reads_during_the_run_are_checked_and_histories_merge() {
        let mut a = History::default();
        assert!(a.read("k", &value_of("k")));
        assert!(!a.read("k", &value_of("j")));
        a.put("k", Outcome::Acked);
        let mut b = History::default();
        b.put("j", Outcome::Unknown);
        a.merge(b);
        assert_eq!(a.wrong_reads, vec!["k".to_string()]);
        assert_eq!((a.good_reads, a.acked_puts, a.keys.len()), (1, 1, 2));

        let mut t = Tally::default();
        t.add("a", None);
        t.add("b", Some(Violation::Lost));
        t.add("c", Some(Violation::Back));
        assert_eq!(t.checked, 3);
        assert_eq!((t.lost.len(), t.wrong.len(), t.back.len()), (1, 0, 1));
    }
}
