//! What `mooncake._mooncake.pg` (`pg`, `pg_group`) shares: the
//! failure they raise, deadlines and flags from Python's numbers, and
//! tensors' raw addresses as byte slices.

use std::time::{Duration, Instant};

use mooncake_pg::{Flag, GroupError};
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    mooncake.pg,
    PeerFailure,
    PyRuntimeError,
    "Ranks of the group died during an operation; args: (message, ranks)."
);

pub(crate) fn err(e: GroupError) -> PyErr {
    match e {
        GroupError::Dead(ranks) => {
            PeerFailure::new_err((format!("ranks {ranks:?} of the group are dead"), ranks))
        }
        GroupError::Timeout => PyTimeoutError::new_err("timed out waiting for a peer rank"),
        GroupError::Setup(m) => PyRuntimeError::new_err(m),
    }
}

pub(crate) fn deadline(timeout_s: f64) -> PyResult<Instant> {
    if !(timeout_s.is_finite() && timeout_s >= 0.0) {
        return Err(PyValueError::new_err(format!("bad timeout {timeout_s}")));
    }
    Ok(Instant::now() + Duration::from_secs_f64(timeout_s.min(1e9)))
}

pub(crate) fn flag(n: usize) -> PyResult<Flag> {
    Flag::from_index(n).ok_or_else(|| PyValueError::new_err(format!("no flag {n}")))
}

/// # Safety
/// `addr..addr+n` must be readable for the returned lifetime.
pub(crate) unsafe fn bytes<'a>(addr: usize, n: usize) -> &'a [u8] {
    if n == 0 {
        return &[];
    }
    // SAFETY: per the contract above.
    unsafe { std::slice::from_raw_parts(addr as *const u8, n) }
}

/// # Safety
/// `addr..addr+n` must be writable and unaliased for the returned lifetime.
pub(crate) unsafe fn bytes_mut<'a>(addr: usize, n: usize) -> &'a mut [u8] {
    if n == 0 {
        return &mut [];
    }
    // SAFETY: per the contract above.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, n) }
}
