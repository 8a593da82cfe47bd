//! `mooncake.engine`: the reference's `TransferEngine` Python class over the
//! Rust [`mooncake_transfer::TransferEngine`].
//!
//! Return conventions follow the reference binding: ints are 0 on success and
//! negative on failure (memory registration returns the reference engine's
//! codes, see [`te_code`]); async submissions return a batch id, 0 on failure.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode};
use mooncake_transfer::{
    BatchId, EngineConfig, Notify, Opcode, SegmentHandle, TransferEngine, TransferRequest,
    TransferState,
};
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::args::{usizes, Unsigned};
use crate::buffer::Bytes;
use crate::mem::{self, Access};

/// The reference engine's numbers for failures its Python methods return
/// as-is (memory registration); everything else is -1 there too.
pub fn te_code(e: &Error) -> i32 {
    match e.code {
        ErrorCode::ERR_TOO_MANY_REQUESTS => -2,
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED => -3,
        ErrorCode::ERR_BATCH_BUSY => -4,
        ErrorCode::ERR_DEVICE_NOT_FOUND => -6,
        ErrorCode::ERR_ADDRESS_OVERLAPPED => -7,
        _ => -1,
    }
}

fn status(r: Result<(), Error>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::warn!("{e}");
            te_code(&e)
        }
    }
}

#[pyclass(module = "mooncake.engine", name = "TransferOpcode", eq, eq_int)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyOpcode {
    Read = 0,
    Write = 1,
}

#[pymethods]
impl PyOpcode {
    #[new]
    fn new(value: i64) -> PyResult<Self> {
        match value {
            0 => Ok(PyOpcode::Read),
            1 => Ok(PyOpcode::Write),
            _ => Err(PyValueError::new_err(format!(
                "{value} is not a valid TransferOpcode"
            ))),
        }
    }

    /// Upper-case aliases used by older docs and scripts.
    #[classattr]
    #[allow(non_snake_case)]
    fn READ() -> PyOpcode {
        PyOpcode::Read
    }

    #[classattr]
    #[allow(non_snake_case)]
    fn WRITE() -> PyOpcode {
        PyOpcode::Write
    }

    #[getter]
    fn name(&self) -> &'static str {
        match self {
            PyOpcode::Read => "Read",
            PyOpcode::Write => "Write",
        }
    }

    #[getter]
    fn value(&self) -> i64 {
        *self as i64
    }

    fn __str__(&self) -> String {
        format!("TransferOpcode.{}", self.name())
    }

    fn __repr__(&self) -> String {
        format!("<TransferOpcode.{}: {}>", self.name(), *self as i64)
    }

    #[classattr]
    fn __members__(py: Python<'_>) -> PyResult<Py<PyDict>> {
        let d = PyDict::new(py);
        for m in [PyOpcode::Read, PyOpcode::Write] {
            d.set_item(m.name(), Py::new(py, m)?)?;
        }
        Ok(d.unbind())
    }
}

impl From<PyOpcode> for Opcode {
    fn from(op: PyOpcode) -> Opcode {
        match op {
            PyOpcode::Read => Opcode::Read,
            PyOpcode::Write => Opcode::Write,
        }
    }
}

/// A notification sent along with a transfer: `TransferNotify(name, msg)`.
#[pyclass(module = "mooncake.engine", name = "TransferNotify", get_all, set_all)]
#[derive(Clone, Debug, Default)]
pub struct PyNotify {
    pub name: String,
    pub msg: String,
}

#[pymethods]
impl PyNotify {
    #[new]
    #[pyo3(signature = (name = String::new(), msg = String::new()))]
    fn new(name: String, msg: String) -> Self {
        PyNotify { name, msg }
    }

    fn __repr__(&self) -> String {
        format!("TransferNotify(name={:?}, msg={:?})", self.name, self.msg)
    }
}

/// The underlying engine, handed to `MooncakeDistributedStore.setup(engine=...)`
/// so a store shares this process's engine instead of starting its own.
#[pyclass(frozen, module = "mooncake.engine", name = "InnerTransferEngine")]
pub struct InnerEngine {
    pub engine: TransferEngine,
}

