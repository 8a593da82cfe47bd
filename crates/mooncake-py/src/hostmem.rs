//! `MooncakeHostMemAllocator` and `bind_to_numa_node`: host memory helpers
//! of `mooncake.store`.

use std::collections::HashMap;

use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::args::Unsigned;
use crate::mem::{self, Access};

/// Page-aligned, zeroed memory shared-mapped (so it can be handed to another
/// process on this host), for buffers that `register_buffer` then uses.
#[pyclass(frozen, module = "mooncake.store", name = "MooncakeHostMemAllocator")]
pub(crate) struct HostMemAllocator {
    /// addr -> length of live mappings made here.
    maps: Mutex<HashMap<usize, usize>>,
}

#[pymethods]
impl HostMemAllocator {
    #[new]
    fn new() -> Self {
        HostMemAllocator {
            maps: Mutex::new(HashMap::new()),
        }
    }

    /// Address of `size` fresh bytes; `RuntimeError` when they cannot be mapped.
    fn alloc(&self, size: Unsigned) -> PyResult<usize> {
        let len = size.usize();
        if len == 0 {
            return Err(PyRuntimeError::new_err(
                "Failed to map shared memory: Invalid argument",
            ));
        }
        // SAFETY: an anonymous shared mapping with no address hint touches no
        // existing memory; failure is reported as MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(PyRuntimeError::new_err(format!(
                "Failed to map shared memory: {e}"
            )));
        }
        self.maps.lock().insert(p as usize, len);
        Ok(p as usize)
    }

    /// 0, or -1 for an address this allocator did not hand out or that is
    /// still registered with a store or an engine (unregister it first:
    /// unmapping it would leave them writing into unmapped or reused memory).
    fn free(&self, ptr: Unsigned) -> i32 {
        let mut maps = self.maps.lock();
        let Some(&len) = maps.get(&ptr.usize()) else {
            return -1;
        };
        if mem::is_registered(ptr.usize(), len) {
            return -1;
        }
        maps.remove(&ptr.usize());
        // SAFETY: `ptr..ptr+len` is a mapping this allocator made and has
        // not unmapped yet (it was still in `maps`).
        unsafe { libc::munmap(ptr.usize() as *mut libc::c_void, len) };
        0
    }
}

/// Prefers CPUs and memory of NUMA node `node` for the calling thread
/// (best effort, as in the reference: an unknown node changes nothing).
#[pyfunction]
pub(crate) fn bind_to_numa_node(node: i64) {
    let Ok(node) = u32::try_from(node) else {
        return;
    };
    let Ok(list) = std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/cpulist"))
    else {
        return;
    };
    let cpus = parse_cpulist(&list);
    if cpus.is_empty() {
        return;
    }
    // SAFETY: the set is a plain bitmap initialized by CPU_ZERO/CPU_SET for
    // indices below CPU_SETSIZE, passed by reference for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for c in cpus.into_iter().filter(|&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Parses a kernel CPU list such as `0-3,8,10-11`.
fn parse_cpulist(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    out.extend(a..=b.min(a + 4096));
                }
            }
            None => out.extend(part.parse::<usize>()),
        }
    }
    out
}

/// Whether `size` bytes at `ptr` are readable memory of this process (used
/// by the Python tensor helpers before they view raw memory).
#[pyfunction]
pub(crate) fn _readable(ptr: Unsigned, size: Unsigned) -> bool {
    mem::accessible(ptr.usize(), size.usize(), Access::Read)
}

/// Whether `size` bytes at `ptr` are writable memory of this process (used
/// by the Python tensor helpers before they copy into a caller's buffer).
#[pyfunction]
pub(crate) fn _writable(ptr: Unsigned, size: Unsigned) -> bool {
    mem::accessible(ptr.usize(), size.usize(), Access::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
        assert_eq!(parse_cpulist("x,2"), vec![2]);
    }
}
