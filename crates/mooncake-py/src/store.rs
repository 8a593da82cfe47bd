//! `mooncake.store.MooncakeDistributedStore` over the Rust store
//! [`Client`](mooncake_store::Client).
//!
//! Return conventions are the reference's (see docs/reference-behaviour.md):
//! ints are 0 or a negative store error code, missing objects read as `b""` or
//! `None`, wrong argument types raise `TypeError`. Every call that talks to
//! the cluster releases the GIL.
//!
//! Raw addresses from Python are used directly only when they lie inside
//! memory registered through `register_buffer` (checked to be mapped then) or
//! handed out by `alloc_from_mem_pool`. Any other address is checked against
//! this process's mappings and, when valid, served through a copy (the
//! reference accepts unregistered memory); an invalid one is `INVALID_PARAMS`.

use std::collections::BTreeMap;
use std::sync::Arc;

use mooncake_common::size::parse_size;
use mooncake_common::{Error, ErrorCode};
use mooncake_store::client::ClientConfig;
use mooncake_store::types::{self, ReplicaDesc, ReplicaKind};
use mooncake_store::Client;
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::args::{keys, usizes, Flag, Key, Unsigned};
use crate::buffer::Exported;
use crate::config::ReplicateConfig;
use crate::engine::InnerEngine;
use crate::enums::{ReplicaStatus, TaskStatus, TaskType};
use crate::handle::BufferHandle;
use crate::mem::{self, Access};

const MIB: u64 = 1 << 20;
/// What calls return on a store that is not set up (the reference crashes).
const NOT_READY: i32 = ErrorCode::INTERNAL_ERROR as i32;
const INVALID: i32 = ErrorCode::INVALID_PARAMS as i32;
const NOT_FOUND: i32 = ErrorCode::OBJECT_NOT_FOUND as i32;

/// The number a failed call returns, in the reference's Python API terms: a
/// destination smaller than the object, a bad key or an unregistered
/// destination are INVALID_PARAMS; a cluster without a segment to place an
/// object in is NO_AVAILABLE_HANDLE.
fn code(e: &Error) -> i32 {
    match e.code {
        ErrorCode::BUFFER_OVERFLOW
        | ErrorCode::INVALID_KEY
        | ErrorCode::ERR_ADDRESS_NOT_REGISTERED
        | ErrorCode::ERR_INVALID_ARGUMENT => INVALID,
        ErrorCode::SEGMENT_NOT_FOUND => ErrorCode::NO_AVAILABLE_HANDLE.code(),
        c => c.code(),
    }
}

/// 0 or the code. A put of an existing key is a success that keeps the
/// stored value ("first write wins"), as in the reference.
fn status(r: Result<(), Error>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) if e.code == ErrorCode::OBJECT_ALREADY_EXISTS => 0,
        Err(e) => {
            tracing::debug!("{e}");
            code(&e)
        }
    }
}

fn rust_cfg(cfg: Option<PyRef<'_, ReplicateConfig>>) -> Result<types::ReplicateConfig, i32> {
    let Some(c) = cfg else {
        return Ok(types::ReplicateConfig {
            replica_num: 1,
            ..Default::default()
        });
    };
    if c.replica_num == 0 {
        return Err(INVALID);
    }
    Ok(types::ReplicateConfig {
        replica_num: c.replica_num as usize,
        with_soft_pin: c.soft_pin_action == crate::enums::SoftPinAction::ENABLE,
        with_hard_pin: c.with_hard_pin,
        preferred_segment: c.preferred_segment.clone(),
        preferred_segments: c.preferred_segments.clone(),
        prefer_alloc_in_same_node: c.prefer_alloc_in_same_node,
    })
}

/// A set-up client and the memory this binding vouches for.
struct Live {
    client: Client,
    /// Registered by the script (validated then): addr -> length.
    registered: Mutex<mem::Regions>,
    /// Handed out by `alloc_from_mem_pool`: addr -> length.
    pool: Mutex<BTreeMap<usize, usize>>,
}

fn region_containing(map: &BTreeMap<usize, usize>, addr: usize) -> Option<(usize, usize)> {
    map.range(..=addr)
        .next_back()
        .map(|(&a, &l)| (a, l))
        .filter(|&(a, l)| addr < a + l)
}

impl Live {
    /// End of the vouched-for region that contains `addr`.
    fn region_end(&self, addr: usize) -> Option<usize> {
        let r = self
            .registered
            .lock()
            .containing(addr)
            .or_else(|| region_containing(&self.pool.lock(), addr));
        r.map(|(a, l)| a + l)
    }

    /// Whether `addr..addr+len` lies inside one vouched-for region.
    fn direct(&self, addr: usize, len: usize) -> bool {
        match (self.region_end(addr), addr.checked_add(len)) {
            (Some(end), Some(stop)) => stop <= end,
            _ => false,
        }
    }
}

/// How a caller's memory range can be used.
enum Mem {
    /// Registered or pool memory: the client moves bytes in place.
    Direct,
    /// Valid memory the client does not know: served through a copy.
    Copy,
    Bad,
}

fn classify(live: &Live, addr: usize, len: usize, access: Access) -> Mem {
    if addr == 0 || len == 0 {
        Mem::Bad
    } else if live.direct(addr, len) {
        Mem::Direct
    } else if mem::accessible(addr, len, access) {
        Mem::Copy
    } else {
        Mem::Bad
    }
}

fn per_key_codes(n: usize, r: Result<Vec<Result<(), Error>>, Error>) -> Vec<i32> {
    match r {
        Ok(v) => v.into_iter().map(status).collect(),
        Err(e) => vec![code(&e); n],
    }
}

fn first_error(r: Result<Vec<Result<(), Error>>, Error>) -> i32 {
    match r {
        Ok(v) => v.into_iter().map(status).find(|&c| c != 0).unwrap_or(0),
        Err(e) => code(&e),
    }
}

fn exist_code(r: Result<bool, Error>) -> i32 {
    match r {
        Ok(true) => 1,
        Ok(false) => 0,
        Err(e)
            if matches!(
                e.code,
                ErrorCode::OBJECT_NOT_FOUND | ErrorCode::INVALID_KEY | ErrorCode::INVALID_PARAMS
            ) =>
        {
            0
        }
        Err(_) => -1,
    }
}

/// Copies `src` into caller memory.
///
/// # Safety
/// `classify(live, addr, n, Access::Write)` with `n >= src.len()` must have
/// answered `Direct` or `Copy` during the current call (so the range is
/// registered, pool or writable mapped memory of this process).
unsafe fn copy_out(addr: usize, src: &[u8]) {
    // SAFETY: guaranteed by the caller.
    unsafe { mem::copy_to(addr, src) }
}

/// Borrows `len` bytes of caller memory for the rest of the current call.
///
/// # Safety
/// `classify(live, addr, len, Access::Read)` must have answered `Direct` or
/// `Copy` during the current call, and the slice must not outlive it (the
/// script may free the memory afterwards).
unsafe fn view<'a>(addr: usize, len: usize) -> &'a [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { mem::slice_at(addr, len) }
}

