//! The master's segment allocator: the crate's best-fit offset allocator
//! at an 8-byte granularity, so replica offsets stay word-aligned while a
//! small object wastes little.

pub use crate::allocator::BadFree;

/// Every allocation is rounded up to this many bytes, so offsets stay aligned.
pub const ALIGNMENT: u64 = 8;

/// One segment's allocator.
pub type OffsetAllocator = crate::allocator::OffsetAllocator<ALIGNMENT>;

/// Rounds a request up to the allocation granularity (`None` on overflow).
pub fn aligned_len(size: u64) -> Option<u64> {
    OffsetAllocator::aligned_len(size)
}
