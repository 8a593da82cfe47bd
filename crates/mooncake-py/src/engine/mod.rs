//! `mooncake.engine`: the reference's `TransferEngine` Python class over the
//! Rust [`mooncake_transfer::TransferEngine`].
//!
//! Return conventions follow the reference binding: ints are 0 on success and
//! negative on failure (memory registration returns the reference engine's
//! codes, see [`crate::codes::engine_code`]); async submissions return a
//! batch id, 0 on failure.
//!
//! - `ready`: the running engine and its bookkeeping;
//! - `transfer`: every `transfer_*` method, through one function;
//! - `memory`: registration, managed buffers, raw reads and writes;
//! - `request`: `TransferOpcode`, `TransferNotify`;
//! - `topology`: `get_local_topology`.

use std::sync::Arc;

use mooncake_transfer::{EngineConfig, TransferEngine};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::running::Running;
use ready::Ready;
use request::{PyNotify, PyOpcode};

mod memory;
mod ready;
mod request;
mod tent;
mod topology;
mod transfer;

/// The underlying engine, as `get_engine()` hands it out.
/// `MooncakeDistributedStore.setup(engine=...)` runs the store on it: its
/// name, metadata server, port and registered memory.
#[pyclass(frozen, module = "mooncake.engine", name = "InnerTransferEngine")]
pub(crate) struct InnerEngine {
    /// Keeps the engine running while Python holds this object.
    engine: TransferEngine,
}

impl InnerEngine {
    /// The engine, for a store set up on it (`setup(..., engine=...)`).
    pub(crate) fn engine(&self) -> &TransferEngine {
        &self.engine
    }
}

/// `mooncake.engine.TransferEngine`.
#[pyclass(frozen, module = "mooncake.engine", name = "TransferEngine")]
pub(crate) struct PyEngine {
    ready: Running<Ready>,
}

impl PyEngine {
    /// Starts an engine of `config`, replacing the running one; 0, or -1 on
    /// failure.
    fn start(&self, py: Python<'_>, config: EngineConfig) -> i32 {
        // The previous engine goes first: the new one may reuse its name and port.
        let old = self.ready.take();
        match py.allow_threads(move || {
            drop(old);
            if tent::selected() {
                tent::start(config.metadata_server(), config.local_server_name())
                    .map(Ready::new_tent)
            } else {
                TransferEngine::new(config).map(Ready::new)
            }
        }) {
            Ok(ready) => {
                self.ready.set(ready);
                0
            }
            Err(e) => {
                tracing::error!("TransferEngine.initialize failed: {e}");
                -1
            }
        }
    }
}

/// What `initialize` starts: `metadata_server` (or `MC_METADATA_SERVER`)
/// with this engine's name, transport and devices.
fn engine_config(
    local_hostname: &str,
    metadata_server: &str,
    protocol: &str,
    device_name: &str,
) -> EngineConfig {
    let mut config = EngineConfig::new(&metadata_or_env(metadata_server), local_hostname);
    config.protocol = protocol.to_owned();
    config.device_name = device_name.to_owned();
    config
}

#[pymethods]
impl PyEngine {
    #[new]
    fn new() -> Self {
        crate::init_logging();
        PyEngine {
            ready: Running::new(),
        }
    }

    /// Starts the engine; 0 on success, -1 on failure. Calling it again
    /// replaces the running engine.
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        let config = engine_config(local_hostname, metadata_server, protocol, device_name);
        self.start(py, config)
    }

    /// Like `initialize`, with the metadata backend named separately
    /// (`etcd`, `redis`, `http`, `P2PHANDSHAKE`) for a bare `host:port` server.
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
        metadata_type: &str,
    ) -> i32 {
        let server = if metadata_server.contains("://")
            || metadata_server == "P2PHANDSHAKE"
            || metadata_type.is_empty()
            || metadata_type.eq_ignore_ascii_case("p2phandshake")
        {
            metadata_server.to_owned()
        } else {
            format!("{}://{metadata_server}", metadata_type.to_ascii_lowercase())
        };
        self.start(
            py,
            engine_config(local_hostname, &server, protocol, device_name),
        )
    }

    /// The engine's RPC port (the port peers reach it on); 0 before `initialize`.
    fn get_rpc_port(&self) -> u16 {
        self.ready.get().map_or(0, |r| r.engine.rpc_port())
    }

    fn get_engine(&self) -> PyResult<InnerEngine> {
        self.ready
            .get()
            .map(|r| InnerEngine {
                engine: r.engine.clone(),
            })
            .ok_or_else(|| PyValueError::new_err("TransferEngine is not initialized"))
    }

    /// An opaque non-zero id of the underlying engine (0 before `initialize`).
    fn get_engine_ptr(&self) -> usize {
        self.ready.get().map_or(0, |r| Arc::as_ptr(&r) as usize)
    }

    /// Checks that `peer_server_name` is reachable; 0 when it is, the
    /// reference's metadata failure code (-200) when not.
    fn send_probe(&self, py: Python<'_>, peer_server_name: &str) -> i32 {
        self.ready
            .with(py, -1, |r| match r.segment(peer_server_name) {
                Ok(_) => 0,
                Err(_) => -200,
            })
    }

    /// Drains the notifications other engines sent to this one.
    fn get_notifies(&self, py: Python<'_>) -> Vec<PyNotify> {
        self.ready
            .with(py, Vec::new(), |r| r.engine.get_notifies())
            .into_iter()
            .map(|n| PyNotify {
                name: n.name,
                msg: n.msg,
            })
            .collect()
    }
}

/// `server`, or when it is empty `MC_METADATA_SERVER` (then `P2PHANDSHAKE`).
pub(crate) fn metadata_or_env(server: &str) -> String {
    if !server.trim().is_empty() {
        return server.to_owned();
    }
    std::env::var("MC_METADATA_SERVER")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "P2PHANDSHAKE".to_owned())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngine>()?;
    m.add_class::<PyOpcode>()?;
    m.add_class::<PyNotify>()?;
    m.add_class::<InnerEngine>()?;
    Ok(())
}
