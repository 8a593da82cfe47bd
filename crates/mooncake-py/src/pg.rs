//! `mooncake._mooncake.pg`: the data plane and schedules behind
//! `mooncake.pg` (the `mooncake-cpu` torch.distributed backend): a rank's
//! group over either transport (`pg_group`), how a shared-memory one is
//! made, and the pure arithmetic the Python glue follows.

use std::path::Path;

use mooncake_pg::membership::{self, Activation};
use mooncake_pg::{schedule, Layout, ShmGroup};

use crate::pg_args::{err, PeerFailure};
use crate::pg_group::{Inner, PyGroup};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// This rank's segment, made; `finish` makes it a group (its peers are
/// mapped with the group's `attach`).
#[pyclass(module = "mooncake._mooncake.pg", name = "PendingGroup")]
struct PendingGroup {
    inner: Option<ShmGroup>,
}

#[pymethods]
impl PendingGroup {
    fn finish(&mut self) -> PyResult<PyGroup> {
        let inner = self
            .inner
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("group already finished"))?;
        Ok(PyGroup::new(Inner::Shm(inner)))
    }
}

/// Creates this rank's segment as the new file `path`.
#[pyfunction]
fn create(
    path: &str,
    rank: usize,
    world: usize,
    slot_bytes: usize,
    ring_bytes: usize,
) -> PyResult<PendingGroup> {
    let layout = Layout::new(world, slot_bytes, ring_bytes).map_err(PyValueError::new_err)?;
    let inner = ShmGroup::create(Path::new(path), rank, layout).map_err(err)?;
    Ok(PendingGroup { inner: Some(inner) })
}

/// `(lo, hi)` of each of `parts` near-equal ranges of `len` items.
#[pyfunction]
fn partition(len: usize, parts: usize) -> PyResult<Vec<(usize, usize)>> {
    if parts == 0 {
        return Err(PyValueError::new_err("partition into zero parts"));
    }
    Ok(schedule::partition(len, parts))
}

/// The range of a chunk of `len` items each of `size` ranks reduces when
/// `members` take part (see `schedule::owned_parts`).
#[pyfunction]
fn owned_parts(len: usize, members: Vec<usize>, size: usize) -> Vec<(usize, usize)> {
    schedule::owned_parts(len, &members, size)
}

/// Whether an all_reduce of `nbytes` over `world` ranks is direct.
#[pyfunction]
fn all_reduce_direct(nbytes: usize, world: usize) -> bool {
    schedule::all_reduce(nbytes, world) == schedule::AllReduce::Direct
}

/// Elements per block when `blocks` blocks share a slot.
#[pyfunction]
fn block_elems(slot_bytes: usize, elem_size: usize, blocks: usize) -> PyResult<usize> {
    schedule::block_elems(slot_bytes, elem_size, blocks).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{blocks} blocks of {elem_size}-byte elements do not fit a {slot_bytes}-byte slot"
        ))
    })
}

#[pyfunction]
fn rounds(total: usize, per_round: usize) -> PyResult<Vec<(usize, usize)>> {
    if per_round == 0 {
        return Err(PyValueError::new_err("rounds of zero elements"));
    }
    Ok(schedule::rounds(total, per_round))
}

/// The world size a rank reports (see `membership::visible_size`).
#[pyfunction]
fn visible_size(active: Vec<usize>, declared: usize, joined: bool) -> usize {
    membership::visible_size(&active, declared, joined)
}

/// The sorted ranks of a proposal, or ValueError saying what is wrong.
#[pyfunction]
fn check_ranks(max_group_size: usize, ranks: Vec<i64>) -> PyResult<Vec<usize>> {
    membership::check_ranks(max_group_size, &ranks).map_err(PyValueError::new_err)
}

/// The sorted ranks of an activation, or ValueError: out of range,
/// duplicate, or active already (see `membership::check_activation`).
#[pyfunction]
fn check_activation(
    max_group_size: usize,
    active: Vec<usize>,
    ranks: Vec<i64>,
) -> PyResult<Vec<usize>> {
    membership::check_activation(max_group_size, &active, &ranks).map_err(PyValueError::new_err)
}

#[pyfunction]
fn activation_vote(max_group_size: usize, requested: Vec<usize>, ready: Vec<usize>) -> Vec<i64> {
    membership::activation_vote(max_group_size, &requested, &ready)
}

/// `(reason, [], [], [])` when rejected, else `("", active, add, dropped)`.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn decide_activation(
    max_group_size: usize,
    active: Vec<usize>,
    vote: Vec<i64>,
) -> (String, Vec<usize>, Vec<usize>, Vec<usize>) {
    match membership::decide_activation(max_group_size, &active, &vote) {
        Activation::Rejected(reason) => (reason, vec![], vec![], vec![]),
        Activation::Apply {
            active,
            add,
            dropped,
        } => (String::new(), active, add, dropped),
    }
}

pub(crate) fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = parent.py();
    let m = PyModule::new(py, "pg")?;
    m.add_class::<PyGroup>()?;
    m.add("PeerFailure", py.get_type::<PeerFailure>())?;
    m.add_class::<PendingGroup>()?;
    m.add_function(wrap_pyfunction!(crate::pg_group::tcp_group, &m)?)?;
    m.add_function(wrap_pyfunction!(create, &m)?)?;
    m.add_function(wrap_pyfunction!(partition, &m)?)?;
    m.add_function(wrap_pyfunction!(all_reduce_direct, &m)?)?;
    m.add_function(wrap_pyfunction!(owned_parts, &m)?)?;
    m.add_function(wrap_pyfunction!(block_elems, &m)?)?;
    m.add_function(wrap_pyfunction!(rounds, &m)?)?;
    m.add_function(wrap_pyfunction!(visible_size, &m)?)?;
    m.add_function(wrap_pyfunction!(check_ranks, &m)?)?;
    m.add_function(wrap_pyfunction!(check_activation, &m)?)?;
    m.add_function(wrap_pyfunction!(activation_vote, &m)?)?;
    m.add_function(wrap_pyfunction!(decide_activation, &m)?)?;
    m.add(
        "LIVENESS_PERIOD_S",
        mooncake_pg::wait::LIVENESS_PERIOD.as_secs_f64(),
    )?;
    parent.add_submodule(&m)
}