/// `mooncake.store.MooncakeDistributedStore`.
#[pyclass(
    subclass,
    frozen,
    module = "mooncake.store",
    name = "MooncakeDistributedStore"
)]
pub struct PyStore {
    state: RwLock<Option<Arc<Live>>>,
}

impl Drop for PyStore {
    /// A store collected while set up leaves the cluster without holding the
    /// GIL (its engine may wait on a metadata server served by Python).
    fn drop(&mut self) {
        if let Some(live) = self.state.get_mut().take() {
            Python::with_gil(|py| py.allow_threads(move || drop(live)));
        }
    }
}

impl PyStore {
    fn live(&self) -> Option<Arc<Live>> {
        self.state.read().clone()
    }

    fn start(&self, py: Python<'_>, make: impl FnOnce() -> Result<Client, Error> + Send) -> i32 {
        // A second setup on a live object replaces it, as in the reference.
        let old = self.state.write().take();
        py.allow_threads(|| {
            if let Some(old) = old {
                let _ = old.client.close();
            }
            match make() {
                Ok(client) => {
                    let live = Live {
                        client,
                        registered: Mutex::new(mem::Regions::default()),
                        pool: Mutex::new(BTreeMap::new()),
                    };
                    *self.state.write() = Some(Arc::new(live));
                    0
                }
                // The reference answers -1 for any failure to join (master or
                // metadata server unreachable, unknown protocol), -600 for bad
                // arguments.
                Err(e) => {
                    tracing::error!("store setup failed: {e}");
                    if e.code == ErrorCode::INVALID_PARAMS {
                        INVALID
                    } else {
                        NOT_READY
                    }
                }
            }
        })
    }

    fn setup_config(&self, py: Python<'_>, mut cfg: ClientConfig) -> i32 {
        cfg.metadata_server = crate::engine::metadata_or_env(&cfg.metadata_server);
        if cfg.protocol.is_empty() {
            cfg.protocol = "tcp".into();
        }
        if let Err(e) = cfg.validate() {
            return code(&e);
        }
        self.start(py, move || Client::setup(&cfg))
    }

