//! `mooncake._mooncake.pg.Group`: one rank's data plane for Python, over
//! shared memory or TCP. The calls both transports have go through
//! [`Transport`] once; the TCP mesh's own (the bytes a post carries,
//! payloads and receives taken straight into a tensor, its listener) say
//! so when called on shared memory. Every blocking call releases the GIL.

use std::time::Instant;

use mooncake_pg::{GroupError, ShmGroup, TcpGroup, Transport};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::pg_args::{bytes, bytes_mut, deadline, err, flag};

pub(crate) enum Inner {
    Shm(ShmGroup),
    Tcp(TcpGroup),
}

#[pyclass(module = "mooncake._mooncake.pg", name = "Group", frozen)]
pub(crate) struct PyGroup {
    inner: Inner,
}

impl PyGroup {
    pub(crate) fn new(inner: Inner) -> PyGroup {
        PyGroup { inner }
    }

    fn plane(&self) -> &dyn Transport {
        match &self.inner {
            Inner::Shm(g) => g,
            Inner::Tcp(g) => g,
        }
    }

    fn tcp(&self, call: &str) -> PyResult<&TcpGroup> {
        match &self.inner {
            Inner::Tcp(g) => Ok(g),
            Inner::Shm(_) => Err(PyValueError::new_err(format!(
                "{call} is a call of the TCP transport, not shared memory's"
            ))),
        }
    }

    fn rank_in(&self, r: usize) -> PyResult<()> {
        if !self.plane().connected(r) {
            return Err(PyValueError::new_err(format!("rank {r} is not connected")));
        }
        Ok(())
    }

    fn peer(&self, r: usize) -> PyResult<()> {
        if r == self.plane().rank() || !self.plane().connected(r) {
            return Err(PyValueError::new_err(format!(
                "rank {r} is not a connected peer"
            )));
        }
        Ok(())
    }

    /// The shape of every point-to-point call: `peer` checked, a deadline
    /// `timeout_s` from now, `f` run with the GIL released.
    fn with_peer<T: Send>(
        &self,
        py: Python<'_>,
        peer: usize,
        timeout_s: f64,
        f: impl FnOnce(&dyn Transport, Instant) -> Result<T, GroupError> + Send,
    ) -> PyResult<T> {
        self.peer(peer)?;
        let d = deadline(timeout_s)?;
        let plane = self.plane();
        py.allow_threads(|| f(plane, d)).map_err(err)
    }
}