/// An initialized engine plus the bookkeeping the Python API needs.
struct Ready {
    engine: TransferEngine,
    /// Segment handles by target name, so each peer is resolved once.
    segments: Mutex<HashMap<String, SegmentHandle>>,
    /// Memory known to be valid: registered by the script (after a mapping
    /// check) or allocated by the engine. addr -> length.
    regions: Mutex<mem::Regions>,
    /// Async batches by the id returned to Python (never 0, which means
    /// failure), with the local ranges adopted for them.
    batches: Mutex<HashMap<u64, (BatchId, Vec<usize>)>>,
    /// Unregistered local ranges adopted for running transfers: addr ->
    /// (length, users). See [`Ready::adopt`].
    adopted: Mutex<HashMap<usize, (usize, usize)>>,
    next_batch: AtomicU64,
}

impl Ready {
    fn segment(&self, name: &str) -> Result<SegmentHandle, Error> {
        if let Some(h) = self.segments.lock().get(name) {
            return Ok(*h);
        }
        let h = self.engine.open_segment(name)?;
        self.segments.lock().insert(name.to_owned(), h);
        Ok(h)
    }

    /// Drops a cached handle after a failure, so a restarted peer is resolved again.
    fn forget(&self, name: &str) {
        if let Some(h) = self.segments.lock().remove(name) {
            let _ = self.engine.close_segment(h);
        }
    }

    /// True when `addr..addr+len` lies inside one known region.
    fn known(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.regions
            .lock()
            .containing(addr)
            .is_some_and(|(start, rlen)| end <= start + rlen)
    }

    fn usable(&self, addr: usize, len: usize, access: Access) -> bool {
        self.known(addr, len) || mem::accessible(addr, len, access)
    }

    fn requests(
        &self,
        target: &str,
        op: Opcode,
        locals: &[usize],
        remotes: &[u64],
        lens: &[usize],
    ) -> Result<Vec<TransferRequest>, Error> {
        if locals.len() != remotes.len() || locals.len() != lens.len() {
            return Err(Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                "buffers, peer_buffer_addresses and lengths have different sizes",
            ));
        }
        let target_id = self.segment(target)?;
        Ok((0..locals.len())
            .map(|i| TransferRequest {
                opcode: op,
                source: locals[i],
                target_id,
                target_offset: remotes[i],
                length: lens[i],
            })
            .collect())
    }

    /// Registers, for the duration of a transfer, local ranges the script never
    /// registered: the reference's tcp transport reads and writes any valid
    /// local address, so scripts pass plain numpy or ctypes buffers. Ranges
    /// that are not valid memory are left alone (the engine rejects them).
    /// Returns the adopted addresses, to hand back to [`Ready::release`].
    fn adopt(&self, requests: &[TransferRequest]) -> Vec<usize> {
        let mut taken = Vec::new();
        for r in requests {
            if r.length == 0 || self.known(r.source, r.length) {
                continue;
            }
            {
                let mut adopted = self.adopted.lock();
                if let Some((len, users)) = adopted.get_mut(&r.source) {
                    if *len == r.length {
                        *users += 1;
                        taken.push(r.source);
                    }
                    continue;
                }
            }
            // Reading local memory for a write, filling it for a read.
            let need = match r.opcode {
                Opcode::Write => Access::Read,
                Opcode::Read => Access::Write,
            };
            if !mem::accessible(r.source, r.length, need) {
                continue;
            }
            if self
                .engine
                .register_local_memory(r.source, r.length, "*", false)
                .is_ok()
            {
                self.adopted.lock().insert(r.source, (r.length, 1));
                taken.push(r.source);
            }
        }
        taken
    }

    fn release(&self, taken: Vec<usize>) {
        let mut done = Vec::new();
        {
            let mut adopted = self.adopted.lock();
            for a in taken {
                if let Some((_, users)) = adopted.get_mut(&a) {
                    *users -= 1;
                    if *users == 0 {
                        adopted.remove(&a);
                        done.push(a);
                    }
                }
            }
        }
        if !done.is_empty() {
            let _ = self.engine.unregister_local_memory_batch(&done);
        }
    }

    fn transfer_sync(
        &self,
        target: &str,
        requests: &[TransferRequest],
        notify: Option<Notify>,
    ) -> Result<(), Error> {
        if requests.is_empty() {
            return Ok(());
        }
        let taken = self.adopt(requests);
        let res = self.transfer_registered(requests, notify);
        self.release(taken);
        if res.is_err() {
            self.forget(target);
        }
        res
    }

    /// Moves the bytes, then delivers `notify` (acknowledged by the peer, so
    /// it is in the peer's `get_notifies` when this returns, as in the reference).
    fn transfer_registered(
        &self,
        requests: &[TransferRequest],
        notify: Option<Notify>,
    ) -> Result<(), Error> {
        self.engine.transfer_sync(requests)?;
        match notify {
            Some(n) => self.engine.send_notify(requests[0].target_id, n),
            None => Ok(()),
        }
    }

    fn submit(&self, requests: &[TransferRequest]) -> Result<u64, Error> {
        let batch = self.engine.allocate_batch(requests.len().max(1))?;
        let taken = self.adopt(requests);
        if let Err(e) = self.engine.submit(batch, requests) {
            let _ = self.engine.free_batch(batch);
            self.release(taken);
            return Err(e);
        }
        let id = self.next_batch.fetch_add(1, Ordering::Relaxed);
        self.batches.lock().insert(id, (batch, taken));
        Ok(id)
    }

    /// 1 done, 0 running, -1 failed (or unknown id), -2 timed out. A finished
    /// batch is freed, as in the reference.
    fn check(&self, id: u64) -> i32 {
        let Some(batch) = self.batches.lock().get(&id).map(|b| b.0) else {
            return -1;
        };
        let code = match self.engine.batch_status(batch) {
            Ok(s) => match s.state {
                TransferState::Waiting | TransferState::Pending => return 0,
                TransferState::Completed => 1,
                TransferState::Timeout => -2,
                TransferState::Failed | TransferState::Invalid | TransferState::Canceled => -1,
            },
            Err(_) => -1,
        };
        self.finish(id, batch);
        code
    }

    /// Blocks until batch `id` finishes; true when every request completed.
    fn wait(&self, id: u64) -> bool {
        let Some(batch) = self.batches.lock().get(&id).map(|b| b.0) else {
            return false;
        };
        let ok =
            matches!(self.engine.wait_batch(batch), Ok(s) if s.state == TransferState::Completed);
        self.finish(id, batch);
        ok
    }

    fn finish(&self, id: u64, batch: BatchId) {
        let entry = self.batches.lock().remove(&id);
        let _ = self.engine.free_batch(batch);
        if let Some((_, taken)) = entry {
            self.release(taken);
        }
    }

    fn register(&self, addr: usize, len: usize, location: &str) -> Result<(), Error> {
        if len == 0 {
            return Err(Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                "zero-length memory region",
            ));
        }
        if !mem::accessible(addr, len, Access::Write) {
            return Err(Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                format!("{addr:#x}+{len} is not writable memory of this process"),
            ));
        }
        self.engine
            .register_local_memory(addr, len, location, true)?;
        self.regions.lock().insert(addr, len);
        Ok(())
    }
}

