//! `mooncake.store._PoolMemory`: the memory `mooncake.BufferPool` lends out
//! (its `BufferLease` is a Python subclass). A lease is a piece of the store's
//! local buffer, which the engine already knows, or, when that has no room,
//! an overflow region allocated here and registered with the store until the
//! lease is released. Either way the zero-copy calls use it in place.
//!
//! Python reads and writes the bytes through the buffer protocol; the number
//! of views taken is counted so that `release` can refuse while one is alive.

use std::alloc::Layout;
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use mooncake_store::client::LocalLease;
use parking_lot::Mutex;
use pyo3::exceptions::{PyBufferError, PyRuntimeError};
use pyo3::ffi;
use pyo3::prelude::*;

use super::{Live, PyStore};
use crate::args::Unsigned;

/// Where a lease's bytes are.
enum Backing {
    /// In the store's local buffer, returned to it on drop.
    Local(LocalLease),
    /// Allocated here with `layout` and registered with the store.
    Overflow { ptr: NonNull<u8>, layout: Layout },
}

// SAFETY: the overflow allocation is uniquely owned by this value; Python may
// read and write the bytes from any thread, which never invalidates it.
unsafe impl Send for Backing {}
unsafe impl Sync for Backing {}

/// The memory while leased, and the store that vouches for it (weak: a lease
/// kept past `close()` must not keep the client and its engine running).
struct Held {
    backing: Backing,
    live: Weak<Live>,
}

impl Held {
    /// Gives the memory back: the store forgets it (an overflow region is
    /// unregistered) and then it is freed.
    fn free(self, addr: usize) {
        let live = self.live.upgrade();
        match self.backing {
            Backing::Local(lease) => {
                if let Some(live) = &live {
                    live.memory.unpooled(addr);
                }
                drop(lease);
            }
            Backing::Overflow { ptr, layout } => {
                if let Some(live) = &live {
                    live.memory.unregister(addr);
                    if let Err(e) = live.client.unregister_buffer(addr) {
                        tracing::warn!("buffer pool: unregistering {addr:#x}: {e}");
                    }
                }
                // Without a live store its client is gone, and with it every
                // registration it made.
                // SAFETY: `ptr` came from `alloc_zeroed(layout)` and is freed
                // once, here, after the store stopped using it.
                unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) }
            }
        }
        // The last reference to a closed store's client may be this one:
        // dropped here, without the GIL (the caller released it).
        drop(live);
    }
}

/// Leased memory: `ptr`, `size` (the bytes asked for; the view's length),
/// `region_len` (the bytes held), `overflow`, `release()`, and a writable
/// buffer while not released.
#[pyclass(subclass, frozen, module = "mooncake.store", name = "_PoolMemory")]
pub(crate) struct PoolMemory {
    addr: usize,
    size: usize,
    region_len: usize,
    overflow: bool,
    held: Mutex<Option<Held>>,
    exports: AtomicUsize,
}

impl PoolMemory {
    /// A piece of the local buffer, or `None` when it has no room now.
    fn local(live: &Arc<Live>, size: usize) -> PyResult<Option<PoolMemory>> {
        let len = size.max(1);
        let lease = live
            .client
            .lease_local_buffer(len)
            .map_err(|e| PyRuntimeError::new_err(format!("local buffer: {e}")))?;
        Ok(lease.map(|lease| {
            let addr = lease.addr();
            live.memory.pooled(addr, len);
            PoolMemory::new(addr, size, len, false, Backing::Local(lease), live)
        }))
    }

    /// A fresh region of `len` bytes aligned to `align`, registered with the
    /// store.
    fn registered(live: &Arc<Live>, size: usize, len: usize, align: usize) -> PyResult<PoolMemory> {
        let layout = Layout::from_size_align(len.max(size).max(1), align)
            .map_err(|e| PyRuntimeError::new_err(format!("overflow buffer of {len} bytes: {e}")))?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or_else(|| {
            PyRuntimeError::new_err(format!("overflow buffer of {len} bytes: out of memory"))
        })?;
        let addr = ptr.as_ptr() as usize;
        if let Err(e) = live.client.register_buffer(addr, layout.size()) {
            // SAFETY: just allocated with `layout`, never handed out.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
            return Err(PyRuntimeError::new_err(format!(
                "overflow buffer registration failed: {e}"
            )));
        }
        live.memory.register(addr, layout.size());
        let backing = Backing::Overflow { ptr, layout };
        Ok(PoolMemory::new(
            addr,
            size,
            layout.size(),
            true,
            backing,
            live,
        ))
    }