    fn write_from(
        &self,
        py: Python<'_>,
        key: &str,
        addr: usize,
        size: usize,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> i32 {
        let Some(live) = self.live() else {
            return NOT_READY;
        };
        let cfg = match rust_cfg(cfg) {
            Ok(c) => c,
            Err(c) => return c,
        };
        if size == 0 && addr != 0 {
            return 0;
        }
        py.allow_threads(|| match classify(&live, addr, size, Access::Read) {
            Mem::Direct if upsert => status(live.client.upsert_from(key, addr, size, &cfg)),
            Mem::Direct => status(live.client.put_from(key, addr, size, &cfg)),
            Mem::Copy => {
                // SAFETY: `classify` just answered `Copy` for this range.
                let v = unsafe { view(addr, size) };
                status(if upsert {
                    live.client.upsert(key, v, &cfg)
                } else {
                    live.client.put(key, v, &cfg)
                })
            }
            Mem::Bad => INVALID,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn batch_write_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        addrs: Vec<usize>,
        sizes: Vec<usize>,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> Vec<i32> {
        let n = keys.len();
        let Some(live) = self.live() else {
            return vec![NOT_READY; n];
        };
        if addrs.len() != n || sizes.len() != n {
            return vec![INVALID; n];
        }
        let cfg = match rust_cfg(cfg) {
            Ok(c) => c,
            Err(c) => return vec![c; n],
        };
        py.allow_threads(|| {
            let mut out = vec![0; n];
            let (mut direct, mut copied) = (Vec::new(), Vec::new());
            for i in 0..n {
                if sizes[i] == 0 && addrs[i] != 0 {
                    continue;
                }
                match classify(&live, addrs[i], sizes[i], Access::Read) {
                    Mem::Direct => direct.push(i),
                    Mem::Copy => copied.push(i),
                    Mem::Bad => out[i] = INVALID,
                }
            }
            if !direct.is_empty() {
                let k: Vec<String> = direct.iter().map(|&i| keys[i].clone()).collect();
                let a: Vec<usize> = direct.iter().map(|&i| addrs[i]).collect();
                let s: Vec<usize> = direct.iter().map(|&i| sizes[i]).collect();
                let r = if upsert {
                    live.client.batch_upsert_from(&k, &a, &s, &cfg)
                } else {
                    live.client.batch_put_from(&k, &a, &s, &cfg)
                };
                for (c, &i) in per_key_codes(direct.len(), r).into_iter().zip(&direct) {
                    out[i] = c;
                }
            }
            if !copied.is_empty() {
                let k: Vec<String> = copied.iter().map(|&i| keys[i].clone()).collect();
                let v: Vec<&[u8]> = copied
                    .iter()
                    // SAFETY: `classify` answered `Copy` for each copied range above.
                    .map(|&i| unsafe { view(addrs[i], sizes[i]) })
                    .collect();
                let r = if upsert {
                    live.client.upsert_batch(&k, &v, &cfg)
                } else {
                    live.client.put_batch(&k, &v, &cfg)
                };
                for (c, &i) in per_key_codes(copied.len(), r).into_iter().zip(&copied) {
                    out[i] = c;
                }
            }
            out
        })
    }

    fn write_bytes(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &[Exported],
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> i32 {
        let Some(live) = self.live() else {
            return NOT_READY;
        };
        let cfg = match rust_cfg(cfg) {
            Ok(c) => c,
            Err(c) => return c,
        };
        let slices: Vec<&[u8]> = parts.iter().map(Exported::as_slice).collect();
        py.allow_threads(|| {
            let r = if upsert {
                live.client.upsert_parts(key, &slices, &cfg)
            } else {
                live.client.put_parts(key, &slices, &cfg)
            };
            status(r)
        })
    }

    fn write_batch(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        values: &Bound<'_, PyAny>,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<i32> {
        let values: Vec<Bound<'_, PyAny>> = values.extract()?;
        let values = values
            .iter()
            .map(Exported::get)
            .collect::<PyResult<Vec<_>>>()?;
        let Some(live) = self.live() else {
            return Ok(NOT_READY);
        };
        if keys.len() != values.len() {
            return Ok(INVALID);
        }
        let cfg = match rust_cfg(cfg) {
            Ok(c) => c,
            Err(c) => return Ok(c),
        };
        let keys = self::keys(keys);
        let slices: Vec<&[u8]> = values.iter().map(Exported::as_slice).collect();
        Ok(py.allow_threads(|| {
            if keys.is_empty() {
                return 0;
            }
            let r = if upsert {
                live.client.upsert_batch(&keys, &slices, &cfg)
            } else {
                live.client.put_batch(&keys, &slices, &cfg)
            };
            first_error(r)
        }))
    }
}

/// A new `bytes` object of `size` bytes whose contents are not initialised,
/// with its buffer, for a `get` to fill before Python sees the object.
fn uninit_bytes<'a>(py: Python<'_>, size: usize) -> Result<(Py<PyBytes>, &'a mut [u8]), Error> {
    let len = pyo3::ffi::Py_ssize_t::try_from(size)
        .map_err(|_| Error::new(ErrorCode::INVALID_PARAMS, "object too large for bytes"))?;
    // SAFETY: a NULL source asks CPython for a fresh, uninitialised bytes
    // object of `len` bytes (NULL back on failure, with an exception set).
    let obj = unsafe { pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len) };
    if obj.is_null() {
        let e = PyErr::fetch(py);
        return Err(Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()));
    }
    // SAFETY: `obj` is a new reference to a bytes object, handed to `Py`.
    let bytes: Py<PyBytes> = unsafe { Py::from_owned_ptr(py, obj) };
    // SAFETY: a bytes object's buffer holds `len` bytes (plus a NUL) and
    // lives as long as the object, which the caller keeps in `Py` while
    // filling it; nobody else can see the object before it is returned.
    let buf = unsafe {
        std::slice::from_raw_parts_mut(pyo3::ffi::PyBytes_AsString(obj).cast::<u8>(), size)
    };
    Ok((bytes, buf))
}

fn parts_of(parts: &Bound<'_, PyTuple>) -> PyResult<Vec<Exported>> {
    parts.iter().map(|p| Exported::get(&p)).collect()
}

fn dict_size(d: &Bound<'_, PyDict>, key: &str, default: u64) -> Result<u64, i32> {
    let Ok(Some(v)) = d.get_item(key) else {
        return Ok(default);
    };
    if let Ok(n) = v.extract::<i64>() {
        return u64::try_from(n).map_err(|_| INVALID);
    }
    if let Ok(s) = v.extract::<String>() {
        return parse_size(&s).map_err(|e| code(&e));
    }
    Err(INVALID)
}

fn dict_str(d: &Bound<'_, PyDict>, key: &str) -> Option<String> {
    d.get_item(key)
        .ok()
        .flatten()
        .and_then(|v| v.extract::<String>().ok())
}

#[pymethods]
impl PyStore {
    #[new]
    fn new() -> Self {
        crate::init_logging();
        PyStore {
            state: RwLock::new(None),
        }
    }

    // ---- lifecycle ----------------------------------------------------------

    /// `setup(local_hostname, metadata_server, global_segment_size=16MiB,
    /// local_buffer_size=1GiB, protocol="tcp", rdma_devices="",
    /// master_server_addr="127.0.0.1:50051", engine=None, ...)`, or
    /// `setup(config_dict)` with the same keys (sizes may be strings such as
    /// `"16 MB"`). Returns 0 or a negative code.
    #[pyo3(signature = (
        local_hostname, metadata_server = None, global_segment_size = None, local_buffer_size = None,
        protocol = None, rdma_devices = None, master_server_addr = None, engine = None,
        enable_ssd_offload = Flag(false), ssd_offload_path = None, tenant_id = None,
        enable_client_http_server = Flag(false), client_http_port = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn setup(
        &self,
        py: Python<'_>,
        local_hostname: &Bound<'_, PyAny>,
        metadata_server: Option<String>,
        global_segment_size: Option<Unsigned>,
        local_buffer_size: Option<Unsigned>,
        protocol: Option<String>,
        rdma_devices: Option<String>,
        master_server_addr: Option<String>,
        engine: Option<PyRef<'_, InnerEngine>>,
        enable_ssd_offload: Flag,
        ssd_offload_path: Option<String>,
        tenant_id: Option<String>,
        enable_client_http_server: Flag,
        client_http_port: Option<Unsigned>,
    ) -> PyResult<i32> {
        let _ = (
            engine,
            enable_ssd_offload,
            ssd_offload_path,
            tenant_id,
            enable_client_http_server,
            client_http_port,
        );
        if let Ok(d) = local_hostname.downcast::<PyDict>() {
            if metadata_server.is_some() {
                return Err(PyTypeError::new_err(
                    "setup(config_dict) takes no other arguments",
                ));
            }
            return Ok(self.setup_dict(py, d));
        }
        let local_hostname: String = local_hostname.extract()?;
        let Some(metadata_server) = metadata_server else {
            return Err(PyTypeError::new_err(
                "setup() missing required argument 'metadata_server'",
            ));
        };
        let defaults = ClientConfig::default();
        let cfg = ClientConfig {
            local_hostname,
            metadata_server,
            global_segment_size: global_segment_size.map_or(16 * MIB, |u| u.0),
            local_buffer_size: local_buffer_size.map_or(defaults.local_buffer_size, |u| u.0),
            protocol: protocol.unwrap_or_else(|| "tcp".into()),
            device_name: rdma_devices.unwrap_or_default(),
            master_server_address: master_server_addr
                .or_else(|| std::env::var("MOONCAKE_MASTER").ok())
                .unwrap_or(defaults.master_server_address),
            ..ClientConfig::default()
        };
        Ok(self.setup_config(py, cfg))
    }

    /// Joins as a "dummy" client of the `mooncake_client` at `server_address`.
    fn setup_dummy(
        &self,
        py: Python<'_>,
        mem_pool_size: Unsigned,
        local_buffer_size: Unsigned,
        server_address: String,
    ) -> i32 {
        self.start(py, move || {
            Client::setup_dummy(mem_pool_size.0, local_buffer_size.0, &server_address)
        })
    }

    /// `setup` with the integration environment (`MOONCAKE_*`) for everything
    /// but the protocol, device and segment size.
    #[pyo3(signature = (protocol, device_name, mount_segment_size = 16 * MIB))]
    fn init_all(
        &self,
        py: Python<'_>,
        protocol: String,
        device_name: String,
        mount_segment_size: u64,
    ) -> i32 {
        let mut cfg = match ClientConfig::from_env() {
            Ok(c) => c,
            Err(e) => return code(&e),
        };
        cfg.protocol = protocol;
        cfg.device_name = device_name;
        cfg.global_segment_size = mount_segment_size;
        self.setup_config(py, cfg)
    }

    /// Leaves the cluster (this client's segment and its objects go away).
    /// Always 0; the object can be set up again.
    fn close(&self, py: Python<'_>) -> i32 {
        let old = self.state.write().take();
        if let Some(old) = old {
            // Dropping the client stops its engine, which may talk to the
            // metadata server: not with the GIL held.
            py.allow_threads(move || {
                if let Err(e) = old.client.close() {
                    tracing::warn!("close: {e}");
                }
                drop(old);
            });
        }
        0
    }

    /// `host:port` of this client; `""` when not set up.
    fn get_hostname(&self) -> String {
        self.live()
            .map(|l| l.client.get_hostname())
            .unwrap_or_default()
    }

    /// 0 healthy, 1 not set up (or closed), 2 master unreachable.
    fn health_check(&self, py: Python<'_>) -> i32 {
        let Some(live) = self.live() else { return 1 };
        match py.allow_threads(|| live.client.health_check()) {
            Ok(()) => 0,
            Err(_) => 2,
        }
    }

    // ---- memory -------------------------------------------------------------

    /// Registers `size` bytes at `buffer_ptr` for the zero-copy calls.
    fn register_buffer(&self, py: Python<'_>, buffer_ptr: Unsigned, size: Unsigned) -> i32 {
        let Some(live) = self.live() else {
            return NOT_READY;
        };
        let (addr, len) = (buffer_ptr.usize(), size.usize());
        py.allow_threads(|| {
            if len == 0 || !mem::accessible(addr, len, Access::Write) {
                return INVALID;
            }
            // Any refusal (overlap, ...) is INVALID_PARAMS in the reference.
            match live.client.register_buffer(addr, len) {
                Ok(()) => {
                    live.registered.lock().insert(addr, len);
                    0
                }
                Err(_) => INVALID,
            }
        })
    }

    fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: Unsigned) -> i32 {
        let Some(live) = self.live() else {
            return NOT_READY;
        };
        let addr = buffer_ptr.usize();
        py.allow_threads(|| match live.client.unregister_buffer(addr) {
            Ok(()) => {
                live.registered.lock().remove(addr);
                0
            }
            Err(_) => INVALID,
        })
    }

    /// Memory usable by the zero-copy calls without registering; 0 on failure.
    fn alloc_from_mem_pool(&self, py: Python<'_>, size: Unsigned) -> usize {
        let Some(live) = self.live() else { return 0 };
        match py.allow_threads(|| live.client.alloc_from_mem_pool(size.usize())) {
            Ok(addr) => {
                live.pool.lock().insert(addr, size.usize());
                addr
            }
            Err(_) => 0,
        }
    }

    // ---- bytes ----------------------------------------------------------------

    #[pyo3(signature = (key, value, config = None))]
    fn put(
        &self,
        py: Python<'_>,
        key: Key,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let v = [Exported::get(value)?];
        Ok(self.write_bytes(py, &key.0, &v, config, false))
    }

    #[pyo3(signature = (key, value, config = None))]
    fn upsert(
        &self,
        py: Python<'_>,
        key: Key,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let v = [Exported::get(value)?];
        Ok(self.write_bytes(py, &key.0, &v, config, true))
    }

    /// Stores the concatenation of `parts` as one object.
    #[pyo3(signature = (key, *parts, config = None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: Key,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let parts = parts_of(parts)?;
        if parts.is_empty() {
            return Ok(0);
        }
        Ok(self.write_bytes(py, &key.0, &parts, config, false))
    }

