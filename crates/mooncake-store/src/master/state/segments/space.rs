//! A segment's space, and the part of it a replicated leader reserved
//! ahead of its puts (the fence that lets a PutStart answer before its
//! entry is committed).
//!
//! A new leader must never hand out space a writer of the old term may
//! still be writing. A leader that answers a PutStart before the entry is
//! committed (its PutEnd waits for both) therefore allocates it only in
//! *reserved* space: ranges a committed `Reserve` entry took out of the
//! segment's free space. Every master that holds that entry counts the
//! range as taken, so a new leader cannot allocate there. Whatever
//! reserved space it finds at takeover it retires for the put release
//! timeout (the time a writer of a discarded put is given), then frees.
//!
//! [`Space`] is the pure bookkeeping: `main` is the segment's allocator,
//! in which reserved ranges count as allocated; `reserved` holds the
//! reserved ranges no object has taken yet as its free ranges. An object
//! carved out of reserved space stays allocated in `main` and leaves
//! `reserved`, so freeing it later is a plain free in `main`.

use std::sync::Arc;

use super::Segment;
use crate::master::state::allocator::{BadFree, OffsetAllocator};

/// The allocators of one segment.
#[derive(Debug)]
pub(crate) struct Space {
    main: OffsetAllocator,
    /// Free ranges: reserved space not yet carved.
    reserved: OffsetAllocator,
    /// Log position of the latest reservation (leader).
    reserved_at: u64,
}

impl Space {
    pub(crate) fn new(capacity: u64) -> Space {
        let main = OffsetAllocator::new(capacity);
        let mut reserved = OffsetAllocator::new(main.capacity());
        if reserved.capacity() > 0 {
            reserved
                .reserve(0, reserved.capacity())
                .expect("a new allocator is all free");
        }
        Space {
            main,
            reserved,
            reserved_at: 0,
        }
    }

    /// Bytes held by objects (reserved space not carved counts as free).
    pub(crate) fn used(&self) -> u64 {
        self.main.used() - self.reserved_free()
    }

    fn reserved_free(&self) -> u64 {
        self.reserved.capacity() - self.reserved.used()
    }

    /// Allocates outside reserved space.
    pub(crate) fn allocate(&mut self, size: u64) -> Option<u64> {
        self.main.allocate(size)
    }

    /// Allocates inside reserved space.
    pub(crate) fn carve(&mut self, size: u64) -> Option<u64> {
        self.reserved.allocate(size)
    }

    /// Reserves `len` more bytes (leader); returns where.
    pub(crate) fn grow(&mut self, len: u64) -> Option<u64> {
        let offset = self.main.allocate(len)?;
        self.reserved
            .free(offset, len)
            .expect("space just taken from main is not reserved");
        Some(offset)
    }

    /// Reserves exactly `[offset, offset + len)`, as a log or snapshot
    /// says; false when it is not free.
    pub(crate) fn add_reserved(&mut self, offset: u64, len: u64) -> bool {
        if self.main.reserve(offset, len).is_err() {
            return false;
        }
        self.reserved
            .free(offset, len)
            .expect("space just taken from main is not reserved");
        true
    }

    /// Takes `[offset, offset + len)` out of reserved space (it stays
    /// allocated in `main`); false when it is not wholly reserved and free.
    pub(crate) fn take_reserved(&mut self, offset: u64, len: u64) -> bool {
        self.reserved.reserve(offset, len).is_ok()
    }

    /// Takes exactly `[offset, offset + size)` for an object, as a log or
    /// snapshot says: in reserved space if it lies there, else in `main`.
    pub(crate) fn reserve(&mut self, offset: u64, size: u64) -> Result<(), BadFree> {
        if self.reserved.reserve(offset, size).is_ok() {
            return Ok(());
        }
        self.main.reserve(offset, size)
    }

    /// Takes every `(offset, size)` of `ranges` for objects at once (a
    /// restored snapshot's, whose objects come before its reserved space):
    /// in one pass while no reserved space is free, else `reserve` on each
    /// (which stops at the first range not free, the others taken).
    pub(crate) fn reserve_all(&mut self, ranges: &mut [(u64, u64)]) -> Result<(), BadFree> {
        if self.reserved_free() == 0 {
            return self.main.reserve_all(ranges);
        }
        for &(offset, size) in ranges.iter() {
            self.reserve(offset, size)?;
        }
        Ok(())
    }

    /// Gives an object's range back.
    pub(crate) fn free(&mut self, offset: u64, size: u64) -> Result<(), BadFree> {
        self.main.free(offset, size)
    }

    /// The reserved ranges no object has taken, by offset.
    pub(crate) fn reserved_ranges(&self) -> Vec<(u64, u64)> {
        self.reserved.free_list().collect()
    }

    pub(crate) fn reserved_at(&self) -> u64 {
        self.reserved_at
    }

    pub(crate) fn set_reserved_at(&mut self, seq: u64) {
        self.reserved_at = self.reserved_at.max(seq);
    }
}

/// How a leader's allocation records reserved space (the service's log).
pub(crate) trait Reserving {
    /// `[offset, offset + len)` of `segment` was reserved; returns the log
    /// position of the record. Called under the segment's allocator lock,
    /// so that no carve from the range is logged before it.
    fn reserved(&mut self, segment: &Segment, offset: u64, len: u64) -> u64;
}

/// Where a replica went and whether in reserved space.
pub(crate) struct Carved {
    pub(crate) offset: u64,
    /// Log position of the reservation it lies in (`None`: outside).
    pub(crate) reserved_at: Option<u64>,
}

/// How much a leader reserves at a time on a segment of `capacity` bytes.
pub(crate) fn region(capacity: u64) -> u64 {
    (capacity / 64).clamp(64 << 10, 16 << 20).min(capacity / 4)
}

