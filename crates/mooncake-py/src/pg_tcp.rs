//! `mooncake._mooncake.pg.TcpGroup`: the TCP mesh behind `mooncake.pg`
//! for ranks on different hosts, with the calls of `ShmGroup`. Every
//! blocking call and every byte copy runs with the GIL released.

use mooncake_pg::TcpGroup;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::pg_args::{bytes, bytes_mut, deadline, err, flag};

#[pyclass(module = "mooncake._mooncake.pg", name = "TcpGroup", frozen)]
pub(crate) struct PyTcpGroup {
    inner: TcpGroup,
}

#[pymethods]
impl PyTcpGroup {
    /// This rank's slots and a listening socket; `port` is where peers
    /// reach it.
    #[new]
    fn new(rank: usize, size: usize, slot_bytes: usize) -> PyResult<Self> {
        let inner = TcpGroup::new(rank, size, slot_bytes).map_err(err)?;
        Ok(PyTcpGroup { inner })
    }

    #[getter]
    fn port(&self) -> u16 {
        self.inner.port()
    }

    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    #[getter]
    fn slot_bytes(&self) -> usize {
        self.inner.slot_bytes()
    }

    /// Connects to every peer of `peers` (`(rank, host, port)`) and
    /// accepts one connection from each within `timeout_s`.
    fn connect_all(
        &self,
        py: Python<'_>,
        peers: Vec<(usize, String, u16)>,
        timeout_s: f64,
    ) -> PyResult<()> {
        let d = deadline(timeout_s)?;
        py.allow_threads(|| self.inner.connect_all(&peers, d))
            .map_err(err)
    }

    fn close(&self, py: Python<'_>) {
        py.allow_threads(|| self.inner.close())
    }

    /// Over TCP the group is fixed: no rank maps in after setup.
    fn connect(&self, peer: usize, _path: &str, _pid: i32) -> PyResult<()> {
        Err(PyRuntimeError::new_err(format!(
            "mooncake-cpu over TCP cannot take in rank {peer} after setup"
        )))
    }

    fn connected(&self, rank: usize) -> bool {
        self.inner.connected(rank)
    }

    fn slot_addr(&self, rank: usize, slot: usize) -> PyResult<usize> {
        self.inner
            .slot_addr(rank, slot)
            .ok_or_else(|| PyValueError::new_err(format!("no slot {slot} of rank {rank}")))
    }

    /// This rank wrote bytes `lo..hi` of its slot `slot`.
    fn touch(&self, slot: usize, lo: usize, hi: usize) -> PyResult<()> {
        self.inner
            .touch(slot, lo, hi)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    fn clean(&self, slot: usize) {
        self.inner.clean(slot)
    }

    fn post(&self, py: Python<'_>, flag_index: usize, value: u32) -> PyResult<()> {
        let f = flag(flag_index)?;
        py.allow_threads(|| self.inner.post(f, value));
        Ok(())
    }

    /// `post` sending each peer `p` bytes `parts[p]` of the round's slot,
    /// or of the `nbytes` at `addr` when `addr` is not 0.
    fn post_parts(
        &self,
        py: Python<'_>,
        flag_index: usize,
        value: u32,
        parts: Vec<(usize, usize)>,
        addr: usize,
        nbytes: usize,
    ) -> PyResult<()> {
        let f = flag(flag_index)?;
        // SAFETY: the caller hands the address and length of a tensor it
        // keeps alive, unwritten, until this returns.
        let src = (addr != 0).then(|| unsafe { bytes(addr, nbytes) });
        py.allow_threads(|| self.inner.post_parts(f, value, &parts, src))
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Has `peer`'s next `flag` = `value` payload written to `addr` (at its
    /// slot offsets, within `nbytes`) instead of its slot copy; False when
    /// it arrived already. `end_redirect` must follow.
    fn redirect(
        &self,
        peer: usize,
        flag_index: usize,
        value: u32,
        addr: usize,
        nbytes: usize,
    ) -> PyResult<bool> {
        self.peer(peer)?;
        let f = flag(flag_index)?;
        // SAFETY: the caller hands a tensor it keeps alive and leaves alone
        // until its end_redirect returns.
        unsafe { self.inner.redirect(peer, f, value, addr as *mut u8, nbytes) }.map_err(err)
    }

    /// Whether `peer`'s redirected payload went into the buffer; waits
    /// out one being written.
    fn end_redirect(&self, py: Python<'_>, peer: usize, timeout_s: f64) -> PyResult<bool> {
        self.peer(peer)?;
        let d = deadline(timeout_s)?;
        Ok(py.allow_threads(|| self.inner.end_redirect(peer, d)))
    }

    fn flag(&self, rank: usize, flag_index: usize) -> PyResult<u32> {
        self.rank_in(rank)?;
        Ok(self.inner.flag(rank, flag(flag_index)?))
    }

    fn dead(&self, ranks: Vec<usize>) -> Vec<usize> {
        self.inner.dead(&ranks)
    }

    fn wait(
        &self,
        py: Python<'_>,
        ranks: Vec<usize>,
        flag_index: usize,
        value: u32,
        timeout_s: f64,
    ) -> PyResult<Vec<usize>> {
        let f = flag(flag_index)?;
        for &r in &ranks {
            self.rank_in(r)?;
        }
        let d = deadline(timeout_s)?;
        py.allow_threads(|| self.inner.wait(&ranks, f, value, d))
            .map_err(err)
    }

    /// Sends `nbytes` at `addr` to `dst` under `tag`, straight from that
    /// memory.
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

    /// `send` of a small message when no other write to `dst` is under
    /// way; None (nothing sent) otherwise.
    fn try_send(
        &self,
        py: Python<'_>,
        dst: usize,
        tag: i64,
        addr: usize,
        nbytes: usize,
    ) -> PyResult<Option<u32>> {
        self.peer(dst)?;
        // SAFETY: as in send.
        let data = unsafe { bytes(addr, nbytes) };
        py.allow_threads(|| self.inner.try_send(dst, tag, data))
            .map_err(err)
    }

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

    /// Copies the next message from `src` into `nbytes` at `addr`; a
    /// length other than the message's is refused before any byte moves.
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

    /// Receives the next message from `src` straight into `nbytes` at
    /// `addr` when it has `tag` and that length and none other is queued:
    /// True once there; False (nothing read) when another comes first.
    fn recv_into(
        &self,
        py: Python<'_>,
        src: usize,
        tag: i64,
        addr: usize,
        nbytes: usize,
        timeout_s: f64,
    ) -> PyResult<bool> {
        self.peer(src)?;
        let d = deadline(timeout_s)?;
        // SAFETY: as in recv_body.
        let out = unsafe { bytes_mut(addr, nbytes) };
        py.allow_threads(|| self.inner.recv_into(src, tag, out, d))
            .map_err(err)
    }

    fn pending(&self, src: usize) -> PyResult<bool> {
        self.peer(src)?;
        Ok(self.inner.pending(src))
    }
}

impl PyTcpGroup {
    fn rank_in(&self, r: usize) -> PyResult<()> {
        if r >= self.inner.size() {
            return Err(PyValueError::new_err(format!("rank {r} is not connected")));
        }
        Ok(())
    }

    fn peer(&self, r: usize) -> PyResult<()> {
        if r == self.inner.rank() || r >= self.inner.size() {
            return Err(PyValueError::new_err(format!(
                "rank {r} is not a connected peer"
            )));
        }
        Ok(())
    }
}
