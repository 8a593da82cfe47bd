//! Memory the engine transfers from and to: registration, engine-owned
//! (managed) buffers, and raw reads and writes of this process's memory.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::PyEngine;
use crate::args::{usizes, Unsigned};
use crate::buffer::Bytes;
use crate::codes::engine_status;
use crate::mem::{self, Access};

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

impl PyEngine {
    /// Whether `len` bytes at `addr` may be touched with `access`: memory the
    /// engine knows, or mapped memory of this process.
    fn usable(&self, addr: usize, len: usize, access: Access) -> bool {
        match self.ready.get() {
            Some(r) => r.usable(addr, len, access),
            None => mem::accessible(addr, len, access),
        }
    }
}

#[pymethods]
impl PyEngine {
    /// Allocates engine-owned, registered memory; its address, or 0 on failure.
    fn allocate_managed_buffer(&self, py: Python<'_>, length: Unsigned) -> usize {
        // A zero-byte request still gets a distinct buffer, as in the reference.
        let len = length.usize().max(1);
        self.ready.with(py, 0, |r| {
            // Shared memory is sparse: a buffer larger than the machine's
            // memory would be granted and then fault (SIGBUS) when touched.
            if len as u64 > physical_memory() {
                return 0;
            }
            match r.allocate_managed(len) {
                Ok(addr) => {
                    r.regions.lock().insert(addr, len);
                    addr
                }
                Err(e) => {
                    tracing::warn!("allocate_managed_buffer({len}) failed: {e}");
                    0
                }
            }
        })
    }

    /// Frees a buffer from `allocate_managed_buffer`. Like the reference it
    /// returns 0 even for an address it does not know (and then does nothing).
    fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: Unsigned, length: Unsigned) -> i32 {
        let _ = length;
        let addr = buffer_addr.usize();
        self.ready.with(py, 0, |r| {
            let Some(len) = r.regions.lock().remove(addr) else {
                return 0;
            };
            if let Err(e) = r.free_managed(addr, len) {
                tracing::warn!("free_managed_buffer({addr:#x}) failed: {e}");
            }
            0
        })
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
        if !self.usable(dst, len, Access::Write) || mem::span(dst, len).is_none() {
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
        if !self.usable(src, len, Access::Read) {
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
        let (addr, len) = (buffer_addr.usize(), capacity.usize());
        self.ready
            .with(py, -1, |r| engine_status(r.register(addr, len, location)))
    }

    fn unregister_memory(&self, py: Python<'_>, buffer_addr: Unsigned) -> i32 {
        let addr = buffer_addr.usize();
        self.ready.with(py, -1, |r| {
            let res = r.unregister(&[addr]);
            if res.is_ok() {
                r.regions.lock().remove(addr);
            }
            engine_status(res)
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
        let (addrs, lens) = (usizes(&buffer_addresses), usizes(&capacities));
        self.ready.with(py, -1, |r| {
            if addrs.len() != lens.len() {
                return -1;
            }
            for (&a, &l) in addrs.iter().zip(&lens) {
                if l == 0 || !mem::accessible(a, l, Access::Write) {
                    return -1;
                }
            }
            let pairs: Vec<(usize, usize)> =
                addrs.iter().copied().zip(lens.iter().copied()).collect();
            let res = r.register_batch(&pairs, location);
            if res.is_ok() {
                let mut regions = r.regions.lock();
                for (a, l) in pairs {
                    regions.insert(a, l);
                }
            }
            engine_status(res)
        })
    }

    fn batch_unregister_memory(&self, py: Python<'_>, buffer_addresses: Vec<Unsigned>) -> i32 {
        let addrs = usizes(&buffer_addresses);
        self.ready.with(py, -1, |r| {
            let res = r.unregister(&addrs);
            if res.is_ok() {
                let mut regions = r.regions.lock();
                for &a in &addrs {
                    regions.remove(a);
                }
            }
            engine_status(res)
        })
    }

    /// Address of the first registered buffer of `segment_name`; 0 when the
    /// segment is unknown or has none.
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: &str) -> u64 {
        self.ready.with(py, 0, |r| {
            r.engine.first_buffer_address(segment_name).unwrap_or(0)
        })
    }
}
