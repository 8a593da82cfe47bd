//! `mooncake._mooncake.pg`: the shared-memory data plane and schedules
//! behind `mooncake.pg` (the `mooncake-cpu` torch.distributed backend).
//! Addresses come from torch tensors the Python glue keeps alive for the
//! call; every blocking call releases the GIL.

use std::path::Path;

use mooncake_pg::membership::{self, Activation};
use mooncake_pg::{schedule, Layout, ShmGroup};

use crate::pg_args::{bytes, bytes_mut, deadline, err, flag, PeerFailure};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// One rank's segment and its mappings of its peers'.
#[pyclass(module = "mooncake._mooncake.pg", name = "ShmGroup", frozen)]
struct PyShmGroup {
    inner: ShmGroup,
}

#[pymethods]
impl PyShmGroup {
    fn unlink(&self) {
        self.inner.unlink()
    }

    #[getter]
    fn slot_bytes(&self) -> usize {
        self.inner.layout().slot_bytes
    }

    fn slot_addr(&self, rank: usize, slot: usize) -> PyResult<usize> {
        if !self.inner.connected(rank) || slot >= mooncake_pg::layout::SLOTS {
            return Err(PyValueError::new_err(format!(
                "no slot {slot} of rank {rank}"
            )));
        }
        Ok(self.inner.slot_addr(rank, slot))
    }

    fn post(&self, flag_index: usize, value: u32) -> PyResult<()> {
        self.inner.post(flag(flag_index)?, value);
        Ok(())
    }

    fn flag(&self, rank: usize, flag_index: usize) -> PyResult<u32> {
        if !self.inner.connected(rank) {
            return Err(PyValueError::new_err(format!(
                "rank {rank} is not connected"
            )));
        }
        Ok(self.inner.flag(rank, flag(flag_index)?))
    }

    /// Waits until every rank of `ranks` reached `value` of the flag or
    /// died; returns the dead ones that did not reach it.
    fn wait(
        &self,
        py: Python<'_>,
        ranks: Vec<usize>,
        flag_index: usize,
        value: u32,
        timeout_s: f64,
    ) -> PyResult<Vec<usize>> {
        let f = flag(flag_index)?;
        if let Some(&r) = ranks.iter().find(|&&r| !self.inner.connected(r)) {
            return Err(PyValueError::new_err(format!("rank {r} is not connected")));
        }
        let d = deadline(timeout_s)?;
        py.allow_threads(|| self.inner.wait(&ranks, f, value, d))
            .map_err(err)
    }

    fn dead(&self, ranks: Vec<usize>) -> Vec<usize> {
        self.inner.dead(&ranks)
    }

    /// Maps (again) `peer`'s segment at `path`, its process `pid`: a rank
    /// joining the group or a new process taking over a dead rank.
    fn connect(&self, peer: usize, path: &str, pid: i32) -> PyResult<()> {
        self.inner.connect(peer, Path::new(path), pid).map_err(err)
    }

    fn connected(&self, rank: usize) -> bool {
        self.inner.connected(rank)
    }

    /// Sends `nbytes` at `addr` to `dst` under `tag`.
    fn send(
        &self,
        py: Python<'_>,
        dst: usize,
        tag: i64,
        addr: usize,
        nbytes: usize,
        timeout_s: f64,
    ) -> PyResult<u32> {
        self.peer(dst)?;
        let d = deadline(timeout_s)?;
        // SAFETY: the caller hands the address and length of a tensor it
        // keeps alive until this returns.
        let data = unsafe { bytes(addr, nbytes) };
        py.allow_threads(|| self.inner.send(dst, tag, data, d))
            .map_err(err)
    }

    /// `send` if the whole message fits in `dst`'s mailbox now; None
    /// (nothing sent) otherwise. Never blocks.
    fn try_send(&self, dst: usize, tag: i64, addr: usize, nbytes: usize) -> PyResult<Option<u32>> {
        self.peer(dst)?;
        // SAFETY: as in send.
        let data = unsafe { bytes(addr, nbytes) };
        Ok(self.inner.try_send(dst, tag, data))
    }

    /// Waits until `dst` has read this rank's messages up to `end` (what
    /// `send` returned).
    fn wait_read(&self, py: Python<'_>, dst: usize, end: u32, timeout_s: f64) -> PyResult<()> {
        self.peer(dst)?;
        let d = deadline(timeout_s)?;
        py.allow_threads(|| self.inner.wait_read(dst, end, d))
            .map_err(err)
    }

    fn recv_header(&self, py: Python<'_>, src: usize, timeout_s: f64) -> PyResult<(i64, usize)> {
        self.peer(src)?;
        let d = deadline(timeout_s)?;
        py.allow_threads(|| self.inner.recv_header(src, d))
            .map_err(err)
    }

    fn recv_body(
        &self,
        py: Python<'_>,
        src: usize,
        addr: usize,
        nbytes: usize,
        timeout_s: f64,
    ) -> PyResult<()> {
        self.peer(src)?;
        let d = deadline(timeout_s)?;
        // SAFETY: as in send, for a tensor the caller writes into.
        let out = unsafe { bytes_mut(addr, nbytes) };
        py.allow_threads(|| self.inner.recv_body(src, out, d))
            .map_err(err)
    }

    fn pending(&self, src: usize) -> PyResult<bool> {
        self.peer(src)?;
        Ok(self.inner.pending(src))
    }
}

impl PyShmGroup {
    fn peer(&self, r: usize) -> PyResult<()> {
        if r == self.inner.rank() || !self.inner.connected(r) {
            return Err(PyValueError::new_err(format!(
                "rank {r} is not a connected peer"
            )));
        }
        Ok(())
    }
}

/// This rank's segment while its peers are being mapped; `finish` makes
/// the group usable.
#[pyclass(module = "mooncake._mooncake.pg", name = "PendingGroup")]
struct PendingGroup {
    inner: Option<ShmGroup>,
}

#[pymethods]
impl PendingGroup {
    /// Maps `peer`'s segment at `path`; `pid` is its process.
    fn connect(&mut self, peer: usize, path: &str, pid: i32) -> PyResult<()> {
        let g = self
            .inner
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("group already finished"))?;
        g.connect(peer, Path::new(path), pid).map_err(err)
    }

    fn finish(&mut self) -> PyResult<PyShmGroup> {
        let inner = self
            .inner
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("group already finished"))?;
        Ok(PyShmGroup { inner })
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
    m.add_class::<PyShmGroup>()?;
    m.add("PeerFailure", py.get_type::<PeerFailure>())?;
    m.add_class::<PendingGroup>()?;
    m.add_class::<crate::pg_tcp::PyTcpGroup>()?;
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