/// `mooncake.engine.TransferEngine`.
#[pyclass(frozen, module = "mooncake.engine", name = "TransferEngine")]
pub struct PyEngine {
    state: RwLock<Option<Arc<Ready>>>,
}

impl Drop for PyEngine {
    /// Stopping an engine removes its metadata keys (network calls): done
    /// without holding the GIL.
    fn drop(&mut self) {
        if let Some(ready) = self.state.get_mut().take() {
            Python::with_gil(|py| py.allow_threads(move || drop(ready)));
        }
    }
}

impl PyEngine {
    fn ready(&self) -> Option<Arc<Ready>> {
        self.state.read().clone()
    }

    /// The engine, for a store sharing it.
    pub fn engine(&self) -> Option<TransferEngine> {
        self.ready().map(|r| r.engine.clone())
    }

    fn start(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        let metadata_server = metadata_or_env(metadata_server);
        let mut config = EngineConfig::new(&metadata_server, local_hostname);
        config.protocol = protocol.to_owned();
        config.device_name = device_name.to_owned();
        // The previous engine goes first: the new one may reuse its name and port.
        let old = self.state.write().take();
        match py.allow_threads(move || {
            drop(old);
            TransferEngine::new(config)
        }) {
            Ok(engine) => {
                let ready = Ready {
                    engine,
                    segments: Mutex::new(HashMap::new()),
                    regions: Mutex::new(mem::Regions::default()),
                    batches: Mutex::new(HashMap::new()),
                    adopted: Mutex::new(HashMap::new()),
                    next_batch: AtomicU64::new(1),
                };
                *self.state.write() = Some(Arc::new(ready));
                0
            }
            Err(e) => {
                tracing::error!("TransferEngine.initialize failed: {e}");
                -1
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn sync(
        &self,
        py: Python<'_>,
        target: &str,
        op: Opcode,
        locals: &[usize],
        remotes: &[u64],
        lens: &[usize],
        notify: Option<Notify>,
    ) -> i32 {
        let Some(r) = self.ready() else { return -1 };
        py.allow_threads(|| {
            let res = r
                .requests(target, op, locals, remotes, lens)
                .and_then(|reqs| r.transfer_sync(target, &reqs, notify));
            match res {
                Ok(()) => 0,
                Err(e) => {
                    tracing::warn!("transfer to {target} failed: {e}");
                    -1
                }
            }
        })
    }

    /// Submits without waiting; the batch id, or 0 on failure.
    fn submit(
        &self,
        py: Python<'_>,
        target: &str,
        op: Opcode,
        locals: &[usize],
        remotes: &[u64],
        lens: &[usize],
    ) -> u64 {
        let Some(r) = self.ready() else { return 0 };
        py.allow_threads(|| {
            match r
                .requests(target, op, locals, remotes, lens)
                .and_then(|reqs| r.submit(&reqs))
            {
                Ok(id) => id,
                Err(e) => {
                    tracing::warn!("submit to {target} failed: {e}");
                    r.forget(target);
                    0
                }
            }
        })
    }
}

fn remotes(v: &[Unsigned]) -> Vec<u64> {
    v.iter().map(|u| u.0).collect()
}

fn notify_of(n: Option<PyRef<'_, PyNotify>>) -> Option<Notify> {
    n.map(|n| Notify {
        name: n.name.clone(),
        msg: n.msg.clone(),
    })
}

#[pymethods]
impl PyEngine {
    #[new]
    fn new() -> Self {
        crate::init_logging();
        PyEngine {
            state: RwLock::new(None),
        }
    }

    /// Starts the engine; 0 on success, -1 on failure. Calling it again
    /// replaces the running engine.
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        self.start(py, local_hostname, metadata_server, protocol, device_name)
    }

    /// Like `initialize`, with the metadata backend named separately
    /// (`etcd`, `redis`, `http`, `P2PHANDSHAKE`) for a bare `host:port` server.
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
        metadata_type: &str,
    ) -> i32 {
        let server = if metadata_server.contains("://")
            || metadata_server == "P2PHANDSHAKE"
            || metadata_type.is_empty()
            || metadata_type.eq_ignore_ascii_case("p2phandshake")
        {
            metadata_server.to_owned()
        } else {
            format!("{}://{metadata_server}", metadata_type.to_ascii_lowercase())
        };
        self.start(py, local_hostname, &server, protocol, device_name)
    }

    /// The engine's RPC port (the port peers reach it on); 0 before `initialize`.
    fn get_rpc_port(&self) -> u16 {
        self.ready().map_or(0, |r| r.engine.rpc_port())
    }

    fn get_engine(&self) -> PyResult<InnerEngine> {
        self.engine()
            .map(|engine| InnerEngine { engine })
            .ok_or_else(|| PyValueError::new_err("TransferEngine is not initialized"))
    }

    /// An opaque non-zero id of the underlying engine (0 before `initialize`).
    fn get_engine_ptr(&self) -> usize {
        self.ready().map_or(0, |r| Arc::as_ptr(&r) as usize)
    }

    /// Allocates engine-owned, registered memory; its address, or 0 on failure.
    fn allocate_managed_buffer(&self, py: Python<'_>, length: Unsigned) -> usize {
        let Some(r) = self.ready() else { return 0 };
        // A zero-byte request still gets a distinct buffer, as in the reference.
        let len = length.usize().max(1);
        // Shared memory is sparse: a buffer larger than the machine's memory
        // would be granted and then fault (SIGBUS) when touched.
        if len as u64 > physical_memory() {
            return 0;
        }
        match py.allow_threads(|| r.engine.allocate_managed_buffer(len)) {
            Ok(addr) => {
                r.regions.lock().insert(addr, len);
                addr
            }
            Err(e) => {
                tracing::warn!("allocate_managed_buffer({len}) failed: {e}");
                0
            }
        }
    }

    /// Frees a buffer from `allocate_managed_buffer`. Like the reference it
    /// returns 0 even for an address it does not know (and then does nothing).
    fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: Unsigned, length: Unsigned) -> i32 {
        let Some(r) = self.ready() else { return 0 };
        let addr = buffer_addr.usize();
        let Some(len) = r.regions.lock().remove(addr) else {
            return 0;
        };
        let _ = length;
        if let Err(e) = py.allow_threads(|| r.engine.free_managed_buffer(addr, len)) {
            tracing::warn!("free_managed_buffer({addr:#x}) failed: {e}");
        }
        0
    }

