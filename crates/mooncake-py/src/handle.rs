//! `mooncake.store.BufferHandle`: an object's bytes held by the client,
//! exposed to Python through the buffer protocol without a copy.

use std::ffi::c_int;

use mooncake_store::client::BufferHandle as ClientBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// Where the bytes live.
enum Bytes {
    /// In the client's staging pool, returned to it on drop.
    Staged(ClientBuffer),
    /// A heap allocation owned here (from `Box<[u8]>::into_raw`).
    Heap { ptr: *mut u8, len: usize },
}

// SAFETY: the heap pointer is uniquely owned by this value; the staged
// buffer is owned too. Python may read and write the bytes from any thread
// (as with any writable buffer), which never invalidates the allocation.
unsafe impl Send for Bytes {}
unsafe impl Sync for Bytes {}

impl Drop for Bytes {
    fn drop(&mut self) {
        if let Bytes::Heap { ptr, len } = *self {
            // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice
            // in `BufferHandle::heap` and are freed exactly once, here.
            unsafe { drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len))) }
        }
    }
}

/// An object's bytes: `ptr()`, `size()`, `len()`, and a writable buffer
/// (`memoryview(h)`, `bytes(h)`, `numpy.frombuffer(h, ...)`, `torch.frombuffer`).
#[pyclass(frozen, module = "mooncake.store", name = "BufferHandle")]
pub(crate) struct BufferHandle {
    bytes: Bytes,
}

impl BufferHandle {
    pub(crate) fn staged(b: ClientBuffer) -> BufferHandle {
        BufferHandle {
            bytes: Bytes::Staged(b),
        }
    }

    pub(crate) fn heap(v: Vec<u8>) -> BufferHandle {
        let len = v.len();
        let ptr = Box::into_raw(v.into_boxed_slice()) as *mut u8;
        BufferHandle {
            bytes: Bytes::Heap { ptr, len },
        }
    }

    fn addr_len(&self) -> (usize, usize) {
        match &self.bytes {
            Bytes::Staged(b) => (b.ptr(), b.size()),
            Bytes::Heap { ptr, len } => (*ptr as usize, *len),
        }
    }
}

#[pymethods]
impl BufferHandle {
    /// Address of the first byte (valid while the handle lives).
    fn ptr(&self) -> usize {
        self.addr_len().0
    }

    fn size(&self) -> usize {
        self.addr_len().1
    }

    fn __len__(&self) -> usize {
        self.addr_len().1
    }

    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("view is null"));
        }
        let (addr, len) = slf.get().addr_len();
        // A zero-length view still needs a non-null pointer.
        let buf = if len == 0 {
            std::ptr::NonNull::<u8>::dangling().as_ptr() as usize
        } else {
            addr
        };
        // SAFETY: `buf..buf+len` stays valid while `slf` lives, and the
        // view holds a reference to `slf` (PyBuffer_FillInfo increfs it).
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                buf as *mut std::ffi::c_void,
                len as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::take(slf.py())
                .unwrap_or_else(|| PyBufferError::new_err("cannot fill buffer")));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
