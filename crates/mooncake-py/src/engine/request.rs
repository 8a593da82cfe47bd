//! What a transfer call carries from Python: `TransferOpcode` and
//! `TransferNotify`.

use mooncake_transfer::{Notify, Opcode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

#[pyclass(module = "mooncake.engine", name = "TransferOpcode", eq, eq_int)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PyOpcode {
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
pub(crate) struct PyNotify {
    pub(crate) name: String,
    pub(crate) msg: String,
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

impl From<&PyNotify> for Notify {
    fn from(n: &PyNotify) -> Notify {
        Notify {
            name: n.name.clone(),
            msg: n.msg.clone(),
        }
    }
}