    /// Copies `length` bytes of `src` (bytes, bytearray, str or buffer) to
    /// `dest_address`; 0 on success, -1 when the destination is not writable
    /// memory. Only `min(length, len(src))` bytes exist to copy.
    fn write_bytes_to_buffer(
        &self,
        py: Python<'_>,
        dest_address: Unsigned,
        src: &Bound<'_, PyAny>,
        length: Unsigned,
    ) -> PyResult<i32> {
        let data = Bytes::get(src)?;
        let (dst, len) = (dest_address.usize(), length.usize());
        let bytes = data.as_slice();
        let bytes = &bytes[..bytes.len().min(len)];
        let ok = match self.ready() {
            Some(r) => r.usable(dst, len, Access::Write),
            None => mem::accessible(dst, len, Access::Write),
        };
        if !ok || mem::span(dst, len).is_none() {
            return Ok(-1);
        }
        py.allow_threads(|| {
            // SAFETY: `dst..dst+len` was checked writable just above. The
            // reference copies `length` bytes whatever the data's size; past
            // the data we write zeros (it reads beyond the object).
            unsafe {
                mem::copy_to(dst, bytes);
                std::ptr::write_bytes((dst + bytes.len()) as *mut u8, 0, len - bytes.len());
            }
        });
        Ok(0)
    }