impl Segment {
    /// Allocates `size` bytes for a put (leader with the fence): in
    /// reserved space, reserving a region first when none fits; outside
    /// it when the size exceeds a region or no region is free.
    pub(crate) fn carve(&self, size: u64, log: &mut dyn Reserving) -> Option<Carved> {
        let mut space = self.space.lock();
        if !self.takes_new() {
            return None;
        }
        let mut carved = space.carve(size);
        if carved.is_none() && size <= region(self.capacity()) {
            if let Some(at) = space.grow(region(self.capacity())) {
                let seq = log.reserved(self, at, region(self.capacity()));
                space.set_reserved_at(seq);
                carved = space.carve(size);
            }
        }
        let out = match carved {
            Some(offset) => Some(Carved {
                offset,
                reserved_at: Some(space.reserved_at()),
            }),
            None => space.allocate(size).map(|offset| Carved {
                offset,
                reserved_at: None,
            }),
        };
        self.note_used(&space);
        out
    }

    /// Reserves exactly `[offset, offset + len)` (a log or snapshot says
    /// so); false when not free or unmounted.
    pub(crate) fn add_reserved(&self, offset: u64, len: u64) -> bool {
        let mut space = self.space.lock();
        let ok = self.is_mounted() && space.add_reserved(offset, len);
        self.note_used(&space);
        ok
    }

    /// Takes every `(offset, size)` of `ranges` for objects (`Space::reserve_all`);
    /// the first range not free when one is not (or unmounted).
    pub(crate) fn reserve_all(&self, ranges: &mut [(u64, u64)]) -> Result<(), BadFree> {
        let mut space = self.space.lock();
        if !self.is_mounted() {
            return match ranges.first() {
                Some(&(offset, len)) => Err(BadFree { offset, len }),
                None => Ok(()),
            };
        }
        let r = space.reserve_all(ranges);
        self.note_used(&space);
        r
    }

    /// Takes `[offset, offset + len)` out of reserved space, to be freed
    /// by the caller; false when not wholly reserved (or unmounted).
    pub(crate) fn take_reserved(&self, offset: u64, len: u64) -> bool {
        let mut space = self.space.lock();
        let ok = self.is_mounted() && space.take_reserved(offset, len);
        self.note_used(&space);
        ok
    }

    /// The reserved ranges no object has taken.
    pub(crate) fn reserved_ranges(&self) -> Vec<(u64, u64)> {
        self.space.lock().reserved_ranges()
    }

    /// [`Segment::reserved_ranges`], or `None` while the space is busy.
    pub(crate) fn try_reserved_ranges(&self) -> Option<Vec<(u64, u64)>> {
        self.space.try_lock().map(|s| s.reserved_ranges())
    }
}

/// Every segment's reserved ranges, as (segment, offset, len).
pub(crate) fn all_reserved(segments: &[Arc<Segment>]) -> Vec<(Arc<Segment>, u64, u64)> {
    let mut out = Vec::new();
    for s in segments {
        for (offset, len) in s.reserved_ranges() {
            out.push((s.clone(), offset, len));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carved_space_is_freed_to_main_and_counted_used() {
        let mut s = Space::new(1 << 20);
        let r = s.grow(64 << 10).unwrap();
        assert_eq!(s.used(), 0, "reserved space is not used");
        let a = s.carve(4096).unwrap();
        assert!(a >= r && a + 4096 <= r + (64 << 10));
        assert_eq!(s.used(), 4096);
        // Outside allocations never land in reserved space.
        for _ in 0..200 {
            let o = s.allocate(4096).unwrap();
            assert!(
                o + 4096 <= r || o >= r + (64 << 10),
                "{o} inside the region"
            );
        }
        s.free(a, 4096).unwrap();
        assert_eq!(s.used(), 200 * 4096);
        // The freed range went to main: not carved again.
        assert_ne!(s.carve(4096), Some(a));
    }

    #[test]
    fn a_replayed_log_takes_the_same_ranges() {
        let mut leader = Space::new(1 << 20);
        let mut standby = Space::new(1 << 20);
        let r = leader.grow(64 << 10).unwrap();
        let a = leader.carve(100).unwrap();
        let b = leader.carve(5000).unwrap();
        let c = leader.allocate(300).unwrap();
        assert!(standby.add_reserved(r, 64 << 10));
        // Replayed out of carve order (two keys, two shard locks).
        standby.reserve(b, 5000).unwrap();
        standby.reserve(a, 100).unwrap();
        standby.reserve(c, 300).unwrap();
        assert_eq!(leader.used(), standby.used());
        assert_eq!(leader.reserved_ranges(), standby.reserved_ranges());
        // A range taken twice is refused.
        assert!(standby.reserve(a, 100).is_err());
        assert!(!standby.add_reserved(r, 64 << 10));
    }

    #[test]
    fn reserved_space_taken_back_is_freed_by_its_taker() {
        let mut s = Space::new(1 << 20);
        let r = s.grow(64 << 10).unwrap();
        let a = s.carve(4096).unwrap();
        let rest = s.reserved_ranges();
        assert_eq!(rest.iter().map(|x| x.1).sum::<u64>(), (64 << 10) - 4096);
        for (o, len) in rest {
            assert!(s.take_reserved(o, len));
            assert!(!s.take_reserved(o, len));
            s.free(o, len).unwrap();
        }
        assert!(s.reserved_ranges().is_empty());
        assert_eq!(s.used(), 4096);
        s.free(a, 4096).unwrap();
        assert_eq!(s.used(), 0);
        // Everything is one free range again.
        assert_eq!(s.allocate(1 << 20), Some(0));
        let _ = r;
    }
}
