//! `mooncake._fast_copy.concat_arrays_into`: gathers a run of arrays into
//! one destination address, the copy the structured-object layer makes when
//! it packs many small tensors into a registered buffer.
//!
//! The split between threads is by bytes, not by array count, so one large
//! array among small ones does not leave the other threads idle; the GIL is
//! released for the copy.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::buffer::Exported;
use crate::mem::{self, Access};

/// Where each thread's share of `total` bytes starts, as (source index,
/// offset in that source) pairs, for sources of `sizes` bytes: thread `t`
/// copies from `cuts[t]` up to `cuts[t + 1]` (the last up to the end).
pub(crate) fn cuts(sizes: &[usize], threads: usize) -> Vec<(usize, usize)> {
    let total: usize = sizes.iter().sum();
    let threads = threads.clamp(1, total.max(1));
    let mut out = Vec::with_capacity(threads);
    let (mut src, mut before) = (0usize, 0usize);
    for t in 0..threads {
        let at = total / threads * t + (total % threads).min(t);
        // Past every source that ends at or before `at` (empty ones too),
        // so a cut always points into a source that has bytes.
        while src < sizes.len() && before + sizes[src] <= at {
            before += sizes[src];
            src += 1;
        }
        out.push((src, at - before));
    }
    out
}

/// Copies `srcs` one after the other to `dst`, `threads` ways.
///
/// # Safety
/// `dst` must be valid for writes of the sources' total length and must not
/// overlap any source.
unsafe fn gather(srcs: &[&[u8]], dst: usize, threads: usize) {
    let sizes: Vec<usize> = srcs.iter().map(|s| s.len()).collect();
    let total: usize = sizes.iter().sum();
    let cuts = cuts(&sizes, threads);
    let ends: Vec<(usize, usize)> = cuts
        .iter()
        .skip(1)
        .copied()
        .chain(std::iter::once((srcs.len(), 0)))
        .collect();
    let starts: Vec<usize> = {
        // Destination offset of each source.
        let mut acc = 0;
        sizes
            .iter()
            .map(|&n| {
                let o = acc;
                acc += n;
                o
            })
            .chain(std::iter::once(total))
            .collect()
    };
    let part = |from: (usize, usize), to: (usize, usize)| {
        let (mut i, mut off) = from;
        while i < to.0 || (i == to.0 && off < to.1) {
            let end = if i == to.0 { to.1 } else { srcs[i].len() };
            let piece = &srcs[i][off..end];
            // SAFETY: the caller vouches for `dst..dst + total`; this piece
            // lands at its source's offset, inside that range, and pieces of
            // different threads never overlap.
            unsafe { mem::copy_to(dst + starts[i] + off, piece) };
            i += 1;
            off = 0;
        }
    };
    std::thread::scope(|s| {
        for (&from, &to) in cuts.iter().zip(&ends).skip(1) {
            s.spawn(move || part(from, to));
        }
        part(cuts[0], ends[0]);
    });
}

/// `concat_arrays_into(arrays, dest_ptr, dest_size, start=0, count=-1,
/// nthreads=1)`: copies `arrays[start:start + count]` (C-contiguous arrays
/// or other buffers) back to back to `dest_ptr` and returns the bytes copied.
/// `start` and `count` are clamped to the list as the reference does.
#[pyfunction]
#[pyo3(signature = (arrays, dest_ptr, dest_size, start = 0, count = -1, nthreads = 1))]
pub(crate) fn concat_arrays_into(
    py: Python<'_>,
    arrays: &Bound<'_, PyList>,
    dest_ptr: u64,
    dest_size: u64,
    start: isize,
    count: isize,
    nthreads: i32,
) -> PyResult<usize> {
    let len = arrays.len() as isize;
    let start = start.clamp(0, len);
    let count = if count < 0 || start + count > len {
        len - start
    } else {
        count
    };
    if count == 0 {
        return Ok(0);
    }
    let mut held = Vec::with_capacity(count as usize);
    for i in start..start + count {
        let item = arrays.get_item(i as usize)?;
        held.push(Exported::get(&item).map_err(|_| {
            if item.hasattr("__array_interface__").unwrap_or(false)
                || item.hasattr("__buffer__").unwrap_or(false)
            {
                PyValueError::new_err(format!("arrays[{i}] is not C-contiguous"))
            } else {
                PyTypeError::new_err(format!("arrays[{i}] is not an ndarray (or another buffer)"))
            }
        })?);
    }
    let total = held
        .iter()
        .try_fold(0usize, |acc, h| acc.checked_add(h.as_slice().len()))
        .ok_or_else(|| PyValueError::new_err("array byte sizes overflow"))?;
    if total as u64 > dest_size {
        return Err(PyValueError::new_err(format!(
            "destination buffer too small: need {total} bytes, got {dest_size}"
        )));
    }
    let dst = dest_ptr as usize;
    if total > 0 && !mem::accessible(dst, total, Access::Write) {
        return Err(PyValueError::new_err(format!(
            "destination {dst:#x} is not {total} writable bytes of this process"
        )));
    }
    let srcs: Vec<&[u8]> = held.iter().map(|h| h.as_slice()).collect();
    let overlaps = srcs.iter().any(|s| {
        let (a, b) = (s.as_ptr() as usize, s.as_ptr() as usize + s.len());
        !s.is_empty() && a < dst + total && dst < b
    });
    if overlaps {
        return Err(PyValueError::new_err(
            "the destination overlaps one of the arrays",
        ));
    }
    let threads = nthreads.max(1) as usize;
    // SAFETY: `dst..dst + total` is writable memory of this process (checked
    // above) that overlaps no source; the exports keep the sources alive.
    py.allow_threads(|| unsafe { gather(&srcs, dst, threads) });
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_split_bytes_evenly() {
        assert_eq!(cuts(&[10], 1), [(0, 0)]);
        assert_eq!(cuts(&[10], 2), [(0, 0), (0, 5)]);
        assert_eq!(cuts(&[4, 4], 2), [(0, 0), (1, 0)]);
        assert_eq!(cuts(&[2, 6], 2), [(0, 0), (1, 2)]);
        // More threads than bytes: one per byte at most.
        assert_eq!(cuts(&[1, 1], 8), [(0, 0), (1, 0)]);
        assert_eq!(cuts(&[0, 3], 1), [(1, 0)]);
    }

    fn run(srcs: &[&[u8]], threads: usize) -> Vec<u8> {
        let total = srcs.iter().map(|s| s.len()).sum();
        let mut out = vec![0xAAu8; total];
        unsafe { gather(srcs, out.as_mut_ptr() as usize, threads) };
        out
    }

    #[test]
    fn gather_concatenates_with_any_thread_count() {
        let a: Vec<u8> = (0..100).collect();
        let b: Vec<u8> = vec![];
        let c: Vec<u8> = (100..107).collect();
        let d: Vec<u8> = (107..=255).collect();
        let want: Vec<u8> = (0..=255).collect();
        for t in 1..=9 {
            assert_eq!(run(&[&a, &b, &c, &d], t), want, "{t} threads");
        }
        assert_eq!(run(&[&b, &b], 4), Vec::<u8>::new());
    }
}