    /// Reads `length` bytes at `source_address` into a new `bytes`.
    fn read_bytes_from_buffer<'py>(
        &self,
        py: Python<'py>,
        source_address: Unsigned,
        length: Unsigned,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let (src, len) = (source_address.usize(), length.usize());
        if len == 0 {
            return Ok(PyBytes::new(py, b""));
        }
        let ok = match self.ready() {
            Some(r) => r.usable(src, len, Access::Read),
            None => mem::accessible(src, len, Access::Read),
        };
        if !ok {
            return Err(PyValueError::new_err(format!(
                "{src:#x}+{len} is not readable memory of this process"
            )));
        }
        PyBytes::new_with(py, len, |out| {
            // SAFETY: the source range was checked readable just above.
            py.allow_threads(|| out.copy_from_slice(unsafe { mem::slice_at(src, len) }));
            Ok(())
        })
    }

    #[pyo3(signature = (buffer_addr, capacity, location = "*"))]
    fn register_memory(
        &self,
        py: Python<'_>,
        buffer_addr: Unsigned,
        capacity: Unsigned,
        location: &str,
    ) -> i32 {
        let Some(r) = self.ready() else { return -1 };
        py.allow_threads(|| status(r.register(buffer_addr.usize(), capacity.usize(), location)))
    }

    fn unregister_memory(&self, py: Python<'_>, buffer_addr: Unsigned) -> i32 {
        let Some(r) = self.ready() else { return -1 };
        let addr = buffer_addr.usize();
        py.allow_threads(|| {
            let res = r.engine.unregister_local_memory(addr);
            if res.is_ok() {
                r.regions.lock().remove(addr);
            }
            status(res)
        })
    }

    #[pyo3(signature = (buffer_addresses, capacities, location = "*"))]
    fn batch_register_memory(
        &self,
        py: Python<'_>,
        buffer_addresses: Vec<Unsigned>,
        capacities: Vec<Unsigned>,
        location: &str,
    ) -> i32 {
        let Some(r) = self.ready() else { return -1 };
        if buffer_addresses.len() != capacities.len() {
            return -1;
        }
        let (addrs, lens) = (usizes(&buffer_addresses), usizes(&capacities));
        py.allow_threads(|| {
            for (&a, &l) in addrs.iter().zip(&lens) {
                if l == 0 || !mem::accessible(a, l, Access::Write) {
                    return -1;
                }
            }
            let pairs: Vec<(usize, usize)> =
                addrs.iter().copied().zip(lens.iter().copied()).collect();
            let res = r.engine.register_local_memory_batch(&pairs, location);
            if res.is_ok() {
                let mut regions = r.regions.lock();
                for (a, l) in pairs {
                    regions.insert(a, l);
                }
            }
            status(res)
        })
    }

    fn batch_unregister_memory(&self, py: Python<'_>, buffer_addresses: Vec<Unsigned>) -> i32 {
        let Some(r) = self.ready() else { return -1 };
        let addrs = usizes(&buffer_addresses);
        py.allow_threads(|| {
            let res = r.engine.unregister_local_memory_batch(&addrs);
            if res.is_ok() {
                let mut regions = r.regions.lock();
                for &a in &addrs {
                    regions.remove(a);
                }
            }
            status(res)
        })
    }

    /// Address of the first registered buffer of `segment_name`; 0 when the
    /// segment is unknown or has none.
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: &str) -> u64 {
        let Some(r) = self.ready() else { return 0 };
        py.allow_threads(|| r.engine.first_buffer_address(segment_name).unwrap_or(0))
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: Unsigned,
        peer_buffer_address: Unsigned,
        length: Unsigned,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        self.sync(
            py,
            target_hostname,
            Opcode::Write,
            &[buffer.usize()],
            &[peer_buffer_address.0],
            &[length.usize()],
            None,
        )
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: Unsigned,
        peer_buffer_address: Unsigned,
        length: Unsigned,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        self.sync(
            py,
            target_hostname,
            Opcode::Read,
            &[buffer.usize()],
            &[peer_buffer_address.0],
            &[length.usize()],
            None,
        )
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: Unsigned,
        peer_buffer_address: Unsigned,
        length: Unsigned,
        opcode: PyOpcode,
        notify: Option<PyRef<'_, PyNotify>>,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        let notify = notify_of(notify);
        self.sync(
            py,
            target_hostname,
            opcode.into(),
            &[buffer.usize()],
            &[peer_buffer_address.0],
            &[length.usize()],
            notify,
        )
    }

    /// Starts one write and returns its batch id (0 on failure); poll it with
    /// `transfer_check_status`.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_submit_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: Unsigned,
        peer_buffer_address: Unsigned,
        length: Unsigned,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        self.submit(
            py,
            target_hostname,
            Opcode::Write,
            &[buffer.usize()],
            &[peer_buffer_address.0],
            &[length.usize()],
        )
    }

    /// 1 completed, 0 still running, -1 failed, -2 timed out.
    fn transfer_check_status(&self, py: Python<'_>, batch_id: Unsigned) -> i32 {
        let Some(r) = self.ready() else { return -1 };
        py.allow_threads(|| r.check(batch_id.0))
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Unsigned>,
        peer_buffer_addresses: Vec<Unsigned>,
        lengths: Vec<Unsigned>,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        self.sync(
            py,
            target_hostname,
            Opcode::Write,
            &usizes(&buffers),
            &remotes(&peer_buffer_addresses),
            &usizes(&lengths),
            None,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Unsigned>,
        peer_buffer_addresses: Vec<Unsigned>,
        lengths: Vec<Unsigned>,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        self.sync(
            py,
            target_hostname,
            Opcode::Read,
            &usizes(&buffers),
            &remotes(&peer_buffer_addresses),
            &usizes(&lengths),
            None,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Unsigned>,
        peer_buffer_addresses: Vec<Unsigned>,
        lengths: Vec<Unsigned>,
        opcode: PyOpcode,
        notify: Option<PyRef<'_, PyNotify>>,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        let notify = notify_of(notify);
        self.sync(
            py,
            target_hostname,
            opcode.into(),
            &usizes(&buffers),
            &remotes(&peer_buffer_addresses),
            &usizes(&lengths),
            notify,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_async_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Unsigned>,
        peer_buffer_addresses: Vec<Unsigned>,
        lengths: Vec<Unsigned>,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        self.submit(
            py,
            target_hostname,
            Opcode::Write,
            &usizes(&buffers),
            &remotes(&peer_buffer_addresses),
            &usizes(&lengths),
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_async_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Unsigned>,
        peer_buffer_addresses: Vec<Unsigned>,
        lengths: Vec<Unsigned>,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        self.submit(
            py,
            target_hostname,
            Opcode::Read,
            &usizes(&buffers),
            &remotes(&peer_buffer_addresses),
            &usizes(&lengths),
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_async(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Unsigned>,
        peer_buffer_addresses: Vec<Unsigned>,
        lengths: Vec<Unsigned>,
        opcode: PyOpcode,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        self.submit(
            py,
            target_hostname,
            opcode.into(),
            &usizes(&buffers),
            &remotes(&peer_buffer_addresses),
            &usizes(&lengths),
        )
    }

    /// Waits for every batch in `batch_ids`; 0 when all completed, -1 when any
    /// failed, timed out or is unknown. Each batch is freed.
    fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<Unsigned>) -> i32 {
        let Some(r) = self.ready() else { return -1 };
        py.allow_threads(|| {
            // Wait for all of them even after a failure, so none is left behind.
            let mut ok = true;
            for id in &batch_ids {
                ok &= r.wait(id.0);
            }
            if ok {
                0
            } else {
                -1
            }
        })
    }

    /// Checks that `peer_server_name` is reachable; 0 when it is, the
    /// reference's metadata failure code (-200) when not.
    fn send_probe(&self, py: Python<'_>, peer_server_name: &str) -> i32 {
        let Some(r) = self.ready() else { return -1 };
        py.allow_threads(|| match r.segment(peer_server_name) {
            Ok(_) => 0,
            Err(_) => -200,
        })
    }

    /// The local topology as JSON: each NUMA node `cpu:N` with its preferred
    /// and available NICs (none are used by the tcp transport).
    #[pyo3(signature = (device_name = None))]
    fn get_local_topology(&self, device_name: Option<&str>) -> String {
        let _ = device_name;
        topology_json(numa_nodes())
    }

    /// Drains the notifications other engines sent to this one.
    fn get_notifies(&self, py: Python<'_>) -> Vec<PyNotify> {
        let Some(r) = self.ready() else {
            return Vec::new();
        };
        py.allow_threads(|| r.engine.get_notifies())
            .into_iter()
            .map(|n| PyNotify {
                name: n.name,
                msg: n.msg,
            })
            .collect()
    }
}

/// `server`, or when it is empty `MC_METADATA_SERVER` (then `P2PHANDSHAKE`).
pub fn metadata_or_env(server: &str) -> String {
    if !server.trim().is_empty() {
        return server.to_owned();
    }
    std::env::var("MC_METADATA_SERVER")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "P2PHANDSHAKE".to_owned())
}

/// Bytes of RAM on this machine (u64::MAX when unknown).
fn physical_memory() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return u64::MAX;
    }
    (pages as u64).saturating_mul(page as u64)
}

fn numa_nodes() -> Vec<u32> {
    let mut nodes: Vec<u32> = std::fs::read_dir("/sys/devices/system/node")
        .map(|dir| {
            dir.filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_prefix("node")?
                    .parse()
                    .ok()
            })
            .collect()
        })
        .unwrap_or_default();
    nodes.sort_unstable();
    if nodes.is_empty() {
        nodes.push(0);
    }
    nodes
}

