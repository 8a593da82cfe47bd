//! Argument conversions that behave like the reference's pybind11 bindings.

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;

/// A non-negative integer argument (address, size, id). A negative or
/// too-large value is a `TypeError`, as pybind11's unsigned conversion
/// reports it (pyo3 alone would raise `OverflowError`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unsigned(pub(crate) u64);

impl Unsigned {
    pub(crate) fn usize(self) -> usize {
        // Addresses and sizes are 64-bit on every platform we build for.
        self.0 as usize
    }
}

impl<'py> FromPyObject<'py> for Unsigned {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        match ob.extract::<u64>() {
            Ok(v) => Ok(Unsigned(v)),
            Err(e) if e.is_instance_of::<PyOverflowError>(ob.py()) => Err(PyTypeError::new_err(
                format!("incompatible function arguments: expected a non-negative integer that fits in 64 bits, got {ob}"),
            )),
            Err(e) => Err(e),
        }
    }
}

pub(crate) fn usizes(v: &[Unsigned]) -> Vec<usize> {
    v.iter().map(|u| u.usize()).collect()
}

pub(crate) fn usize_lists(v: &[Vec<Unsigned>]) -> Vec<Vec<usize>> {
    v.iter().map(|l| usizes(l)).collect()
}

pub(crate) fn u64s(v: &[Unsigned]) -> Vec<u64> {
    v.iter().map(|u| u.0).collect()
}

/// A boolean argument converted as pybind11 does: `True`/`False`, `None`
/// (false), or any object with a numeric truth value (`1`, `0`,
/// `numpy.bool_`). Strings and other non-numbers are a `TypeError`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flag(pub(crate) bool);

impl<'py> FromPyObject<'py> for Flag {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = ob.extract::<bool>() {
            return Ok(Flag(b));
        }
        if ob.is_none() {
            return Ok(Flag(false));
        }
        // SAFETY: the type pointer of a live object is valid; tp_as_number may be null.
        let has_nb_bool = unsafe {
            let tp = pyo3::ffi::Py_TYPE(ob.as_ptr());
            let nb = (*tp).tp_as_number;
            !nb.is_null() && (*nb).nb_bool.is_some()
        };
        if has_nb_bool {
            return ob.is_truthy().map(Flag);
        }
        Err(incompatible("a bool", ob))
    }
}

/// An object key: `str`, or `bytes` decoded as UTF-8 (pybind11 converts
/// bytes to `std::string` too). Anything else is a `TypeError`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Key(pub(crate) String);

impl<'py> FromPyObject<'py> for Key {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(s) = ob.extract::<String>() {
            return Ok(Key(s));
        }
        if let Ok(b) = ob.downcast::<pyo3::types::PyBytes>() {
            return String::from_utf8(b.as_bytes().to_vec())
                .map(Key)
                .map_err(|_| {
                    PyTypeError::new_err("incompatible function arguments: key bytes are not UTF-8")
                });
        }
        Err(incompatible("a str key", ob))
    }
}

pub(crate) fn keys(v: Vec<Key>) -> Vec<String> {
    v.into_iter().map(|k| k.0).collect()
}

/// pybind11's `TypeError` for an argument that is not `expected`.
pub(crate) fn incompatible(expected: &str, ob: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "incompatible function arguments: expected {expected}, got {}",
        type_name(ob)
    ))
}

/// The name of `ob`'s type, for error messages.
pub(crate) fn type_name(ob: &Bound<'_, PyAny>) -> String {
    ob.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}
