//! The classes replica and task calls return: `Descriptor`,
//! `MemoryDescriptor`, `DiskDescriptor`, `ReplicaDescriptor` and
//! `QueryTaskResponse`.

use mooncake_store::types::{self, ReplicaDesc, ReplicaKind};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::codes::split_uuid;
use crate::enums::{ReplicaStatus, TaskStatus, TaskType};

/// Where a memory replica's bytes are: `size`, `buffer_address`, `transport_endpoint`.
#[pyclass(module = "mooncake.store", name = "Descriptor", get_all, set_all)]
#[derive(Clone, Debug, Default)]
pub(crate) struct Descriptor {
    size: u64,
    buffer_address: u64,
    transport_endpoint: String,
}

#[pymethods]
impl Descriptor {
    #[new]
    fn new() -> Self {
        Descriptor::default()
    }

    fn __repr__(&self) -> String {
        format!(
            "<Descriptor size={} buffer_address={} transport_endpoint={}>",
            self.size, self.buffer_address, self.transport_endpoint
        )
    }
}

#[pyclass(frozen, module = "mooncake.store", name = "MemoryDescriptor")]
#[derive(Clone, Debug)]
pub(crate) struct MemoryDescriptor {
    desc: Descriptor,
}

#[pymethods]
impl MemoryDescriptor {
    #[getter]
    fn buffer_descriptor(&self) -> Descriptor {
        self.desc.clone()
    }
}

#[pyclass(frozen, module = "mooncake.store", name = "DiskDescriptor", get_all)]
#[derive(Clone, Debug)]
pub(crate) struct DiskDescriptor {
    file_path: String,
    object_size: u64,
}

/// One replica of an object.
#[pyclass(frozen, module = "mooncake.store", name = "ReplicaDescriptor")]
#[derive(Clone, Debug)]
pub(crate) struct ReplicaDescriptor {
    #[pyo3(get)]
    status: ReplicaStatus,
    kind: ReplicaKind,
}

impl From<ReplicaDesc> for ReplicaDescriptor {
    fn from(r: ReplicaDesc) -> Self {
        use types::ReplicaStatus as S;
        let status = match r.status {
            S::Undefined => ReplicaStatus::UNDEFINED,
            S::Initialized => ReplicaStatus::INITIALIZED,
            S::Processing => ReplicaStatus::PROCESSING,
            S::Complete => ReplicaStatus::COMPLETE,
            S::Removed => ReplicaStatus::REMOVED,
            S::Failed => ReplicaStatus::FAILED,
        };
        ReplicaDescriptor {
            status,
            kind: r.kind,
        }
    }
}

#[pymethods]
impl ReplicaDescriptor {
    fn is_memory_replica(&self) -> bool {
        matches!(self.kind, ReplicaKind::Memory(_))
    }

    fn is_disk_replica(&self) -> bool {
        matches!(self.kind, ReplicaKind::Disk(_))
    }

    fn is_local_disk_replica(&self) -> bool {
        matches!(self.kind, ReplicaKind::LocalDisk(_))
    }

    fn get_memory_descriptor(&self) -> PyResult<MemoryDescriptor> {
        match &self.kind {
            ReplicaKind::Memory(m) => Ok(MemoryDescriptor {
                desc: Descriptor {
                    size: m.size,
                    buffer_address: m.buffer_address,
                    transport_endpoint: m.transport_endpoint.clone(),
                },
            }),
            _ => Err(PyRuntimeError::new_err("Expected MemoryDescriptor")),
        }
    }

    fn get_disk_descriptor(&self) -> PyResult<DiskDescriptor> {
        match &self.kind {
            ReplicaKind::Disk(d) => Ok(DiskDescriptor {
                file_path: d.file_path.clone(),
                object_size: d.object_size,
            }),
            _ => Err(PyRuntimeError::new_err("Expected DiskDescriptor")),
        }
    }
}

/// A copy or move task's state, as `query_task` reports it.
#[pyclass(module = "mooncake.store", name = "QueryTaskResponse", get_all)]
#[derive(Clone, Debug)]
pub(crate) struct QueryTaskResponse {
    id: (u64, u64),
    r#type: TaskType,
    status: TaskStatus,
    created_at_ms_epoch: u64,
    last_updated_at_ms_epoch: u64,
    assigned_client: (u64, u64),
    message: String,
}

impl From<types::TaskInfo> for QueryTaskResponse {
    fn from(t: types::TaskInfo) -> Self {
        use types::{TaskStatus as S, TaskType as T};
        QueryTaskResponse {
            id: split_uuid(t.id),
            r#type: match t.task_type {
                T::ReplicaCopy => TaskType::REPLICA_COPY,
                T::ReplicaMove => TaskType::REPLICA_MOVE,
            },
            status: match t.status {
                S::Pending => TaskStatus::PENDING,
                S::Processing => TaskStatus::PROCESSING,
                S::Success => TaskStatus::SUCCESS,
                S::Failed => TaskStatus::FAILED,
            },
            created_at_ms_epoch: t.created_at_ms_epoch,
            last_updated_at_ms_epoch: t.last_updated_at_ms_epoch,
            assigned_client: split_uuid(t.assigned_client),
            message: t.message,
        }
    }
}

#[pymethods]
impl QueryTaskResponse {
    /// As the reference prints it: ids as `hi-lo`, enums as numbers.
    fn __repr__(&self) -> String {
        format!(
            "QueryTaskResponse(id={}-{}, type={}, status={}, created_at={}, last_updated_at={}, assigned_client={}-{}, message=\"{}\")",
            self.id.0,
            self.id.1,
            self.r#type as i64,
            self.status as i64,
            self.created_at_ms_epoch,
            self.last_updated_at_ms_epoch,
            self.assigned_client.0,
            self.assigned_client.1,
            self.message
        )
    }

    #[new]
    fn new() -> Self {
        QueryTaskResponse {
            id: (0, 0),
            r#type: TaskType::REPLICA_COPY,
            status: TaskStatus::PENDING,
            created_at_ms_epoch: 0,
            last_updated_at_ms_epoch: 0,
            assigned_client: (0, 0),
            message: String::new(),
        }
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Descriptor>()?;
    m.add_class::<MemoryDescriptor>()?;
    m.add_class::<DiskDescriptor>()?;
    m.add_class::<ReplicaDescriptor>()?;
    m.add_class::<QueryTaskResponse>()?;
    Ok(())
}