#[pymethods]
impl PyGroup {
    /// `"shm"` or `"tcp"`.
    #[getter]
    fn transport(&self) -> &'static str {
        self.plane().name()
    }

    #[getter]
    fn rank(&self) -> usize {
        self.plane().rank()
    }

    #[getter]
    fn slot_bytes(&self) -> usize {
        self.plane().slot_bytes()
    }

    fn slot_addr(&self, rank: usize, slot: usize) -> PyResult<usize> {
        self.plane()
            .slot_addr(rank, slot)
            .ok_or_else(|| PyValueError::new_err(format!("no slot {slot} of rank {rank}")))
    }

    fn post(&self, py: Python<'_>, flag_index: usize, value: u32) -> PyResult<()> {
        let f = flag(flag_index)?;
        let plane = self.plane();
        py.allow_threads(|| plane.post(f, value));
        Ok(())
    }

    fn flag(&self, rank: usize, flag_index: usize) -> PyResult<u32> {
        self.rank_in(rank)?;
        Ok(self.plane().flag(rank, flag(flag_index)?))
    }

    fn dead(&self, ranks: Vec<usize>) -> Vec<usize> {
        self.plane().dead(&ranks)
    }

    fn connected(&self, rank: usize) -> bool {
        self.plane().connected(rank)
    }

    /// Waits until every rank of `ranks` reached `value` of the flag or is
    /// gone; returns the gone ones that did not reach it.
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
        let plane = self.plane();
        py.allow_threads(|| plane.wait(&ranks, f, value, d))
            .map_err(err)
    }

    /// Maps (over TCP: dials) `peer`'s incarnation `nonce`, which its
    /// process `pid` published at `place` (a segment's path, or `"host
    /// port"`): a rank joining the group or a process taking over one.
    fn attach(
        &self,
        py: Python<'_>,
        peer: usize,
        place: &str,
        pid: i32,
        nonce: u64,
        timeout_s: f64,
    ) -> PyResult<()> {
        let d = deadline(timeout_s)?;
        let plane = self.plane();
        py.allow_threads(|| plane.attach(peer, place, pid, nonce, d))
            .map_err(err)
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
        // SAFETY: the caller hands the address and length of a tensor it
        // keeps alive until this returns.
        let data = unsafe { bytes(addr, nbytes) };
        self.with_peer(py, dst, timeout_s, |g, d| g.send(dst, tag, data, d))
    }

    /// `send` when it completes at once (it fits the mailbox, no other
    /// write to `dst` is under way); None (nothing sent) otherwise.
    fn try_send(
        &self,
        py: Python<'_>,
        dst: usize,
        tag: i64,
        addr: usize,
        nbytes: usize,
    ) -> PyResult<Option<u32>> {
        // SAFETY: as in send.
        let data = unsafe { bytes(addr, nbytes) };
        self.with_peer(py, dst, 0.0, |g, _| g.try_send(dst, tag, data))
    }

    /// Waits until `dst` has read this rank's messages up to `end` (what
    /// `send` returned).
    fn wait_read(&self, py: Python<'_>, dst: usize, end: u32, timeout_s: f64) -> PyResult<()> {
        self.with_peer(py, dst, timeout_s, |g, d| g.wait_read(dst, end, d))
    }

    fn recv_header(&self, py: Python<'_>, src: usize, timeout_s: f64) -> PyResult<(i64, usize)> {
        self.with_peer(py, src, timeout_s, |g, d| g.recv_header(src, d))
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
        // SAFETY: as in send, for a tensor the caller writes into.
        let out = unsafe { bytes_mut(addr, nbytes) };
        self.with_peer(py, src, timeout_s, |g, d| g.recv_body(src, out, d))
    }

    fn pending(&self, src: usize) -> PyResult<bool> {
        self.peer(src)?;
        Ok(self.plane().pending(src))
    }

    // -- shared memory's own --------------------------------------------
    /// Removes this rank's segment file (peers keep their mappings).
    fn unlink(&self) -> PyResult<()> {
        match &self.inner {
            Inner::Shm(g) => {
                g.unlink();
                Ok(())
            }
            Inner::Tcp(_) => Err(PyValueError::new_err("a TCP group has no segment file")),
        }
    }

    // -- the TCP mesh's own ----------------------------------------------
    /// Where peers dial this rank.
    #[getter]
    fn port(&self) -> PyResult<u16> {
        Ok(self.tcp("port")?.port())
    }

    /// This process's incarnation, as peers' `attach` names it.
    #[getter]
    fn nonce(&self) -> PyResult<u64> {
        Ok(self.tcp("nonce")?.nonce())
    }

    /// Waits until every rank of `peers` has dialed this rank.
    fn wait_connected(&self, py: Python<'_>, peers: Vec<usize>, timeout_s: f64) -> PyResult<()> {
        let g = self.tcp("wait_connected")?;
        let d = deadline(timeout_s)?;
        py.allow_threads(|| g.wait_connected(&peers, d))
            .map_err(err)
    }

    /// The active ranks: the peers this rank's collective words go to.
    fn set_members(&self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<()> {
        let g = self.tcp("set_members")?;
        py.allow_threads(|| g.set_members(&ranks));
        Ok(())
    }

    /// Says goodbye to every peer and ends the connections.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let g = self.tcp("close")?;
        py.allow_threads(|| g.close());
        Ok(())
    }

    /// This rank wrote bytes `lo..hi` of its slot `slot`.
    fn touch(&self, slot: usize, lo: usize, hi: usize) -> PyResult<()> {
        self.tcp("touch")?
            .touch(slot, lo, hi)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    fn clean(&self, slot: usize) -> PyResult<()> {
        self.tcp("clean")?.clean(slot);
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
        let g = self.tcp("post_parts")?;
        let f = flag(flag_index)?;
        // SAFETY: the caller hands the address and length of a tensor it
        // keeps alive, unwritten, until this returns.
        let src = (addr != 0).then(|| unsafe { bytes(addr, nbytes) });
        py.allow_threads(|| g.post_parts(f, value, &parts, src))
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
        let g = self.tcp("redirect")?;
        self.peer(peer)?;
        let f = flag(flag_index)?;
        // SAFETY: the caller hands a tensor it keeps alive and leaves alone
        // until its end_redirect returns.
        unsafe { g.redirect(peer, f, value, addr as *mut u8, nbytes) }.map_err(err)
    }

    /// Whether `peer`'s redirected payload went into the buffer; waits
    /// out one being written.
    fn end_redirect(&self, py: Python<'_>, peer: usize, timeout_s: f64) -> PyResult<bool> {
        let g = self.tcp("end_redirect")?;
        self.with_peer(py, peer, timeout_s, |_, d| Ok(g.end_redirect(peer, d)))
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
        let g = self.tcp("recv_into")?;
        // SAFETY: as in recv_body.
        let out = unsafe { bytes_mut(addr, nbytes) };
        self.with_peer(py, src, timeout_s, |_, d| g.recv_into(src, tag, out, d))
    }
}

/// A TCP group: this rank's slots for `size` ranks and a listener that
/// takes peers in for as long as the group lives.
#[pyfunction]
pub(crate) fn tcp_group(rank: usize, size: usize, slot_bytes: usize) -> PyResult<PyGroup> {
    Ok(PyGroup::new(Inner::Tcp(
        TcpGroup::new(rank, size, slot_bytes).map_err(err)?,
    )))
}