    fn new(
        addr: usize,
        size: usize,
        region_len: usize,
        overflow: bool,
        backing: Backing,
        live: &Arc<Live>,
    ) -> PoolMemory {
        PoolMemory {
            addr,
            size,
            region_len,
            overflow,
            held: Mutex::new(Some(Held {
                backing,
                live: Arc::downgrade(live),
            })),
            exports: AtomicUsize::new(0),
        }
    }

    fn is_held(&self) -> bool {
        self.held.lock().is_some()
    }
}

#[pymethods]
impl PoolMemory {
    /// `size` bytes of the store's local buffer; when it has no room and
    /// `overflow_len` is given, a region of `overflow_len` bytes (at least
    /// `size`) aligned to `alignment`, registered with the store. Without
    /// `overflow_len`, a full local buffer raises `RuntimeError`.
    #[new]
    #[pyo3(signature = (store, size, overflow_len=None, alignment=64))]
    fn py_new(
        py: Python<'_>,
        store: PyRef<'_, PyStore>,
        size: Unsigned,
        overflow_len: Option<Unsigned>,
        alignment: usize,
    ) -> PyResult<PoolMemory> {
        let live = store.live.get().ok_or_else(|| {
            PyRuntimeError::new_err("MooncakeDistributedStore is not set up (or was closed)")
        })?;
        let size = size.usize();
        py.allow_threads(|| match Self::local(&live, size)? {
            Some(m) => Ok(m),
            None => match overflow_len {
                Some(len) => Self::registered(&live, size, len.usize(), alignment),
                None => Err(PyRuntimeError::new_err(format!(
                    "the local buffer has no room for {size} bytes"
                ))),
            },
        })
    }

    /// Address of the first byte; `RuntimeError` once released.
    #[getter]
    fn ptr(&self) -> PyResult<usize> {
        if self.is_held() {
            Ok(self.addr)
        } else {
            Err(PyRuntimeError::new_err("buffer lease is closed"))
        }
    }

    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// Bytes this lease holds (at least `size`, and at least 1).
    #[getter]
    fn region_len(&self) -> usize {
        self.region_len
    }

    /// Whether the bytes are an overflow region rather than local buffer.
    #[getter]
    fn overflow(&self) -> bool {
        self.overflow
    }

    /// Gives the memory back. True when this call did, False when it was
    /// already given back; `RuntimeError` while a view of it is alive.
    fn release(&self, py: Python<'_>) -> PyResult<bool> {
        if self.exports.load(Ordering::SeqCst) != 0 {
            return Err(PyRuntimeError::new_err(
                "cannot release buffer while exported views exist",
            ));
        }
        let Some(held) = self.held.lock().take() else {
            return Ok(false);
        };
        let addr = self.addr;
        py.allow_threads(move || held.free(addr));
        Ok(true)
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
        let this = slf.get();
        // Counted before the check, so a concurrent `release` either sees
        // the view or frees before the check below fails.
        this.exports.fetch_add(1, Ordering::SeqCst);
        if !this.is_held() {
            this.exports.fetch_sub(1, Ordering::SeqCst);
            return Err(PyBufferError::new_err("buffer lease is closed"));
        }
        // SAFETY: `addr..addr+size` stays valid while the memory is held,
        // and it is held while this view lives (release refuses, and the
        // view keeps `slf` alive: PyBuffer_FillInfo increfs it).
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                this.addr as *mut std::ffi::c_void,
                this.size as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if rc != 0 {
            this.exports.fetch_sub(1, Ordering::SeqCst);
            return Err(PyErr::take(slf.py())
                .unwrap_or_else(|| PyBufferError::new_err("cannot fill buffer")));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for PoolMemory {
    fn drop(&mut self) {
        if let Some(held) = self.held.get_mut().take() {
            let addr = self.addr;
            Python::with_gil(|py| py.allow_threads(move || held.free(addr)));
        }
    }
}

#[pymethods]
impl PyStore {
    /// Bytes of the local buffer `BufferPool` leases from (0: none); `None`
    /// when not set up.
    fn _local_buffer_size(&self) -> Option<u64> {
        self.live.get().map(|l| l.client.local_buffer_size())
    }
}
