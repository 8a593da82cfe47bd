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

/// Entries `first..=last`, with `first` = 1 for a log kept from the start.
#[derive(Debug, Default)]
pub(crate) struct Log {
    entries: Vec<Kept>,
    bytes: usize,
}

impl Log {
    /// Sequence number of the last entry (0 when empty).
    pub(crate) fn last(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Term of entry `seq`; entry 0 (before the first) has term 0.
    pub(crate) fn term_at(&self, seq: u64) -> Option<u64> {
        match seq {
            0 => Some(0),
            s => self.entries.get(s as usize - 1).map(|k| k.term),
        }
    }

    pub(crate) fn last_term(&self) -> u64 {
        self.entries.last().map_or(0, |k| k.term)
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
        let keep = (seq as usize).min(self.entries.len());
        for k in &self.entries[keep..] {
            self.bytes -= k.frame.len();
        }
        self.entries.truncate(keep);
    }

    /// Appends the frames of entries `after + 1 ..`, at most `max` of them
    /// and (past the first) at most `budget` bytes, to `out`; returns how
    /// many.
    pub(crate) fn copy_after(
        &self,
        after: u64,
        max: usize,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> u64 {
        let start = (after as usize).min(self.entries.len());
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
        let i = (seq as usize).checked_sub(1)?;
        self.entries.get(i).map(|k| &*k.frame)
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
        assert_eq!((l.last_term(), l.term_at(2), l.bytes()), (4, Some(3), 6));
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
}
