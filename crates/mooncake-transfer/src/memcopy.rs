//! Copies into a segment: bytes that land in a store's memory are read
//! again only by a later `get`, often from another process, so pulling
//! the destination into this core's cache first is wasted work. A plain
//! `memcpy` below glibc's non-temporal threshold (tens of MiB) reads every
//! destination line before writing it; non-temporal stores write it to
//! memory directly, which on this kind of machine roughly halves the time
//! of a 64 KiB-4 MiB copy into memory that is not cached.
//!
//! The only unsafe code is [`copy_to_segment`] and its x86-64 body: SSE2
//! loads and streaming stores (SSE2 is part of x86-64, so no runtime
//! detection), an `sfence` so that the streamed bytes are ordered before
//! every later store of this thread (the PutEnd that publishes them), and
//! a plain copy elsewhere.

/// Copies shorter than this use a plain copy: the destination may well be
/// read again soon and fits in cache, and streaming stores would evict it.
pub const STREAM_MIN: usize = 64 << 10;

/// Copies `len` bytes from `src` to `dst` for a reader that comes later
/// (a store segment). Overlapping ranges are copied as by `memmove`.
///
/// # Safety
/// `src..src+len` must be valid for reads and `dst..dst+len` for writes
/// for the duration of the call (any pointers when `len` is 0).
pub unsafe fn copy_to_segment(dst: *mut u8, src: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let (d, s) = (dst as usize, src as usize);
    let overlap = d < s.wrapping_add(len) && s < d.wrapping_add(len);
    if len < STREAM_MIN || overlap {
        // SAFETY: both ranges are valid per the caller; `copy` allows overlap.
        unsafe { std::ptr::copy(src, dst, len) };
        return;
    }
    // SAFETY: forwarded; the ranges do not overlap.
    unsafe { stream(dst, src, len) }
}

#[cfg(target_arch = "x86_64")]
unsafe fn stream(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    const LANE: usize = 16;
    const STEP: usize = 4 * LANE;
    // A plain head up to the first 16-byte-aligned destination byte
    // (streaming stores need aligned addresses), streamed 64-byte steps,
    // then a plain tail.
    let head = ((LANE - dst as usize % LANE) % LANE).min(len);
    // SAFETY: `head <= len`; both ranges are valid and disjoint.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let body = (len - head) / STEP * STEP;
    let mut i = head;
    while i < head + body {
        // SAFETY: `i + STEP <= len`, so each 16-byte load and store lies in
        // its range; `dst + i` is 16-byte aligned (head, then whole steps);
        // loads are unaligned loads.
        unsafe {
            let s = src.add(i).cast::<__m128i>();
            let d = dst.add(i).cast::<__m128i>();
            let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
            let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        i += STEP;
    }
    // SAFETY: `i..len` is the rest of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i) };
    // SAFETY: no operands; orders the streaming stores before later stores.
    unsafe { _mm_sfence() };
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded from `copy_to_segment`.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 131 + i / 251) as u8).collect()
    }

    /// Every alignment of source and destination, lengths around the
    /// threshold and the 64-byte step, with guard bytes on both sides.
    #[test]
    fn copies_exactly_the_range_for_every_alignment_and_length() {
        let lens = [
            0,
            1,
            15,
            16,
            63,
            64,
            65,
            STREAM_MIN - 1,
            STREAM_MIN,
            STREAM_MIN + 1,
            STREAM_MIN + 63,
            STREAM_MIN + 64 + 17,
            (1 << 20) + 5,
        ];
        let src_all = pattern((1 << 20) + 64 + 128);
        for &len in &lens {
            for so in [0, 1, 7, 16, 33] {
                for d_off in [0, 3, 8, 15, 16, 48] {
                    let mut dst = vec![0xEEu8; len + 128];
                    let src = &src_all[so..so + len];
                    // SAFETY: both ranges lie inside live vectors.
                    unsafe { copy_to_segment(dst.as_mut_ptr().add(d_off + 32), src.as_ptr(), len) };
                    assert!(
                        dst[..d_off + 32].iter().all(|&b| b == 0xEE),
                        "head guard {len} {so} {d_off}"
                    );
                    assert_eq!(
                        &dst[d_off + 32..d_off + 32 + len],
                        src,
                        "bytes {len} {so} {d_off}"
                    );
                    assert!(
                        dst[d_off + 32 + len..].iter().all(|&b| b == 0xEE),
                        "tail guard {len} {so} {d_off}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_zero_length_copy_touches_nothing() {
        // SAFETY: a zero-length copy dereferences neither pointer.
        unsafe { copy_to_segment(std::ptr::null_mut(), std::ptr::null(), 0) };
        // SAFETY: likewise, with dangling pointers.
        unsafe { copy_to_segment(8 as *mut u8, 16 as *const u8, 0) };
    }

    #[test]
    fn overlapping_ranges_copy_as_memmove() {
        for shift in [1usize, 64, 4096] {
            for forward in [true, false] {
                let n = 3 * STREAM_MIN;
                let mut buf = pattern(n + shift);
                let expect = {
                    let mut b = buf.clone();
                    if forward {
                        b.copy_within(0..n, shift);
                    } else {
                        b.copy_within(shift..shift + n, 0);
                    }
                    b
                };
                let p = buf.as_mut_ptr();
                // SAFETY: both ranges lie inside `buf`.
                unsafe {
                    if forward {
                        copy_to_segment(p.add(shift), p, n);
                    } else {
                        copy_to_segment(p, p.add(shift), n);
                    }
                }
                assert!(buf == expect, "shift {shift} forward {forward}");
            }
        }
    }
}
