//! Puts and gets of one object as Python bytes-like values.

use mooncake_common::{Error, ErrorCode};
use mooncake_store::Client;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::{PyStore, SameNode};
use crate::args::Key;
use crate::buffer::Exported;
use crate::codes::status;
use crate::config::ReplicateConfig;
use crate::handle::BufferHandle;

/// A new `bytes` object of `size` bytes whose contents are not initialised,
/// with its buffer, for a `get` to fill before Python sees the object.
pub(super) fn uninit_bytes<'a>(
    py: Python<'_>,
    size: usize,
) -> Result<(Py<PyBytes>, &'a mut [u8]), Error> {
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

impl PyStore {
    /// Stores the concatenation of `parts` under `key`.
    fn write_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &[Exported],
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> i32 {
        let (live, opts) = match self.writer(cfg, true, upsert, SameNode::Refused) {
            Ok(w) => w,
            Err(c) => return c,
        };
        let slices: Vec<&[u8]> = parts.iter().map(Exported::as_slice).collect();
        py.allow_threads(|| status(live.client.put_parts(key, &slices, opts.clone())))
    }

    fn write_value(
        &self,
        py: Python<'_>,
        key: Key,
        value: &Bound<'_, PyAny>,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<i32> {
        let v = [Exported::get(value)?];
        Ok(self.write_parts(py, &key.0, &v, cfg, upsert))
    }

    fn write_tuple(
        &self,
        py: Python<'_>,
        key: Key,
        parts: &Bound<'_, PyTuple>,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<i32> {
        let parts = parts
            .iter()
            .map(|p| Exported::get(&p))
            .collect::<PyResult<Vec<_>>>()?;
        if parts.is_empty() {
            return Ok(0);
        }
        Ok(self.write_parts(py, &key.0, &parts, cfg, upsert))
    }

    /// A `BufferHandle` of `key`'s bytes from `fetch`; `None` when missing
    /// (or not set up).
    pub(super) fn handle<T: Send>(
        &self,
        py: Python<'_>,
        key: &str,
        fetch: impl FnOnce(&Client, &str) -> Result<T, Error> + Send,
        wrap: fn(T) -> BufferHandle,
    ) -> Option<BufferHandle> {
        let live = self.live.get()?;
        py.allow_threads(|| fetch(&live.client, key)).ok().map(wrap)
    }
}

put_and_upsert! {
    /// Stores `value` (bytes, bytearray, memoryview or another contiguous
    /// buffer) under `key`; 0 or a negative code.
    #[pyo3(signature = (key, value, config = None))]
    put / upsert(
        key: Key,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> => write_value
}

// Not through `put_and_upsert!`: pyo3's `*parts` handling does not survive
// macro hygiene.
#[pymethods]
impl PyStore {
    /// Stores the concatenation of `parts` as one object.
    #[pyo3(signature = (key, *parts, config = None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: Key,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_tuple(py, key, parts, config, false)
    }

    #[pyo3(signature = (key, *parts, config = None))]
    fn upsert_parts(
        &self,
        py: Python<'_>,
        key: Key,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_tuple(py, key, parts, config, true)
    }
}

#[pymethods]
impl PyStore {
    /// The object's bytes; `b""` when it is missing (or on any failure).
    fn get<'py>(&self, py: Python<'py>, key: Key) -> Bound<'py, PyBytes> {
        let Some(live) = self.live.get() else {
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

    /// The object's bytes without a copy to Python; `None` when missing.
    fn get_buffer(&self, py: Python<'_>, key: Key) -> Option<BufferHandle> {
        self.handle(py, &key.0, Client::get_buffer, BufferHandle::staged)
    }
}
