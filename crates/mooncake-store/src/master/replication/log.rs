//! The replicated log in memory: every entry's frame (`oplog` codec) and
//! term, by sequence number. The leader appends what its state machine
//! applies; a standby appends what it receives, so that once promoted it
//! can bring later standbys up to date from the first entry.

/// One entry as the log keeps it.
#[derive(Debug, Clone)]
struct Kept {
    term: u64,
    frame: Box<[u8]>,
}

/// Entries `base + 1 ..= last`: `base` is 0 for a log kept from the
/// start, else the position of the snapshot the entries before were
/// compacted into (or a standby loaded).
#[derive(Debug, Default)]
pub(crate) struct Log {
    base: u64,
    base_term: u64,
    entries: Vec<Kept>,
    bytes: usize,
}

impl Log {
    /// Sequence number of the last entry (`base` when empty).
    pub(crate) fn last(&self) -> u64 {
        self.base + self.entries.len() as u64
    }

    /// The entry the log starts after.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Term of entry `seq`, for `seq` from `base` (entry 0 has term 0).
    pub(crate) fn term_at(&self, seq: u64) -> Option<u64> {
        if seq == self.base {
            return Some(self.base_term);
        }
        let i = seq.checked_sub(self.base + 1)?;
        self.entries.get(i as usize).map(|k| k.term)
    }

    /// Bytes of frames held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Appends entry `last() + 1`.
    pub(crate) fn push(&mut self, term: u64, frame: Vec<u8>) -> u64 {
        self.bytes += frame.len();
        self.entries.push(Kept {
            term,
            frame: frame.into_boxed_slice(),
        });
        self.last()
    }

    /// Drops every entry after `seq` (a standby's tail that its new leader
    /// may not have: never committed).
    pub(crate) fn truncate_after(&mut self, seq: u64) {
        let keep = (seq.saturating_sub(self.base) as usize).min(self.entries.len());
        for k in &self.entries[keep..] {
            self.bytes -= k.frame.len();
        }
        self.entries.truncate(keep);
    }

    /// Drops the entries up to `seq` (at most the last): a snapshot holds
    /// them. Returns how many went.
    pub(crate) fn compact_through(&mut self, seq: u64) -> u64 {
        let n = (seq.min(self.last()).saturating_sub(self.base)) as usize;
        if n == 0 {
            return 0;
        }
        self.base_term = self.entries[n - 1].term;
        self.base += n as u64;
        for k in self.entries.drain(..n) {
            self.bytes -= k.frame.len();
        }
        n as u64
    }

    /// Empties the log to start after entry `seq` of `term` (a standby
    /// that loaded the snapshot at `seq`).
    pub(crate) fn reset(&mut self, seq: u64, term: u64) {
        self.entries.clear();
        self.bytes = 0;
        self.base = seq;
        self.base_term = term;
    }

    /// Appends the frames of entries `after + 1 ..`, at most `max` of them
    /// and (past the first) at most `budget` bytes, to `out`; returns how
    /// many. `after` must be at least `base`.
    pub(crate) fn copy_after(
        &self,
        after: u64,
        max: usize,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> u64 {
        let start = (after.saturating_sub(self.base) as usize).min(self.entries.len());
        let mut n = 0;
        for k in self.entries[start..].iter().take(max) {
            if n > 0 && out.len() + k.frame.len() > budget {
                break;
            }
            out.extend_from_slice(&k.frame);
            n += 1;
        }
        n
    }

    /// The frame of entry `seq`.
    pub(crate) fn frame(&self, seq: u64) -> Option<&[u8]> {
        let i = seq.checked_sub(self.base + 1)?;
        self.entries.get(i as usize).map(|k| &*k.frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_read_truncate() {
        let mut l = Log::default();
        assert_eq!((l.last(), l.term_at(0), l.term_at(1)), (0, Some(0), None));
        assert_eq!(l.push(3, vec![1, 2]), 1);
        assert_eq!(l.push(3, vec![3]), 2);
        assert_eq!(l.push(4, vec![4, 5, 6]), 3);
        assert_eq!(
            (l.term_at(l.last()).unwrap(), l.term_at(2), l.bytes()),
            (4, Some(3), 6)
        );
        let mut out = Vec::new();
        assert_eq!(l.copy_after(1, 10, 1 << 20, &mut out), 2);
        assert_eq!(out, [3, 4, 5, 6]);
        out.clear();
        assert_eq!(l.copy_after(0, 2, 1 << 20, &mut out), 2);
        assert_eq!(out, [1, 2, 3]);
        out.clear();
        assert_eq!(l.copy_after(0, 10, 1, &mut out), 1, "the first always goes");
        out.clear();
        assert_eq!(l.copy_after(3, 10, 1 << 20, &mut out), 0);
        assert_eq!(l.copy_after(9, 10, 1 << 20, &mut out), 0);
        l.truncate_after(1);
        assert_eq!(
            (l.last(), l.bytes(), l.frame(1)),
            (1, 2, Some(&[1u8, 2][..]))
        );
        assert_eq!(l.frame(2), None);
        assert_eq!(l.frame(0), None);
    }

    #[test]
    fn compaction_keeps_positions_and_terms() {
        let mut l = Log::default();
        for (t, f) in [(1, vec![1]), (1, vec![2, 2]), (2, vec![3]), (2, vec![4])] {
            l.push(t, f);
        }
        assert_eq!(l.compact_through(2), 2);
        assert_eq!((l.base(), l.last(), l.bytes()), (2, 4, 2));
        assert_eq!(
            (l.term_at(2), l.term_at(1), l.term_at(3)),
            (Some(1), None, Some(2))
        );
        assert_eq!((l.frame(2), l.frame(3)), (None, Some(&[3u8][..])));
        let mut out = Vec::new();
        assert_eq!(l.copy_after(2, 10, 1 << 20, &mut out), 2);
        assert_eq!(out, [3, 4]);
        assert_eq!(l.compact_through(9), 2, "never past the last");
        assert_eq!(
            (l.base(), l.last(), l.term_at(l.last()).unwrap(), l.bytes()),
            (4, 4, 2, 0)
        );
        assert_eq!(l.push(3, vec![5]), 5);
        l.truncate_after(4);
        assert_eq!(l.last(), 4);
        l.reset(10, 7);
        assert_eq!(
            (
                l.base(),
                l.last(),
                l.term_at(l.last()).unwrap(),
                l.term_at(10)
            ),
            (10, 10, 7, Some(7))
        );
        assert_eq!(l.push(7, vec![1]), 11);
    }
}
