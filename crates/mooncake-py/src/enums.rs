//! Small int enums of the store API, shaped like the reference's pybind11
//! enums: `Enum.MEMBER`, `Enum(value)`, `.name`, `.value`, `int()`, equality
//! with ints, `__members__`, and reprs such as `<ReplicaStatus.COMPLETE: 3>`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

macro_rules! py_enum {
    ($(#[$doc:meta])* $rust:ident, $py:literal, $module:literal { $($member:ident = $value:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[pyclass(module = $module, name = $py, eq, eq_int, hash, frozen)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        pub(crate) enum $rust {
            $($member = $value,)+
        }

        impl $rust {
            pub(crate) const ALL: &'static [$rust] = &[$($rust::$member,)+];

            pub(crate) fn name(self) -> &'static str {
                match self { $($rust::$member => stringify!($member),)+ }
            }

            pub(crate) fn from_value(v: i64) -> Option<$rust> {
                match v { $($value => Some($rust::$member),)+ _ => None }
            }
        }

        #[pymethods]
        impl $rust {
            #[new]
            fn py_new(value: i64) -> PyResult<Self> {
                $rust::from_value(value)
                    .ok_or_else(|| PyValueError::new_err(format!("{value} is not a valid {}", $py)))
            }

            #[getter(name)]
            fn py_name(&self) -> &'static str {
                self.name()
            }

            #[getter]
            fn value(&self) -> i64 {
                *self as i64
            }

            fn __str__(&self) -> String {
                format!("{}.{}", $py, self.name())
            }

            fn __repr__(&self) -> String {
                format!("<{}.{}: {}>", $py, self.name(), *self as i64)
            }

            #[classattr]
            fn __members__(py: Python<'_>) -> PyResult<Py<PyDict>> {
                let d = PyDict::new(py);
                for m in $rust::ALL {
                    d.set_item(m.name(), Py::new(py, *m)?)?;
                }
                Ok(d.unbind())
            }
        }
    };
}

py_enum!(
    /// Status of a replica as the master tracks it.
    ReplicaStatus, "ReplicaStatus", "mooncake.store" {
        UNDEFINED = 0, INITIALIZED = 1, PROCESSING = 2, COMPLETE = 3, REMOVED = 4, FAILED = 5,
    }
);

py_enum!(
    /// What a put does to an object's soft pin.
    SoftPinAction, "SoftPinAction", "mooncake.store" { PRESERVE = 0, ENABLE = 1, DISABLE = 2 }
);

py_enum!(
    /// A hint about what an object holds (carried, not interpreted).
    ObjectDataType, "ObjectDataType", "mooncake.store" {
        UNKNOWN = 0, KVCACHE = 1, TENSOR = 2, WEIGHT = 3, SAMPLE = 4, ACTIVATION = 5,
        GRADIENT = 6, OPTIMIZER_STATE = 7, METADATA = 8, GENERAL = 9,
    }
);

py_enum!(
    /// State of a copy or move task.
    TaskStatus, "TaskStatus", "mooncake.store" { PENDING = 0, PROCESSING = 1, FAILED = 2, SUCCESS = 3 }
);

py_enum!(
    /// Kind of a replica task.
    TaskType, "TaskType", "mooncake.store" { REPLICA_COPY = 0, REPLICA_MOVE = 1 }
);

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ReplicaStatus>()?;
    m.add_class::<SoftPinAction>()?;
    m.add_class::<ObjectDataType>()?;
    m.add_class::<TaskStatus>()?;
    m.add_class::<TaskType>()?;
    Ok(())
}
