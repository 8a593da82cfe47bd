//! Retired space: replica ranges that left their object but may still be
//! read (a reader's lease) or written (a slow writer of a discarded put).
//! Each is freed at its `free_at` time.

use parking_lot::Mutex;

use super::allocator::aligned_len;
use super::segments::Placement;

/// Space that may still be in use until `free_at`.
struct Retired {
    free_at: u64,
    placement: Placement,
    size: u64,
    /// Staging space of a discarded put (not a reader's lease).
    staging: bool,
    /// The first range of that put, so each put is counted once.
    first_of_put: bool,
}

#[derive(Default)]
pub(crate) struct RetiredSpace {
    ranges: Mutex<Vec<Retired>>,
}

impl RetiredSpace {
    /// Forgets every retired range (its segments are forgotten too).
    pub(crate) fn clear(&self) {
        self.ranges.lock().clear();
    }

    /// Keeps `size` bytes at each of `placements` allocated until `free_at`.
    pub(crate) fn retire(&self, placements: &[Placement], size: u64, free_at: u64) {
        self.push(placements, size, free_at, false);
    }

    /// Keeps a discarded put's staging space until `free_at` (a slow
    /// writer may still be writing into it).
    pub(crate) fn retire_staging(&self, placements: &[Placement], size: u64, free_at: u64) {
        self.push(placements, size, free_at, true);
    }

    fn push(&self, placements: &[Placement], size: u64, free_at: u64, staging: bool) {
        let mut ranges = self.ranges.lock();
        for (i, p) in placements.iter().enumerate() {
            ranges.push(Retired {
                free_at,
                placement: p.clone(),
                size,
                staging,
                first_of_put: staging && i == 0,
            });
        }
    }

    /// Whether some range is due at `now`.
    pub(crate) fn any_due(&self, now: u64) -> bool {
        self.ranges.lock().iter().any(|r| r.free_at <= now)
    }

    /// Frees every range due at `now`; returns how many, and how many
    /// discarded puts had their staging space released.
    pub(crate) fn free_due(&self, now: u64) -> (usize, usize) {
        let due: Vec<Retired> = {
            let mut ranges = self.ranges.lock();
            let (due, keep) = std::mem::take(&mut *ranges)
                .into_iter()
                .partition(|r| r.free_at <= now);
            *ranges = keep;
            due
        };
        for r in &due {
            r.placement.segment.free(r.placement.offset, r.size);
        }
        let puts = due.iter().filter(|r| r.first_of_put).count();
        (due.len(), puts)
    }

    /// Every range waiting: (placement, size, free_at), or `None` while
    /// the list is busy.
    pub(crate) fn try_export(&self) -> Option<Vec<(Placement, u64, u64)>> {
        let ranges = self.ranges.try_lock()?;
        let v = ranges.iter();
        Some(
            v.map(|r| (r.placement.clone(), r.size, r.free_at))
                .collect(),
        )
    }

    /// Allocated bytes waiting here (on mounted segments).
    pub(crate) fn bytes(&self) -> u64 {
        let ranges = self.ranges.lock();
        let live = ranges.iter().filter(|r| r.placement.segment.is_mounted());
        live.map(|r| aligned_len(r.size).unwrap_or(r.size)).sum()
    }

    /// Bytes of discarded puts' staging space not yet released.
    pub(crate) fn staging_bytes(&self) -> u64 {
        let ranges = self.ranges.lock();
        let staging = ranges.iter().filter(|r| r.staging);
        staging.map(|r| aligned_len(r.size).unwrap_or(r.size)).sum()
    }
}
