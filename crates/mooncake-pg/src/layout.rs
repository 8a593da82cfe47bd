//! Where things live in a rank's shared segment. Every word another
//! process waits on sits on its own cache line, so a rank bumping one word
//! does not disturb the readers of another.

/// Bytes between two control words (one cache line each).
pub const WORD_STRIDE: usize = 64;
const PAGE: usize = 4096;
/// Collective slots per segment: a round writes one while the peers may
/// still read the previous round's.
pub const SLOTS: usize = 2;
/// Collective control words per rank (see [`crate::Flag`]).
pub const FLAGS: usize = 5;
/// First bytes of every segment: "MCPGSEG1".
pub const MAGIC: u64 = u64::from_le_bytes(*b"MCPGSEG1");

/// The geometry of one rank's segment in a group of `world` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub world: usize,
    /// Bytes of one collective slot.
    pub slot_bytes: usize,
    /// Bytes of one outgoing mailbox ring (a power of two).
    pub ring_bytes: usize,
}

impl Layout {
    /// A layout, or why the sizes cannot make one.
    pub fn new(world: usize, slot_bytes: usize, ring_bytes: usize) -> Result<Layout, String> {
        if world == 0 {
            return Err("a group needs at least one rank".into());
        }
        if slot_bytes < PAGE || !slot_bytes.is_multiple_of(PAGE) {
            return Err(format!(
                "slot size {slot_bytes} must be a positive multiple of {PAGE}"
            ));
        }
        // Ring positions are u32 futex words that wrap: the ring must be
        // well under 2^31 bytes for the wrapping differences to be exact.
        if !ring_bytes.is_power_of_two() || !(PAGE..=1 << 30).contains(&ring_bytes) {
            return Err(format!(
                "mailbox size {ring_bytes} must be a power of two between {PAGE} and 1 GiB"
            ));
        }
        Ok(Layout {
            world,
            slot_bytes,
            ring_bytes,
        })
    }

    /// Offset of collective flag `flag` (0..FLAGS).
    pub fn flag(&self, flag: usize) -> usize {
        debug_assert!(flag < FLAGS);
        PAGE + flag * WORD_STRIDE
    }

    /// Offset of the bytes-written counter of the ring towards `peer`.
    pub fn tx_head(&self, peer: usize) -> usize {
        PAGE + (FLAGS + peer) * WORD_STRIDE
    }

    /// Offset of the bytes-consumed counter of the ring from `peer`.
    pub fn rx_tail(&self, peer: usize) -> usize {
        PAGE + (FLAGS + self.world + peer) * WORD_STRIDE
    }

    fn control_end(&self) -> usize {
        (PAGE + (FLAGS + 2 * self.world) * WORD_STRIDE).next_multiple_of(PAGE)
    }

    /// Offset of collective slot `slot` (0..SLOTS).
    pub fn slot(&self, slot: usize) -> usize {
        debug_assert!(slot < SLOTS);
        self.control_end() + slot * self.slot_bytes
    }

    /// Offset of the mailbox ring towards `peer`.
    pub fn ring(&self, peer: usize) -> usize {
        self.slot(0) + SLOTS * self.slot_bytes + peer * self.ring_bytes
    }

    /// Bytes of the whole segment.
    pub fn len(&self) -> usize {
        self.ring(self.world)
    }

    /// Never: a layout always has its header page.
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap_for_every_world() {
        for world in 1..=16 {
            let l = Layout::new(world, 1 << 20, 1 << 16).unwrap();
            let mut words: Vec<usize> = (0..FLAGS).map(|f| l.flag(f)).collect();
            for p in 0..world {
                words.push(l.tx_head(p));
                words.push(l.rx_tail(p));
            }
            let mut sorted = words.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), words.len(), "world {world}");
            assert!(sorted[0] >= 64, "header overlaps the words");
            assert!(*sorted.last().unwrap() + WORD_STRIDE <= l.slot(0));
            assert_eq!(l.slot(0) % PAGE, 0);
            assert_eq!(l.slot(1), l.slot(0) + l.slot_bytes);
            assert_eq!(l.ring(0), l.slot(1) + l.slot_bytes);
            assert_eq!(l.len(), l.ring(world - 1) + l.ring_bytes);
        }
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(Layout::new(0, 1 << 20, 1 << 16).is_err());
        assert!(Layout::new(2, 1000, 1 << 16).is_err());
        assert!(Layout::new(2, 1 << 20, 3 << 16).is_err());
        assert!(Layout::new(2, 1 << 20, 1 << 31).is_err());
    }
}
