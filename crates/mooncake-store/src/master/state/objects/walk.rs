//! A snapshot round's walk over one shard's table (`cut::Round`).
//!
//! The round writes out the table's records as they stood at its cut
//! from the live table, slot by slot. A writer that is about to change,
//! remove or replace a record the round has not reached yet encodes that
//! record first (the snapshot's own form, `Spec::encode`) into the walk's
//! saved bytes, which the round writes out in its place. Preserving a
//! record costs its encoded bytes (about 60 for a short key), not a copy
//! of its chunk, and only until the round takes them.

use std::collections::HashSet;
use std::sync::Arc;

use super::super::segments::Segment;
use super::{ObjectMeta, PendingKind};

/// Appends an object's snapshot form to `out`.
pub(crate) type Encode = fn(&mut Vec<u8>, &str, &ObjectMeta);

/// What a round needs to know to write out records.
pub(crate) struct Spec {
    pub(crate) encode: Encode,
    /// The segments mounted at the cut, when an unmounted one may still be
    /// named by some object: the round then lists those it finds
    /// (`Walk::note`). `None`: none is.
    pub(crate) mounted: Option<HashSet<u32>>,
}

impl Spec {
    /// Adds to `found` the segments not mounted at the cut that `obj`'s
    /// replicas (written or being written) name.
    pub(crate) fn note(&self, obj: &ObjectMeta, found: &mut Vec<Arc<Segment>>) {
        let Some(mounted) = &self.mounted else { return };
        let pending = obj.pending.as_ref().map_or(&[][..], |p| match &p.kind {
            PendingKind::Replacing { replicas, .. } | PendingKind::Replicating { replicas, .. } => {
                replicas.as_slice()
            }
            PendingKind::Fresh | PendingKind::InPlace => &[],
        });
        for p in obj.replicas.as_slice().iter().chain(pending) {
            let id = p.segment.id;
            if !mounted.contains(&id) && !found.iter().any(|s| s.id == id) {
                found.push(p.segment.clone());
            }
        }
    }
}

/// One table's part of a round, from its cut until the round has
/// written the table out (or is dropped).
pub(crate) struct Walk {
    pub(crate) epoch: u64,
    pub(crate) spec: Arc<Spec>,
    /// Slots at or past `end` were not the cut's (chunks added since).
    pub(crate) end: u32,
    /// Slots below `next` are written out.
    pub(crate) next: u32,
    /// One bit per slot below `end`: settled before the round reached it
    /// (its record saved by a writer, or put there after the cut).
    settled: Vec<u64>,
    /// Objects the table held at the cut.
    pub(crate) count: u64,
    /// Records saved by writers, encoded, and how many, until the round
    /// takes them.
    pub(crate) saved: Vec<u8>,
    pub(crate) saved_n: u64,
    /// Segments not mounted at the cut that the saved records name.
    pub(crate) detached: Vec<Arc<Segment>>,
    /// Where a retained record's new form is encoded to compare.
    scratch: Vec<u8>,
}

impl Walk {
    pub(crate) fn new(epoch: u64, spec: Arc<Spec>, end: u32, count: u64) -> Walk {
        Walk {
            epoch,
            spec,
            end,
            next: 0,
            settled: vec![0; (end as usize).div_ceil(64)],
            count,
            saved: Vec::new(),
            saved_n: 0,
            detached: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Whether slot `s` still holds what it held at the cut and the round
    /// has yet to write it out.
    pub(crate) fn pending(&self, s: u32) -> bool {
        s >= self.next && s < self.end && self.settled[s as usize / 64] & (1 << (s % 64)) == 0
    }

    pub(crate) fn settle(&mut self, s: u32) {
        self.settled[s as usize / 64] |= 1 << (s % 64);
    }

    /// Saves `obj`, the record of pending slot `s`, before it changes.
    pub(crate) fn save(&mut self, s: u32, key: &str, obj: &ObjectMeta) {
        self.settle(s);
        (self.spec.encode)(&mut self.saved, key, obj);
        self.saved_n += 1;
        self.spec.note(obj, &mut self.detached);
    }

    /// Saves the record of pending slot `s` for a change that may leave
    /// it as it is; `kept` undoes that when it did (see `kept`). Returns
    /// where its bytes start.
    pub(crate) fn save_maybe(&mut self, key: &str, obj: &ObjectMeta) -> usize {
        let at = self.saved.len();
        (self.spec.encode)(&mut self.saved, key, obj);
        // The record is the cut's either way: noting it is right.
        self.spec.note(obj, &mut self.detached);
        at
    }

    /// After `save_maybe(key, ..)` returned `at`: the record of slot `s`
    /// is now `obj` (`None`: removed). Unchanged in the snapshot's form,
    /// it is left to the round; else it stays saved.
    pub(crate) fn kept(&mut self, s: u32, at: usize, key: &str, obj: Option<&ObjectMeta>) {
        if let Some(obj) = obj {
            self.scratch.clear();
            (self.spec.encode)(&mut self.scratch, key, obj);
            if self.scratch == self.saved[at..] {
                self.saved.truncate(at);
                return;
            }
        }
        self.settle(s);
        self.saved_n += 1;
    }
}