/// The reference's topology JSON (jsoncpp's styled layout) for `nodes`
/// without NICs.
fn topology_json(nodes: Vec<u32>) -> String {
    let entries: Vec<String> = nodes
        .iter()
        .map(|n| format!("\t\"cpu:{n}\" : \n\t[\n\t\t[],\n\t\t[]\n\t]"))
        .collect();
    format!("{{\n{}\n}}\n", entries.join(",\n"))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngine>()?;
    m.add_class::<PyOpcode>()?;
    m.add_class::<PyNotify>()?;
    m.add_class::<InnerEngine>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_matches_the_reference_layout() {
        assert_eq!(
            topology_json(vec![0]),
            "{\n\t\"cpu:0\" : \n\t[\n\t\t[],\n\t\t[]\n\t]\n}\n"
        );
        let two = topology_json(vec![0, 1]);
        assert!(two.contains("\t],\n\t\"cpu:1\""));
        assert!(serde_json_like_balanced(&two));
    }

    fn serde_json_like_balanced(s: &str) -> bool {
        s.matches('[').count() == s.matches(']').count()
            && s.matches('{').count() == s.matches('}').count()
    }

    #[test]
    fn reference_codes_for_engine_errors() {
        assert_eq!(te_code(&Error::from(ErrorCode::ERR_ADDRESS_OVERLAPPED)), -7);
        assert_eq!(
            te_code(&Error::from(ErrorCode::ERR_ADDRESS_NOT_REGISTERED)),
            -3
        );
        assert_eq!(te_code(&Error::from(ErrorCode::ERR_INVALID_ARGUMENT)), -1);
        assert_eq!(te_code(&Error::from(ErrorCode::ERR_METADATA)), -1);
    }
}
