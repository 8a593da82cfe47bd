//! `mooncake._mooncake.reshard_*`: the native half of `mooncake.reshard`
//! (crate `mooncake-reshard`). The Python layer validates manifests and
//! builds the plan objects; these functions do the per-fragment geometry
//! and the byte copies.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use mooncake_reshard::copy::{self, Job};
use mooncake_reshard::geometry;
use mooncake_reshard::plan::SourceIndex;
use mooncake_reshard::region::Region;
use mooncake_reshard::{Block, Error};

type Dims = Vec<u64>;
/// A box as Python passes it: (global_offset, local_shape).
type PyBox = (Dims, Dims);
/// A region as Python passes it: (source base, target base, inner bytes,
/// outer counts, source strides, target strides).
type PyRegion = (u64, u64, u64, Dims, Dims, Dims);
/// One source box a target overlaps: (source index, overlap offset,
/// overlap shape, region).
type Match = (usize, Dims, Dims, PyRegion);

fn err(e: Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A box whose every end fits in 64 bits (the geometry would otherwise
/// saturate and could call a box covered that is not).
fn block((offset, shape): PyBox) -> PyResult<Block> {
    if offset
        .iter()
        .zip(&shape)
        .any(|(o, s)| o.checked_add(*s).is_none())
    {
        return Err(PyValueError::new_err(
            "box coordinates must be integers in [0, 2**64): a box ends past 2**64",
        ));
    }
    Ok(Block::new(offset, shape))
}

fn blocks(boxes: Vec<PyBox>) -> PyResult<Vec<Block>> {
    boxes.into_iter().map(block).collect()
}

fn to_py(r: Region) -> PyRegion {
    (
        r.source_base,
        r.target_base,
        r.inner_bytes,
        r.counts,
        r.source_strides,
        r.target_strides,
    )
}

fn from_py(
    (source_base, target_base, inner_bytes, counts, source_strides, target_strides): PyRegion,
) -> PyResult<Region> {
    if counts.len() != source_strides.len() || counts.len() != target_strides.len() {
        return Err(PyValueError::new_err(
            "transfer region outer loop rank mismatch",
        ));
    }
    Ok(Region {
        source_base,
        target_base,
        inner_bytes,
        counts,
        source_strides,
        target_strides,
    })
}

/// Whether any two boxes share a cell; from three dimensions up at most
/// `budget` pairwise comparisons, then ValueError.
#[pyfunction]
pub(crate) fn reshard_boxes_overlap(
    py: Python<'_>,
    boxes: Vec<PyBox>,
    budget: u64,
) -> PyResult<bool> {
    let boxes = blocks(boxes)?;
    py.allow_threads(|| geometry::any_overlap_within(&boxes.iter().collect::<Vec<_>>(), budget))
        .map_err(err)
}

/// Whether `boxes` tile `container` exactly (same budget).
#[pyfunction]
pub(crate) fn reshard_boxes_exactly_cover(
    py: Python<'_>,
    container: PyBox,
    boxes: Vec<PyBox>,
    budget: u64,
) -> PyResult<bool> {
    let boxes = blocks(boxes)?;
    let container = block(container)?;
    py.allow_threads(|| {
        geometry::exactly_cover_within(&container, &boxes.iter().collect::<Vec<_>>(), budget)
    })
    .map_err(err)
}

/// The strided copy of `overlap` from `source` to `target`.
#[pyfunction]
pub(crate) fn reshard_region(
    source: PyBox,
    target: PyBox,
    overlap: PyBox,
    itemsize: u64,
) -> PyResult<PyRegion> {
    Region::derive(&block(source)?, &block(target)?, &block(overlap)?, itemsize)
        .map(to_py)
        .map_err(err)
}

/// For every target box, the sources it overlaps, as lists of
/// (source index, overlap offset, overlap shape, region) in source order.
#[pyfunction]
pub(crate) fn reshard_match(
    py: Python<'_>,
    sources: Vec<PyBox>,
    targets: Vec<PyBox>,
    itemsize: u64,
) -> PyResult<Vec<Vec<Match>>> {
    let sources = blocks(sources)?;
    let targets = blocks(targets)?;
    py.allow_threads(|| {
        let index = SourceIndex::new(&sources)?;
        let mut out = Vec::with_capacity(targets.len());
        for target in &targets {
            let mut found = Vec::new();
            for (i, overlap) in index.overlapping(target)? {
                let region = Region::derive(&sources[i], target, &overlap, itemsize)?;
                found.push((i, overlap.offset, overlap.shape, to_py(region)));
            }
            out.push(found);
        }
        Ok(out)
    })
    .map_err(err)
}

/// The runs of one region as (source offset, target offset, bytes).
#[pyfunction]
pub(crate) fn reshard_segments(
    region: PyRegion,
    max_segments: u64,
) -> PyResult<Vec<(u64, u64, u64)>> {
    let region = from_py(region)?;
    Ok(region.segments(max_segments).map_err(err)?.collect())
}

fn byte_view(ob: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<PyBuffer<u8>> {
    let buf = PyBuffer::<u8>::get(ob).map_err(|e| {
        PyTypeError::new_err(format!(
            "{what} must be a byte buffer (memoryview cast to 'B'): {e}"
        ))
    })?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("{what} is not C-contiguous")));
    }
    if writable && buf.readonly() {
        return Err(PyValueError::new_err(format!("{what} is read-only")));
    }
    Ok(buf)
}