    #[pyo3(signature = (key, *parts, config = None))]
    fn upsert_parts(
        &self,
        py: Python<'_>,
        key: Key,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let parts = parts_of(parts)?;
        if parts.is_empty() {
            return Ok(0);
        }
        Ok(self.write_bytes(py, &key.0, &parts, config, true))
    }

    /// One int for the whole batch: 0, or the first failure's code.
    #[pyo3(signature = (keys, values, config = None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_batch(py, keys, values, config, false)
    }

    #[pyo3(signature = (keys, values, config = None))]
    fn upsert_batch(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_batch(py, keys, values, config, true)
    }

    /// The object's bytes; `b""` when it is missing (or on any failure).
    fn get<'py>(&self, py: Python<'py>, key: Key) -> Bound<'py, PyBytes> {
        let Some(live) = self.live() else {
            return PyBytes::new(py, b"");
        };
        // The bytes object is allocated (uninitialised) once the size is
        // known and filled without the GIL: a replica in our own segment is
        // copied once, straight into it.
        let mut made: Option<Py<PyBytes>> = None;
        let got = py.allow_threads(|| {
            live.client.get_with(&key.0, |size| {
                Python::with_gil(|py| {
                    let (obj, buf) = uninit_bytes(py, size)?;
                    made = Some(obj);
                    Ok(buf)
                })
            })
        });
        match (got, made) {
            (Ok(_), Some(b)) => b.into_bound(py),
            _ => PyBytes::new(py, b""),
        }
    }

    /// Values in key order, `b""` for missing ones. Like the reference, an
    /// empty key list gives `[b""]`.
    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<Key>) -> Vec<Bound<'py, PyBytes>> {
        let keys = self::keys(keys);
        let Some(live) = self.live() else {
            return vec![PyBytes::new(py, b""); keys.len().max(1)];
        };
        if keys.is_empty() {
            return vec![PyBytes::new(py, b"")];
        }
        // As in `get`: every bytes object is allocated (uninitialised) once
        // the sizes are known, in one GIL round, and filled without the GIL.
        let mut made: Vec<Option<Py<PyBytes>>> = Vec::with_capacity(keys.len());
        let got = py.allow_threads(|| {
            live.client.get_batch_with(&keys, |sizes| {
                Python::with_gil(|py| {
                    let mut bufs = Vec::with_capacity(sizes.len());
                    for size in sizes {
                        match size {
                            Some(n) => {
                                let (obj, buf) = uninit_bytes(py, *n)?;
                                made.push(Some(obj));
                                bufs.push(Some(buf));
                            }
                            None => {
                                made.push(None);
                                bufs.push(None);
                            }
                        }
                    }
                    Ok(bufs)
                })
            })
        });
        got.into_iter()
            .zip(made.into_iter().chain(std::iter::repeat_with(|| None)))
            .map(|(r, obj)| match (r, obj) {
                (Ok(_), Some(b)) => b.into_bound(py),
                _ => PyBytes::new(py, b""),
            })
            .collect()
    }

    /// The object's bytes without a copy to Python; `None` when missing.
    fn get_buffer(&self, py: Python<'_>, key: Key) -> Option<BufferHandle> {
        let live = self.live()?;
        py.allow_threads(|| live.client.get_buffer(&key.0))
            .ok()
            .map(BufferHandle::staged)
    }

    fn batch_get_buffer(&self, py: Python<'_>, keys: Vec<Key>) -> Vec<Option<BufferHandle>> {
        let keys = self::keys(keys);
        let Some(live) = self.live() else {
            return keys.iter().map(|_| None).collect();
        };
        if keys.is_empty() {
            return Vec::new();
        }
        py.allow_threads(|| live.client.batch_get_buffer(&keys))
            .into_iter()
            .map(|r| r.ok().map(BufferHandle::staged))
            .collect()
    }

    /// The object's bytes in memory owned by the handle (for the tensor
    /// calls, which keep it alive as the tensor's storage); `None` when missing.
    fn _get_owned(&self, py: Python<'_>, key: Key) -> Option<BufferHandle> {
        let live = self.live()?;
        py.allow_threads(|| live.client.get(&key.0))
            .ok()
            .map(BufferHandle::heap)
    }

    fn _batch_get_owned(&self, py: Python<'_>, keys: Vec<Key>) -> Vec<Option<BufferHandle>> {
        let keys = self::keys(keys);
        let Some(live) = self.live() else {
            return keys.iter().map(|_| None).collect();
        };
        if keys.is_empty() {
            return Vec::new();
        }
        py.allow_threads(|| live.client.get_batch(&keys))
            .into_iter()
            .map(|r| r.ok().map(BufferHandle::heap))
            .collect()
    }

    /// Stores one object per key from lists of parts; a code per key.
    #[pyo3(signature = (keys, parts, config = None, upsert = false))]
    fn _batch_put_parts(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        parts: Vec<Vec<Bound<'_, PyAny>>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<Vec<i32>> {
        let n = keys.len();
        let exported = parts
            .iter()
            .map(|p| p.iter().map(Exported::get).collect::<PyResult<Vec<_>>>())
            .collect::<PyResult<Vec<_>>>()?;
        let Some(live) = self.live() else {
            return Ok(vec![NOT_READY; n]);
        };
        if exported.len() != n {
            return Ok(vec![INVALID; n]);
        }
        let cfg = match rust_cfg(config) {
            Ok(c) => c,
            Err(c) => return Ok(vec![c; n]),
        };
        let keys = self::keys(keys);
        Ok(py.allow_threads(|| {
            keys.iter()
                .zip(&exported)
                .map(|(k, p)| {
                    let slices: Vec<&[u8]> = p.iter().map(Exported::as_slice).collect();
                    let r = if upsert {
                        live.client.upsert_parts(k, &slices, &cfg)
                    } else {
                        live.client.put_parts(k, &slices, &cfg)
                    };
                    status(r)
                })
                .collect()
        }))
    }

    /// Size in bytes, or a negative code (-704 when missing).
    fn get_size(&self, py: Python<'_>, key: Key) -> i64 {
        let Some(live) = self.live() else {
            return NOT_READY as i64;
        };
        if key.0.is_empty() {
            return NOT_FOUND as i64;
        }
        match py.allow_threads(|| live.client.get_size(&key.0)) {
            Ok(n) => n as i64,
            Err(e) => code(&e) as i64,
        }
    }

    /// 1 exists, 0 missing, -1 error.
    fn is_exist(&self, py: Python<'_>, key: Key) -> i32 {
        let Some(live) = self.live() else { return -1 };
        if key.0.is_empty() {
            return 0;
        }
        exist_code(py.allow_threads(|| live.client.is_exist(&key.0)))
    }

    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<Key>) -> Vec<i32> {
        let keys = self::keys(keys);
        let Some(live) = self.live() else {
            return vec![-1; keys.len()];
        };
        if keys.is_empty() {
            return Vec::new();
        }
        match py.allow_threads(|| live.client.batch_is_exist(&keys)) {
            Ok(v) => v
                .into_iter()
                .zip(&keys)
                .map(|(r, k)| if k.is_empty() { 0 } else { exist_code(r) })
                .collect(),
            Err(_) => vec![-1; keys.len()],
        }
    }

    /// 0, or -704 missing, -706 leased (unless `force`).
    #[pyo3(signature = (key, force = Flag(false)))]
    fn remove(&self, py: Python<'_>, key: Key, force: Flag) -> i32 {
        let Some(live) = self.live() else {
            return NOT_READY;
        };
        if key.0.is_empty() {
            return NOT_FOUND;
        }
        py.allow_threads(|| status(live.client.remove(&key.0, force.0)))
    }

    #[pyo3(signature = (keys, force = Flag(false)))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<Key>, force: Flag) -> Vec<i32> {
        let keys = self::keys(keys);
        let Some(live) = self.live() else {
            return vec![NOT_READY; keys.len()];
        };
        if keys.is_empty() {
            return Vec::new();
        }
        let n = keys.len();
        py.allow_threads(|| per_key_codes(n, live.client.batch_remove(&keys, force.0)))
    }

    /// Number of objects removed, or a negative code (-600 for a bad regex).
    #[pyo3(signature = (regex_pattern, force = Flag(false)))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: String, force: Flag) -> i64 {
        let Some(live) = self.live() else {
            return NOT_READY as i64;
        };
        match py.allow_threads(|| live.client.remove_by_regex(&regex_pattern, force.0)) {
            Ok(n) => n as i64,
            Err(e) => code(&e) as i64,
        }
    }

    #[pyo3(signature = (force = Flag(false)))]
    fn remove_all(&self, py: Python<'_>, force: Flag) -> i64 {
        let Some(live) = self.live() else {
            return NOT_READY as i64;
        };
        match py.allow_threads(|| live.client.remove_all(force.0)) {
            Ok(n) => n as i64,
            Err(e) => code(&e) as i64,
        }
    }

    // ---- zero copy ---------------------------------------------------------------

    #[pyo3(signature = (key, buffer_ptr, size, config = None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: Key,
        buffer_ptr: Unsigned,
        size: Unsigned,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        self.write_from(py, &key.0, buffer_ptr.usize(), size.usize(), config, false)
    }

    #[pyo3(signature = (key, buffer_ptr, size, config = None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: Key,
        buffer_ptr: Unsigned,
        size: Unsigned,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        self.write_from(py, &key.0, buffer_ptr.usize(), size.usize(), config, true)
    }

    /// Stores `[metadata][data]` as one object.
    #[pyo3(signature = (key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_from_with_metadata(
        &self,
        py: Python<'_>,
        key: Key,
        buffer_ptr: Unsigned,
        metadata_buffer_ptr: Unsigned,
        size: Unsigned,
        metadata_size: Unsigned,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        let Some(live) = self.live() else {
            return NOT_READY;
        };
        let cfg = match rust_cfg(config) {
            Ok(c) => c,
            Err(c) => return c,
        };
        let (d, m) = (
            (buffer_ptr.usize(), size.usize()),
            (metadata_buffer_ptr.usize(), metadata_size.usize()),
        );
        py.allow_threads(|| {
            let dm = classify(&live, d.0, d.1, Access::Read);
            let mm = classify(&live, m.0, m.1, Access::Read);
            match (dm, mm) {
                (Mem::Bad, _) | (_, Mem::Bad) => INVALID,
                (Mem::Direct, Mem::Direct) => status(
                    live.client
                        .put_from_with_metadata(&key.0, d.0, m.0, d.1, m.1, &cfg),
                ),
                _ => {
                    // SAFETY: `classify` answered `Direct` or `Copy` for both
                    // ranges just above.
                    let (mv, dv) = unsafe { (view(m.0, m.1), view(d.0, d.1)) };
                    status(live.client.put_parts(&key.0, &[mv, dv], &cfg))
                }
            }
        })
    }

    /// Reads the whole object into `buffer_ptr`; its size, or a negative
    /// code (-600 when the buffer is too small, -704 when missing).
    fn get_into(&self, py: Python<'_>, key: Key, buffer_ptr: Unsigned, size: Unsigned) -> i64 {
        let Some(live) = self.live() else {
            return NOT_READY as i64;
        };
        let (addr, mut len) = (buffer_ptr.usize(), size.usize());
        // Past the end of a registered buffer only the object's bytes are
        // written, so read at most up to that end.
        if let Some(end) = live.region_end(addr) {
            len = len.min(end - addr);
        }
        py.allow_threads(|| match classify(&live, addr, len, Access::Write) {
            Mem::Direct => match live.client.get_into(&key.0, addr, len) {
                Ok(n) => n as i64,
                Err(e) => code(&e) as i64,
            },
            Mem::Copy => match live.client.get(&key.0) {
                Ok(v) if v.len() <= len => {
                    // SAFETY: `classify` answered `Copy` for `len >= v.len()` bytes.
                    unsafe { copy_out(addr, &v) };
                    v.len() as i64
                }
                Ok(_) => INVALID as i64,
                Err(e) => code(&e) as i64,
            },
            Mem::Bad => INVALID as i64,
        })
    }

    #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        buffer_ptrs: Vec<Unsigned>,
        sizes: Vec<Unsigned>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        self.batch_write_from(
            py,
            self::keys(keys),
            usizes(&buffer_ptrs),
            usizes(&sizes),
            config,
            false,
        )
    }

    #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None))]
    fn batch_upsert_from(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        buffer_ptrs: Vec<Unsigned>,
        sizes: Vec<Unsigned>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        self.batch_write_from(
            py,
            self::keys(keys),
            usizes(&buffer_ptrs),
            usizes(&sizes),
            config,
            true,
        )
    }

    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        buffer_ptrs: Vec<Unsigned>,
        sizes: Vec<Unsigned>,
    ) -> Vec<i64> {
        let keys = self::keys(keys);
        let n = keys.len();
        let Some(live) = self.live() else {
            return vec![NOT_READY as i64; n];
        };
        if buffer_ptrs.len() != n || sizes.len() != n {
            return vec![INVALID as i64; n];
        }
        let (addrs, mut lens) = (usizes(&buffer_ptrs), usizes(&sizes));
        for (a, l) in addrs.iter().zip(lens.iter_mut()) {
            if let Some(end) = live.region_end(*a) {
                *l = (*l).min(end - a);
            }
        }
        py.allow_threads(|| {
            let mut out = vec![INVALID as i64; n];
            let (mut direct, mut copied) = (Vec::new(), Vec::new());
            for i in 0..n {
                match classify(&live, addrs[i], lens[i], Access::Write) {
                    Mem::Direct => direct.push(i),
                    Mem::Copy => copied.push(i),
                    Mem::Bad => {}
                }
            }
            if !direct.is_empty() {
                let k: Vec<String> = direct.iter().map(|&i| keys[i].clone()).collect();
                let a: Vec<usize> = direct.iter().map(|&i| addrs[i]).collect();
                let l: Vec<usize> = direct.iter().map(|&i| lens[i]).collect();
                match live.client.batch_get_into(&k, &a, &l) {
                    Ok(v) => {
                        for (r, &i) in v.into_iter().zip(&direct) {
                            out[i] = r.map_or_else(|e| code(&e) as i64, |n| n as i64);
                        }
                    }
                    Err(e) => direct.iter().for_each(|&i| out[i] = code(&e) as i64),
                }
            }
            if !copied.is_empty() {
                let k: Vec<String> = copied.iter().map(|&i| keys[i].clone()).collect();
                for (r, &i) in live.client.get_batch(&k).into_iter().zip(&copied) {
                    out[i] = match r {
                        Ok(v) if v.len() <= lens[i] => {
                            // SAFETY: `classify` answered `Copy` for `lens[i] >= v.len()` bytes.
                            unsafe { copy_out(addrs[i], &v) };
                            v.len() as i64
                        }
                        Ok(_) => INVALID as i64,
                        Err(e) => code(&e) as i64,
                    };
                }
            }
            out
        })
    }

    /// Each key's value is the concatenation of its buffers.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config = None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        all_buffer_ptrs: Vec<Vec<Unsigned>>,
        all_sizes: Vec<Vec<Unsigned>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        let keys = self::keys(keys);
        let n = keys.len();
        let Some(live) = self.live() else {
            return vec![NOT_READY; n];
        };
        if all_buffer_ptrs.len() != n || all_sizes.len() != n {
            return vec![INVALID; n];
        }
        let cfg = match rust_cfg(config) {
            Ok(c) => c,
            Err(c) => return vec![c; n],
        };
        let addrs: Vec<Vec<usize>> = all_buffer_ptrs.iter().map(|v| usizes(v)).collect();
        let sizes: Vec<Vec<usize>> = all_sizes.iter().map(|v| usizes(v)).collect();
        py.allow_threads(|| {
            let mut out = vec![0; n];
            for i in 0..n {
                if addrs[i].len() != sizes[i].len() {
                    out[i] = INVALID;
                    continue;
                }
                let kinds: Vec<Mem> = addrs[i]
                    .iter()
                    .zip(&sizes[i])
                    .map(|(&a, &s)| classify(&live, a, s, Access::Read))
                    .collect();
                out[i] = if kinds.iter().any(|k| matches!(k, Mem::Bad)) {
                    INVALID
                } else if kinds.iter().all(|k| matches!(k, Mem::Direct)) {
                    per_key_codes(
                        1,
                        live.client.batch_put_from_multi_buffers(
                            &keys[i..=i],
                            &addrs[i..=i],
                            &sizes[i..=i],
                            &cfg,
                        ),
                    )[0]
                } else {
                    let parts: Vec<&[u8]> = addrs[i]
                        .iter()
                        .zip(&sizes[i])
                        // SAFETY: `classify` answered `Direct` or `Copy` for every part above.
                        .map(|(&a, &s)| unsafe { view(a, s) })
                        .collect();
                    status(live.client.put_parts(&keys[i], &parts, &cfg))
                };
            }
            out
        })
    }

    /// Scatters each object over its buffers, in order; bytes read per key.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node = Flag(false)))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        all_buffer_ptrs: Vec<Vec<Unsigned>>,
        all_sizes: Vec<Vec<Unsigned>>,
        prefer_alloc_in_same_node: Flag,
    ) -> Vec<i64> {
        let keys = self::keys(keys);
        let n = keys.len();
        let Some(live) = self.live() else {
            return vec![NOT_READY as i64; n];
        };
        if all_buffer_ptrs.len() != n || all_sizes.len() != n {
            return vec![INVALID as i64; n];
        }
        let addrs: Vec<Vec<usize>> = all_buffer_ptrs.iter().map(|v| usizes(v)).collect();
        let sizes: Vec<Vec<usize>> = all_sizes.iter().map(|v| usizes(v)).collect();
        py.allow_threads(|| {
            let mut out = vec![INVALID as i64; n];
            for i in 0..n {
                if addrs[i].len() != sizes[i].len() {
                    continue;
                }
                let kinds: Vec<Mem> = addrs[i]
                    .iter()
                    .zip(&sizes[i])
                    .map(|(&a, &s)| classify(&live, a, s, Access::Write))
                    .collect();
                if kinds.iter().any(|k| matches!(k, Mem::Bad)) {
                    continue;
                }
                out[i] = if kinds.iter().all(|k| matches!(k, Mem::Direct)) {
                    match live.client.batch_get_into_multi_buffers(
                        &keys[i..=i],
                        &addrs[i..=i],
                        &sizes[i..=i],
                        prefer_alloc_in_same_node.0,
                    ) {
                        Ok(mut v) => v.pop().map_or(INVALID as i64, |r| {
                            r.map_or_else(|e| code(&e) as i64, |n| n as i64)
                        }),
                        Err(e) => code(&e) as i64,
                    }
                } else {
                    match live.client.get(&keys[i]) {
                        Ok(v) if v.len() <= sizes[i].iter().sum::<usize>() => {
                            let mut rest: &[u8] = &v;
                            for (&a, &s) in addrs[i].iter().zip(&sizes[i]) {
                                let take = s.min(rest.len());
                                // SAFETY: `classify` answered `Direct` or `Copy`
                                // for `s >= take` bytes at `a` above.
                                unsafe { copy_out(a, &rest[..take]) };
                                rest = &rest[take..];
                            }
                            v.len() as i64
                        }
                        Ok(_) => INVALID as i64,
                        Err(e) => code(&e) as i64,
                    }
                };
            }
            out
        })
    }

    /// Buffer-major ranged reads into registered buffers:
    /// `result[i][j][k]` is the byte count (or a negative code) of fragment
    /// `k` of key `all_keys[i][j]` into `buffer_ptrs[i]`.
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: Vec<Unsigned>,
        all_keys: Vec<Vec<Key>>,
        all_dst_offsets: Vec<Vec<Vec<Unsigned>>>,
        all_src_offsets: Vec<Vec<Vec<Unsigned>>>,
        all_sizes: Vec<Vec<Vec<Unsigned>>>,
    ) -> Vec<Vec<Vec<i64>>> {
        let u3 = |v: Vec<Vec<Vec<Unsigned>>>| -> Vec<Vec<Vec<u64>>> {
            v.into_iter()
                .map(|a| {
                    a.into_iter()
                        .map(|b| b.into_iter().map(|u| u.0).collect())
                        .collect()
                })
                .collect()
        };
        let ptrs = usizes(&buffer_ptrs);
        let keys: Vec<Vec<String>> = all_keys.into_iter().map(self::keys).collect();
        let (dst, src, sizes) = (u3(all_dst_offsets), u3(all_src_offsets), u3(all_sizes));
        let Some(live) = self.live() else {
            return keys
                .iter()
                .map(|k| k.iter().map(|_| vec![NOT_READY as i64]).collect())
                .collect();
        };
        let res = py.allow_threads(|| {
            live.client
                .get_into_ranges(&ptrs, &keys, &dst, &src, &sizes)
        });
        let shape_ok = [keys.len(), dst.len(), src.len(), sizes.len()]
            .iter()
            .all(|&n| n == ptrs.len());
        res.into_iter()
            // With mismatched top-level lists every buffer reports the error,
            // even one that has no key list.
            .map(|b| {
                if b.is_empty() && !shape_ok {
                    vec![vec![Err(Error::from(ErrorCode::INVALID_PARAMS))]]
                } else {
                    b
                }
            })
            .map(|b| {
                b.into_iter()
                    .map(|k| {
                        k.into_iter()
                            .map(|r| r.map_or_else(|e| code(&e) as i64, |n| n as i64))
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }

    // ---- replicas and tasks ---------------------------------------------------------

    /// The object's replicas; `[]` when it is missing.
    fn get_replica_desc(&self, py: Python<'_>, key: Key) -> Vec<ReplicaDescriptor> {
        let Some(live) = self.live() else {
            return Vec::new();
        };
        py.allow_threads(|| live.client.get_replica_desc(&key.0))
            .map(|v| v.into_iter().map(ReplicaDescriptor::from).collect())
            .unwrap_or_default()
    }

    /// `{key: [ReplicaDescriptor]}` for the keys that exist.
    fn batch_get_replica_desc<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<Key>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let keys = self::keys(keys);
        let Some(live) = self.live() else {
            return Ok(d);
        };
        if keys.is_empty() {
            return Ok(d);
        }
        if let Ok(v) = py.allow_threads(|| live.client.batch_get_replica_desc(&keys)) {
            for (k, r) in keys.iter().zip(v) {
                if let Ok(reps) = r {
                    let list: Vec<ReplicaDescriptor> =
                        reps.into_iter().map(ReplicaDescriptor::from).collect();
                    d.set_item(k, list)?;
                }
            }
        }
        Ok(d)
    }

    /// Keys whose replicas on `segment_name` (all replicas when empty) were
    /// dropped; objects still leased are kept. Any failure is `[]`.
    #[pyo3(signature = (keys, segment_name = String::new()))]
    fn batch_replica_clear(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        segment_name: String,
    ) -> Vec<String> {
        let keys = self::keys(keys);
        match self.live() {
            Some(live) if !keys.is_empty() => py
                .allow_threads(|| live.client.batch_replica_clear(&keys, &segment_name))
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// `((hi, lo), 0)` for a queued copy of `key` onto each of `targets`
    /// (segment names); `((0, 0), code)` on failure.
    fn create_copy_task(
        &self,
        py: Python<'_>,
        key: Key,
        targets: Vec<String>,
    ) -> ((u64, u64), i32) {
        let Some(live) = self.live() else {
            return ((0, 0), NOT_READY);
        };
        task_answer(py.allow_threads(|| live.client.create_copy_task(&key.0, &targets)))
    }

    /// `((hi, lo), 0)` for a queued move of `key`'s replica on `source` to
    /// `target`; `((0, 0), code)` on failure.
    fn create_move_task(
        &self,
        py: Python<'_>,
        key: Key,
        source: String,
        target: String,
    ) -> ((u64, u64), i32) {
        let Some(live) = self.live() else {
            return ((0, 0), NOT_READY);
        };
        task_answer(py.allow_threads(|| live.client.create_move_task(&key.0, &source, &target)))
    }

    /// `(QueryTaskResponse, 0)`, or `(None, code)` (-1400 for an unknown task).
    fn query_task(&self, py: Python<'_>, task_id: (u64, u64)) -> (Option<QueryTaskResponse>, i32) {
        let Some(live) = self.live() else {
            return (None, NOT_READY);
        };
        let id = join_uuid(task_id);
        match py.allow_threads(|| live.client.query_task(id)) {
            Ok(info) => (Some(QueryTaskResponse::from(info)), 0),
            Err(e) => (None, code(&e)),
        }
    }
}

/// A 128-bit id as the reference's Python shows a UUID: `(high, low)`.
fn split_uuid(id: u128) -> (u64, u64) {
    ((id >> 64) as u64, id as u64)
}

fn join_uuid((hi, lo): (u64, u64)) -> u128 {
    (u128::from(hi) << 64) | u128::from(lo)
}

fn task_answer(r: Result<u128, Error>) -> ((u64, u64), i32) {
    match r {
        Ok(id) => (split_uuid(id), 0),
        Err(e) => ((0, 0), code(&e)),
    }
}

impl PyStore {
    fn setup_dict(&self, py: Python<'_>, d: &Bound<'_, PyDict>) -> i32 {
        let (Some(local_hostname), Some(metadata_server)) = (
            dict_str(d, "local_hostname"),
            dict_str(d, "metadata_server"),
        ) else {
            return INVALID;
        };
        let defaults = ClientConfig::default();
        let sizes = (
            dict_size(d, "global_segment_size", 16 * MIB),
            dict_size(d, "local_buffer_size", 16 * MIB),
        );
        let (Ok(global_segment_size), Ok(local_buffer_size)) = sizes else {
            return INVALID;
        };
        let cfg = ClientConfig {
            local_hostname,
            metadata_server,
            global_segment_size,
            local_buffer_size,
            protocol: dict_str(d, "protocol").unwrap_or_else(|| "tcp".into()),
            device_name: dict_str(d, "rdma_devices")
                .or_else(|| dict_str(d, "device_name"))
                .unwrap_or_default(),
            master_server_address: dict_str(d, "master_server_addr")
                .or_else(|| dict_str(d, "master_server_address"))
                .or_else(|| std::env::var("MOONCAKE_MASTER").ok())
                .unwrap_or(defaults.master_server_address),
            ..ClientConfig::default()
        };
        self.setup_config(py, cfg)
    }
}

// ---- replica descriptors ------------------------------------------------------------

/// Where a memory replica's bytes are: `size`, `buffer_address`, `transport_endpoint`.
#[pyclass(module = "mooncake.store", name = "Descriptor", get_all, set_all)]
#[derive(Clone, Debug, Default)]
pub struct Descriptor {
    pub size: u64,
    pub buffer_address: u64,
    pub transport_endpoint: String,
}

#[pymethods]
impl Descriptor {
    #[new]
    fn new() -> Self {
        Descriptor::default()
    }

    fn __repr__(&self) -> String {
        format!(
            "<Descriptor size={} buffer_address={} transport_endpoint={}>",
            self.size, self.buffer_address, self.transport_endpoint
        )
    }
}

#[pyclass(frozen, module = "mooncake.store", name = "MemoryDescriptor")]
#[derive(Clone, Debug)]
pub struct MemoryDescriptor {
    desc: Descriptor,
}

#[pymethods]
impl MemoryDescriptor {
    #[getter]
    fn buffer_descriptor(&self) -> Descriptor {
        self.desc.clone()
    }
}

#[pyclass(frozen, module = "mooncake.store", name = "DiskDescriptor", get_all)]
#[derive(Clone, Debug)]
pub struct DiskDescriptor {
    pub file_path: String,
    pub object_size: u64,
}

/// One replica of an object.
#[pyclass(frozen, module = "mooncake.store", name = "ReplicaDescriptor")]
#[derive(Clone, Debug)]
pub struct ReplicaDescriptor {
    #[pyo3(get)]
    status: ReplicaStatus,
    kind: ReplicaKind,
}

impl From<ReplicaDesc> for ReplicaDescriptor {
    fn from(r: ReplicaDesc) -> Self {
        use types::ReplicaStatus as S;
        let status = match r.status {
            S::Undefined => ReplicaStatus::UNDEFINED,
            S::Initialized => ReplicaStatus::INITIALIZED,
            S::Processing => ReplicaStatus::PROCESSING,
            S::Complete => ReplicaStatus::COMPLETE,
            S::Removed => ReplicaStatus::REMOVED,
            S::Failed => ReplicaStatus::FAILED,
        };
        ReplicaDescriptor {
            status,
            kind: r.kind,
        }
    }
}

#[pymethods]
impl ReplicaDescriptor {
    fn is_memory_replica(&self) -> bool {
        matches!(self.kind, ReplicaKind::Memory(_))
    }

    fn is_disk_replica(&self) -> bool {
        matches!(self.kind, ReplicaKind::Disk(_))
    }

    fn is_local_disk_replica(&self) -> bool {
        false
    }

    fn get_memory_descriptor(&self) -> PyResult<MemoryDescriptor> {
        match &self.kind {
            ReplicaKind::Memory(m) => Ok(MemoryDescriptor {
                desc: Descriptor {
                    size: m.size,
                    buffer_address: m.buffer_address,
                    transport_endpoint: m.transport_endpoint.clone(),
                },
            }),
            _ => Err(PyRuntimeError::new_err("Expected MemoryDescriptor")),
        }
    }

    fn get_disk_descriptor(&self) -> PyResult<DiskDescriptor> {
        match &self.kind {
            ReplicaKind::Disk(d) => Ok(DiskDescriptor {
                file_path: d.file_path.clone(),
                object_size: d.object_size,
            }),
            _ => Err(PyRuntimeError::new_err("Expected DiskDescriptor")),
        }
    }
}

/// A copy or move task's state, as `query_task` reports it.
#[pyclass(module = "mooncake.store", name = "QueryTaskResponse", get_all)]
#[derive(Clone, Debug)]
pub struct QueryTaskResponse {
    pub id: (u64, u64),
    pub r#type: TaskType,
    pub status: TaskStatus,
    pub created_at_ms_epoch: u64,
    pub last_updated_at_ms_epoch: u64,
    pub assigned_client: (u64, u64),
    pub message: String,
}

impl From<mooncake_store::types::TaskInfo> for QueryTaskResponse {
    fn from(t: mooncake_store::types::TaskInfo) -> Self {
        use mooncake_store::types::{TaskStatus as S, TaskType as T};
        QueryTaskResponse {
            id: split_uuid(t.id),
            r#type: match t.task_type {
                T::ReplicaCopy => TaskType::REPLICA_COPY,
                T::ReplicaMove => TaskType::REPLICA_MOVE,
            },
            status: match t.status {
                S::Pending => TaskStatus::PENDING,
                S::Processing => TaskStatus::PROCESSING,
                S::Success => TaskStatus::SUCCESS,
                S::Failed => TaskStatus::FAILED,
            },
            created_at_ms_epoch: t.created_at_ms_epoch,
            last_updated_at_ms_epoch: t.last_updated_at_ms_epoch,
            assigned_client: split_uuid(t.assigned_client),
            message: t.message,
        }
    }
}

#[pymethods]
impl QueryTaskResponse {
    /// As the reference prints it: ids as `hi-lo`, enums as numbers.
    fn __repr__(&self) -> String {
        format!(
            "QueryTaskResponse(id={}-{}, type={}, status={}, created_at={}, last_updated_at={}, assigned_client={}-{}, message=\"{}\")",
            self.id.0,
            self.id.1,
            self.r#type as i64,
            self.status as i64,
            self.created_at_ms_epoch,
            self.last_updated_at_ms_epoch,
            self.assigned_client.0,
            self.assigned_client.1,
            self.message
        )
    }

    #[new]
    fn new() -> Self {
        QueryTaskResponse {
            id: (0, 0),
            r#type: TaskType::REPLICA_COPY,
            status: TaskStatus::PENDING,
            created_at_ms_epoch: 0,
            last_updated_at_ms_epoch: 0,
            assigned_client: (0, 0),
            message: String::new(),
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStore>()?;
    m.add_class::<BufferHandle>()?;
    m.add_class::<Descriptor>()?;
    m.add_class::<MemoryDescriptor>()?;
    m.add_class::<DiskDescriptor>()?;
    m.add_class::<ReplicaDescriptor>()?;
    m.add_class::<QueryTaskResponse>()?;
    Ok(())
}
