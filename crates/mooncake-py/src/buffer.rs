//! Borrowing the bytes of any Python object that exports a contiguous buffer
//! (bytes, bytearray, memoryview, numpy arrays, ...), without copying.

use std::ffi::c_int;

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// A held buffer export. While it lives the exporter keeps the memory alive
/// and unmoved (a bytearray refuses to resize), so the bytes may be read
/// with the GIL released.
pub(crate) struct Exported {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the view only carries pointers the exporter keeps valid until
// release, which happens under the GIL in Drop.
unsafe impl Send for Exported {}
unsafe impl Sync for Exported {}

impl Exported {
    /// Exports `ob`'s buffer as C-contiguous bytes of any item format.
    pub(crate) fn get(ob: &Bound<'_, PyAny>) -> PyResult<Exported> {
        // SAFETY: `Py_buffer` is a plain C struct for which all-zero bytes
        // are a valid (empty) value; CPython fills it in below.
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `ob` is a live object; on success the view must be
        // released exactly once, which Drop does.
        let rc: c_int =
            unsafe { ffi::PyObject_GetBuffer(ob.as_ptr(), &mut *view, ffi::PyBUF_C_CONTIGUOUS) };
        if rc != 0 {
            return Err(PyErr::take(ob.py())
                .unwrap_or_else(|| PyBufferError::new_err("cannot export buffer")));
        }
        Ok(Exported { view })
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        let len = self.view.len as usize;
        if len == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: a successful C-contiguous export describes `len` readable
        // bytes at `buf`, valid until the view is released.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, len) }
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        Python::with_gil(|_| {
            // SAFETY: the view came from a successful PyObject_GetBuffer.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// Bytes of a value argument: a `str` is taken as UTF-8 (as pybind11 does
/// for `std::string` parameters), anything else must export a buffer.
pub(crate) enum Bytes {
    Str(String),
    Buf(Exported),
}

impl Bytes {
    pub(crate) fn get(ob: &Bound<'_, PyAny>) -> PyResult<Bytes> {
        if let Ok(s) = ob.downcast::<PyString>() {
            return Ok(Bytes::Str(s.to_str()?.to_owned()));
        }
        Exported::get(ob).map(Bytes::Buf).map_err(|_| {
            PyTypeError::new_err(format!(
                "expected bytes, bytearray, str or another contiguous buffer, got {}",
                crate::args::type_name(ob)
            ))
        })
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Str(s) => s.as_bytes(),
            Bytes::Buf(b) => b.as_slice(),
        }
    }
}