/// Runs `jobs` (source index, target index, region) from `sources` into
/// `targets` (writable byte buffers) on `nthreads` threads, with the GIL
/// released; returns the bytes moved. Targets must not overlap each other
/// or any source, and every region must fit its buffers: both are checked
/// before a byte moves.
#[pyfunction]
#[pyo3(signature = (jobs, sources, targets, nthreads = 1))]
pub(crate) fn reshard_copy(
    py: Python<'_>,
    jobs: Vec<(usize, usize, PyRegion)>,
    sources: Vec<Bound<'_, PyAny>>,
    targets: Vec<Bound<'_, PyAny>>,
    nthreads: usize,
) -> PyResult<u64> {
    let jobs: Vec<Job> = jobs
        .into_iter()
        .map(|(source, target, region)| {
            Ok(Job {
                source,
                target,
                region: from_py(region)?,
            })
        })
        .collect::<PyResult<_>>()?;
    let source_views: Vec<PyBuffer<u8>> = sources
        .iter()
        .enumerate()
        .map(|(i, s)| byte_view(s, &format!("sources[{i}]"), false))
        .collect::<PyResult<_>>()?;
    let target_views: Vec<PyBuffer<u8>> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| byte_view(t, &format!("targets[{i}]"), true))
        .collect::<PyResult<_>>()?;
    // Writes go through &mut slices: no target may share a byte with
    // another target or with a source.
    let span = |b: &PyBuffer<u8>| (b.buf_ptr() as usize, b.len_bytes());
    let mut spans: Vec<(usize, usize, bool)> = target_views
        .iter()
        .map(|b| (span(b).0, span(b).1, true))
        .collect();
    spans.extend(source_views.iter().map(|b| (span(b).0, span(b).1, false)));
    spans.retain(|s| s.1 > 0);
    spans.sort_unstable();
    for w in spans.windows(2) {
        let (a, b) = (w[0], w[1]);
        if (a.2 || b.2) && b.0 < a.0 + a.1 {
            return Err(PyValueError::new_err(
                "a target buffer overlaps another target or a source",
            ));
        }
    }
    let src_raw: Vec<(usize, usize)> = source_views.iter().map(span).collect();
    let dst_raw: Vec<(usize, usize)> = target_views.iter().map(span).collect();
    let moved = py.allow_threads(move || {
        // SAFETY: the views are held (exporters keep the memory alive and
        // unmoved) until this returns; targets are writable and overlap
        // nothing else, checked above, so the &mut slices are unique.
        let srcs: Vec<&[u8]> = src_raw
            .iter()
            .map(|&(p, n)| {
                if n == 0 {
                    &[][..]
                } else {
                    unsafe { std::slice::from_raw_parts(p as *const u8, n) }
                }
            })
            .collect();
        let mut dsts: Vec<&mut [u8]> = dst_raw
            .iter()
            .map(|&(p, n)| {
                if n == 0 {
                    &mut [][..]
                } else {
                    unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) }
                }
            })
            .collect();
        copy::run(&jobs, &srcs, &mut dsts, nthreads.max(1))
    });
    drop(source_views);
    drop(target_views);
    moved.map_err(err)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(reshard_boxes_overlap, m)?)?;
    m.add_function(wrap_pyfunction!(reshard_boxes_exactly_cover, m)?)?;
    m.add_function(wrap_pyfunction!(reshard_region, m)?)?;
    m.add_function(wrap_pyfunction!(reshard_match, m)?)?;
    m.add_function(wrap_pyfunction!(reshard_segments, m)?)?;
    m.add_function(wrap_pyfunction!(reshard_copy, m)?)?;
    Ok(())
}
