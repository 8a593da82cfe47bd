//! `mooncake._mooncake.p2p_store`: the P2P Store (`mooncake-p2p-store`) for
//! Python, behind `mooncake.p2p_store`. The reference has it in Go only; the
//! calls keep the Go API's names and arguments (`addr_list`, `size_list`,
//! `max_shard_size`, `location`, `force_create`), and failures raise
//! `P2PStoreError(message, code)` with the engine's code. Every call
//! releases the GIL.

use std::collections::BTreeMap;

use mooncake_p2p_store::{P2PStore, P2pError, DEFAULT_SHARD_SIZE};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::Unsigned;
use crate::mem::{self, Access};

pyo3::create_exception!(
    mooncake.p2p_store,
    P2PStoreError,
    PyRuntimeError,
    "A P2P Store call failed; args: (message, code), code as the engine's error.h."
);

fn err(e: P2pError) -> PyErr {
    P2PStoreError::new_err((e.to_string(), e.code().code()))
}

/// `(addr, size)` pairs, each checked to be mapped in this process with
/// `access`: a bad address is an error, not a crash.
fn buffers(
    addr_list: &[Unsigned],
    size_list: &[Unsigned],
    access: Access,
) -> PyResult<Vec<(u64, u64)>> {
    if addr_list.len() != size_list.len() || addr_list.is_empty() {
        return Err(err(P2pError::InvalidArgument(format!(
            "{} addresses and {} sizes",
            addr_list.len(),
            size_list.len()
        ))));
    }
    addr_list
        .iter()
        .zip(size_list)
        .map(|(a, s)| {
            if s.0 > 0 && !mem::accessible(a.usize(), s.usize(), access) {
                return Err(err(P2pError::InvalidArgument(format!(
                    "{:#x}+{} is not memory of this process",
                    a.0, s.0
                ))));
            }
            Ok((a.0, s.0))
        })
        .collect()
}

#[pyclass(module = "mooncake._mooncake.p2p_store", name = "P2PStore", frozen)]
struct PyP2PStore {
    inner: P2PStore,
}

#[pymethods]
impl PyP2PStore {
    /// Starts an engine named `local_server_name` with `metadata_server`
    /// (etcd) holding its segments and the catalog.
    #[new]
    fn new(py: Python<'_>, metadata_server: String, local_server_name: String) -> PyResult<Self> {
        crate::init_logging();
        let inner = py
            .allow_threads(|| P2PStore::new(&metadata_server, &local_server_name))
            .map_err(err)?;
        Ok(PyP2PStore { inner })
    }

    #[getter]
    fn local_server_name(&self) -> String {
        self.inner.local_server_name().to_string()
    }

    // The Go API's arguments, one Python argument each.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, addr_list, size_list, max_shard_size = DEFAULT_SHARD_SIZE, location = "cpu:0", force_create = false))]
    fn register(
        &self,
        py: Python<'_>,
        name: String,
        addr_list: Vec<Unsigned>,
        size_list: Vec<Unsigned>,
        max_shard_size: u64,
        location: &str,
        force_create: bool,
    ) -> PyResult<()> {
        let bufs = buffers(&addr_list, &size_list, Access::Read)?;
        py.allow_threads(|| {
            self.inner
                .register(&name, &bufs, max_shard_size, location, force_create)
        })
        .map_err(err)
    }

    fn unregister(&self, py: Python<'_>, name: String) -> PyResult<()> {
        py.allow_threads(|| self.inner.unregister(&name))
            .map_err(err)
    }

    /// Returns `{"bytes_from": {segment: bytes}, "failed_holders": [...],
    /// "reread": n}`.
    fn get_replica<'py>(
        &self,
        py: Python<'py>,
        name: String,
        addr_list: Vec<Unsigned>,
        size_list: Vec<Unsigned>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let bufs = buffers(&addr_list, &size_list, Access::Write)?;
        let report = py
            .allow_threads(|| self.inner.get_replica(&name, &bufs))
            .map_err(err)?;
        let d = PyDict::new(py);
        let from: BTreeMap<String, u64> = report.bytes_from;
        d.set_item("bytes_from", from)?;
        d.set_item("failed_holders", report.failed_holders)?;
        d.set_item("reread", report.reread)?;
        Ok(d)
    }

    fn delete_replica(&self, py: Python<'_>, name: String) -> PyResult<()> {
        py.allow_threads(|| self.inner.delete_replica(&name))
            .map_err(err)
    }

    /// The records under `name_prefix`, as dicts with the Go
    /// `PayloadInfo`'s fields: `name`, `max_shard_size`, `total_size`,
    /// `size_list`.
    #[pyo3(signature = (name_prefix = String::new()))]
    fn list<'py>(&self, py: Python<'py>, name_prefix: String) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let infos = py
            .allow_threads(|| self.inner.list(&name_prefix))
            .map_err(err)?;
        infos
            .into_iter()
            .map(|i| {
                let d = PyDict::new(py);
                d.set_item("name", i.name)?;
                d.set_item("max_shard_size", i.max_shard_size)?;
                d.set_item("total_size", i.total_size)?;
                d.set_item("size_list", i.size_list)?;
                Ok(d)
            })
            .collect()
    }

    fn close(&self, py: Python<'_>) {
        py.allow_threads(|| self.inner.close())
    }
}

pub(crate) fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = parent.py();
    let m = PyModule::new(py, "p2p_store")?;
    m.add_class::<PyP2PStore>()?;
    m.add("P2PStoreError", py.get_type::<P2PStoreError>())?;
    m.add("DEFAULT_SHARD_SIZE", DEFAULT_SHARD_SIZE)?;
    parent.add_submodule(&m)
}
