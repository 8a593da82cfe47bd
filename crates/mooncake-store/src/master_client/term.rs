//! HA mode: the election terms a master client has seen, and the term its
//! connections state.
//!
//! A client learns a term with every leader lookup (the coordination
//! service keeps it beside the leader's address). It keeps the highest
//! one, shared by its clones and every pooled connection, and never goes
//! back: a lookup naming an older term is a stale answer, not a leader.
//! Each new connection states the highest term in its handshake
//! (`LeaderTerm`), and the master answers a call on it only while it
//! leads that very term. A pooled connection that stated an older term
//! than the client has seen since is dropped rather than used again.

use std::sync::atomic::{AtomicU64, Ordering};

/// The highest term seen, shared by a client's connections.
///
/// Kept as `term + 1`, so that 0 is "none yet" and a term 0 stays
/// distinct from it; the same encoding is a connection's stamp
/// ([`stamp`](Self::stamp), kept as its tag).
#[derive(Debug, Default)]
pub(super) struct Terms(AtomicU64);

impl Terms {
    /// The highest term seen, if any.
    pub(super) fn highest(&self) -> Option<u64> {
        Self::term_of(self.0.load(Ordering::Acquire))
    }

    /// Learns `term`, found with the leader by a lookup. A term below the
    /// highest seen is refused (`Err` carries the highest): that lookup
    /// named a leader an election has since replaced.
    pub(super) fn learn(&self, term: u64) -> Result<(), u64> {
        let stamp = term.saturating_add(1);
        let before = self.0.fetch_max(stamp, Ordering::AcqRel);
        if stamp < before {
            return Err(before - 1);
        }
        Ok(())
    }

    /// What a new connection states now, as its stamp.
    pub(super) fn stamp(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Whether a connection stamped `stamp` still states the highest
    /// term seen (one stamped before a newer term was learned does not).
    pub(super) fn current(&self, stamp: u64) -> bool {
        stamp >= self.0.load(Ordering::Acquire)
    }

    /// The term a stamp stands for (`None`: none was stated).
    pub(super) fn term_of(stamp: u64) -> Option<u64> {
        stamp.checked_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_term_only_grows_and_older_lookups_are_refused() {
        let terms = Terms::default();
        assert_eq!(terms.highest(), None);
        assert_eq!(Terms::term_of(terms.stamp()), None);
        terms.learn(0).unwrap();
        assert_eq!(terms.highest(), Some(0), "term 0 is a term");
        terms.learn(5).unwrap();
        terms.learn(5).unwrap();
        assert_eq!(terms.highest(), Some(5));
        assert_eq!(terms.learn(3), Err(5), "a lookup of an older leader");
        assert_eq!(terms.highest(), Some(5), "never goes back");
        terms.learn(9).unwrap();
        assert_eq!(terms.highest(), Some(9));
    }

    #[test]
    fn connections_that_stated_an_older_term_go_out_of_date() {
        let terms = Terms::default();
        let unstated = terms.stamp();
        terms.learn(4).unwrap();
        assert!(!terms.current(unstated));
        let at_4 = terms.stamp();
        assert_eq!(Terms::term_of(at_4), Some(4));
        assert!(terms.current(at_4));
        assert!(terms.learn(2).is_err());
        assert!(terms.current(at_4), "a refused lookup changes nothing");
        terms.learn(6).unwrap();
        assert!(!terms.current(at_4), "a newer term was seen since");
        assert!(terms.current(terms.stamp()));
    }

    #[test]
    fn clones_sharing_the_terms_see_each_others_terms() {
        let terms = std::sync::Arc::new(Terms::default());
        let threads: Vec<_> = (1..=8u64)
            .map(|t| {
                let terms = terms.clone();
                std::thread::spawn(move || {
                    let _ = terms.learn(t * 10);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(terms.highest(), Some(80));
    }
}
