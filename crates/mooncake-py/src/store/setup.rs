//! Joining and leaving the cluster, health, and the memory a script hands
//! the store (`register_buffer`, `alloc_from_mem_pool`).

use mooncake_common::size::parse_size;
use mooncake_common::Error;
use mooncake_store::client::http::DEFAULT_CLIENT_HTTP_PORT;
use mooncake_store::client::ClientConfig;
use mooncake_store::Client;
use mooncake_transfer::TransferEngine;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::memory::KnownMemory;
use super::{Live, PyStore};
use crate::args::{Flag, Unsigned};
use crate::codes::{self, code, INVALID, NOT_READY};
use crate::engine::InnerEngine;
use crate::mem::{self, Access};
use crate::running::Running;

const MIB: u64 = 1 << 20;

/// What `setup` was given, in either of its forms, before defaults apply.
struct SetupArgs {
    local_hostname: String,
    metadata_server: String,
    global_segment_size: u64,
    local_buffer_size: u64,
    protocol: Option<String>,
    device_name: Option<String>,
    master_server_addr: Option<String>,
    /// `enable_client_http_server`: the port of the client HTTP server.
    http_port: Option<u16>,
    enable_ssd_offload: bool,
    ssd_offload_path: Option<String>,
    tenant_id: Option<String>,
}

/// The client HTTP port asked for: `client_http_port` (default 9300) when
/// `enable_client_http_server`; a port out of range is INVALID_PARAMS.
fn http_port(enable: bool, port: Option<u64>) -> Result<Option<u16>, i32> {
    if !enable {
        return Ok(None);
    }
    let port = port.unwrap_or(u64::from(DEFAULT_CLIENT_HTTP_PORT));
    u16::try_from(port).map(Some).map_err(|_| INVALID)
}

impl SetupArgs {
    fn config(self) -> ClientConfig {
        let defaults = ClientConfig::default();
        ClientConfig {
            local_hostname: self.local_hostname,
            metadata_server: self.metadata_server,
            global_segment_size: self.global_segment_size,
            local_buffer_size: self.local_buffer_size,
            protocol: self.protocol.unwrap_or_else(|| "tcp".into()),
            device_name: self.device_name.unwrap_or_default(),
            master_server_address: self
                .master_server_addr
                .unwrap_or_else(ClientConfig::master_from_env),
            enable_offload: self.enable_ssd_offload,
            offload_path: self.ssd_offload_path,
            tenant_id: self.tenant_id.map_or(defaults.tenant_id.clone(), |t| {
                mooncake_store::tenant::normalize(&t).to_owned()
            }),
            ..defaults
        }
    }

    /// `setup(config_dict)`: the keyword names as keys (and the aliases
    /// `device_name`, `master_server_address`); sizes as ints or strings
    /// such as `"16 MB"`. A missing hostname or server, or a bad size, is
    /// INVALID_PARAMS.
    fn from_dict(d: &Bound<'_, PyDict>) -> Result<SetupArgs, i32> {
        let (Some(local_hostname), Some(metadata_server)) = (
            dict_str(d, "local_hostname"),
            dict_str(d, "metadata_server"),
        ) else {
            return Err(INVALID);
        };
        Ok(SetupArgs {
            local_hostname,
            metadata_server,
            global_segment_size: dict_size(d, "global_segment_size", 16 * MIB)?,
            local_buffer_size: dict_size(d, "local_buffer_size", 16 * MIB)?,
            protocol: dict_str(d, "protocol"),
            device_name: dict_str(d, "rdma_devices").or_else(|| dict_str(d, "device_name")),
            master_server_addr: dict_str(d, "master_server_addr")
                .or_else(|| dict_str(d, "master_server_address")),
            http_port: http_port(
                dict_flag(d, "enable_client_http_server"),
                d.get_item("client_http_port")
                    .ok()
                    .flatten()
                    .map(|v| v.extract::<u64>().map_err(|_| INVALID))
                    .transpose()?,
            )?,
            enable_ssd_offload: dict_flag(d, "enable_ssd_offload"),
            ssd_offload_path: dict_str(d, "ssd_offload_path"),
            tenant_id: dict_str(d, "tenant_id"),
        })
    }
}

/// A size entry: an int or a string such as `"16 MB"`; `Err` when it is
/// neither or negative.
fn dict_size(d: &Bound<'_, PyDict>, key: &str, default: u64) -> Result<u64, i32> {
    let Ok(Some(v)) = d.get_item(key) else {
        return Ok(default);
    };
    if let Ok(n) = v.extract::<i64>() {
        return u64::try_from(n).map_err(|_| INVALID);
    }
    match v.extract::<String>() {
        Ok(s) => parse_size(&s).map_err(|_| INVALID),
        Err(_) => Err(INVALID),
    }
}

/// Whether `host:port` (or `[v6]:port`) names a port.
fn names_port(hostname: &str) -> bool {
    let h = hostname.trim();
    let tail = match h.strip_prefix('[') {
        Some(rest) => rest.split_once("]:").map(|(_, p)| p),
        None => h
            .rsplit_once(':')
            .filter(|(host, _)| !host.contains(':'))
            .map(|(_, p)| p),
    };
    tail.is_some_and(|p| p.parse::<u16>().is_ok())
}

/// A boolean entry (`True`, `1`, `"true"`, ...); false when absent or unreadable.
fn dict_flag(d: &Bound<'_, PyDict>, key: &str) -> bool {
    d.get_item(key)
        .ok()
        .flatten()
        .and_then(|v| v.extract::<Flag>().ok())
        .is_some_and(|f| f.0)
}

fn dict_str(d: &Bound<'_, PyDict>, key: &str) -> Option<String> {
    d.get_item(key)
        .ok()
        .flatten()
        .and_then(|v| v.extract::<String>().ok())
}

impl PyStore {
    /// Starts the client `make` builds, with the client HTTP server on
    /// `http_port` when asked; `named_port`: how a failed join is coded.
    fn start(
        &self,
        py: Python<'_>,
        named_port: bool,
        make: impl FnOnce() -> Result<Client, Error> + Send,
        http_port: Option<u16>,
    ) -> i32 {
        // A second setup on a live object replaces it, as in the reference.
        let old = self.live.take();
        py.allow_threads(|| {
            if let Some(old) = old {
                let _ = old.client.close();
            }
            match make() {
                Ok(client) => {
                    let http = match http_port.map(|p| client.start_http_server("0.0.0.0", p)) {
                        None => None,
                        Some(Ok(server)) => Some(server),
                        Some(Err(e)) => {
                            tracing::error!("client HTTP server: {e}");
                            let _ = client.close();
                            return codes::setup(&e, named_port);
                        }
                    };
                    let live = Live {
                        client,
                        memory: KnownMemory::default(),
                        _http: http,
                    };
                    self.live.set(live);
                    0
                }
                Err(e) => {
                    tracing::error!("store setup failed: {e}");
                    codes::setup(&e, named_port)
                }
            }
        })
    }

    fn setup_config(
        &self,
        py: Python<'_>,
        mut cfg: ClientConfig,
        engine: Option<TransferEngine>,
        http_port: Option<u16>,
    ) -> i32 {
        cfg.metadata_server = crate::engine::metadata_or_env(&cfg.metadata_server);
        if cfg.protocol.is_empty() {
            cfg.protocol = "tcp".into();
        }
        if let Err(e) = cfg.validate() {
            return code(&e);
        }
        let named_port = names_port(&cfg.local_hostname);
        self.start(
            py,
            named_port,
            move || match engine {
                Some(engine) => Client::setup_with_engine(&cfg, engine),
                None => Client::setup(&cfg),
            },
            http_port,
        )
    }
}

#[pymethods]
impl PyStore {
    #[new]
    fn new() -> Self {
        crate::init_logging();
        PyStore {
            live: Running::new(),
        }
    }

    /// `setup(local_hostname, metadata_server, global_segment_size=16MiB,
    /// local_buffer_size=1GiB, protocol="tcp", rdma_devices="",
    /// master_server_addr="127.0.0.1:50051", engine=None, ...)`, or
    /// `setup(config_dict)` with the same keys (sizes may be strings such as
    /// `"16 MB"`). Returns 0 or a negative code.
    #[pyo3(signature = (
        local_hostname, metadata_server = None, global_segment_size = None, local_buffer_size = None,
        protocol = None, rdma_devices = None, master_server_addr = None, engine = None,
        enable_ssd_offload = Flag(false), ssd_offload_path = None, tenant_id = None,
        enable_client_http_server = Flag(false), client_http_port = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn setup(
        &self,
        py: Python<'_>,
        local_hostname: &Bound<'_, PyAny>,
        metadata_server: Option<String>,
        global_segment_size: Option<Unsigned>,
        local_buffer_size: Option<Unsigned>,
        protocol: Option<String>,
        rdma_devices: Option<String>,
        master_server_addr: Option<String>,
        engine: Option<PyRef<'_, InnerEngine>>,
        enable_ssd_offload: Flag,
        ssd_offload_path: Option<String>,
        tenant_id: Option<String>,
        enable_client_http_server: Flag,
        client_http_port: Option<Unsigned>,
    ) -> PyResult<i32> {
        // The engine's Python wrapper keeps it alive; the store holds its own
        // handle, so the engine also outlives a wrapper dropped first.
        let engine = engine.map(|e| e.engine().clone());
        let args = if let Ok(d) = local_hostname.downcast::<PyDict>() {
            if metadata_server.is_some() {
                return Err(PyTypeError::new_err(
                    "setup(config_dict) takes no other arguments",
                ));
            }
            match SetupArgs::from_dict(d) {
                Ok(a) => a,
                Err(c) => return Ok(c),
            }
        } else {
            let local_hostname: String = local_hostname.extract()?;
            let Some(metadata_server) = metadata_server else {
                return Err(PyTypeError::new_err(
                    "setup() missing required argument 'metadata_server'",
                ));
            };
            SetupArgs {
                tenant_id,
                local_hostname,
                metadata_server,
                global_segment_size: global_segment_size.map_or(16 * MIB, |u| u.0),
                local_buffer_size: local_buffer_size
                    .map_or(ClientConfig::default().local_buffer_size, |u| u.0),
                protocol,
                device_name: rdma_devices,
                master_server_addr,
                http_port: match http_port(
                    enable_client_http_server.0,
                    client_http_port.map(|u| u.0),
                ) {
                    Ok(p) => p,
                    Err(c) => return Ok(c),
                },
                enable_ssd_offload: enable_ssd_offload.0,
                ssd_offload_path,
            }
        };
        let http = args.http_port;
        Ok(self.setup_config(py, args.config(), engine, http))
    }

    /// Joins as a "dummy" client of the `mooncake_client` at `server_address`.
    fn setup_dummy(
        &self,
        py: Python<'_>,
        mem_pool_size: Unsigned,
        local_buffer_size: Unsigned,
        server_address: String,
    ) -> i32 {
        self.start(
            py,
            false,
            move || Client::setup_dummy(mem_pool_size.0, local_buffer_size.0, &server_address),
            None,
        )
    }

    /// `setup` with the integration environment (`MOONCAKE_*`) for everything
    /// but the protocol, device and segment size.
    #[pyo3(signature = (protocol, device_name, mount_segment_size = 16 * MIB))]
    fn init_all(
        &self,
        py: Python<'_>,
        protocol: String,
        device_name: String,
        mount_segment_size: u64,
    ) -> i32 {
        let mut cfg = match ClientConfig::from_env() {
            Ok(c) => c,
            Err(e) => return code(&e),
        };
        cfg.protocol = protocol;
        cfg.device_name = device_name;
        cfg.global_segment_size = mount_segment_size;
        self.setup_config(py, cfg, None, None)
    }

    /// Leaves the cluster (this client's segment and its objects go away).
    /// Always 0; the object can be set up again.
    fn close(&self, py: Python<'_>) -> i32 {
        let old = self.live.take();
        if let Some(old) = old {
            // Dropping the client stops its engine, which may talk to the
            // metadata server: not with the GIL held.
            py.allow_threads(move || {
                if let Err(e) = old.client.close() {
                    tracing::warn!("close: {e}");
                }
                drop(old);
            });
        }
        0
    }

    /// `host:port` of this client; `""` when not set up.
    fn get_hostname(&self) -> String {
        self.live
            .get()
            .map(|l| l.client.get_hostname())
            .unwrap_or_default()
    }

    /// 0 healthy, 1 not set up (or closed), 2 master unreachable.
    fn health_check(&self, py: Python<'_>) -> i32 {
        self.live
            .with(py, 1, |live| codes::health(live.client.health_check()))
    }

    /// Registers `size` bytes at `buffer_ptr` for the zero-copy calls.
    fn register_buffer(&self, py: Python<'_>, buffer_ptr: Unsigned, size: Unsigned) -> i32 {
        let (addr, len) = (buffer_ptr.usize(), size.usize());
        self.live.with(py, NOT_READY, |live| {
            if len == 0 || !mem::accessible(addr, len, Access::Write) {
                return INVALID;
            }
            // Any refusal (overlap, ...) is INVALID_PARAMS in the reference.
            match live.client.register_buffer(addr, len) {
                Ok(()) => {
                    live.memory.register(addr, len);
                    0
                }
                Err(_) => INVALID,
            }
        })
    }

    fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: Unsigned) -> i32 {
        let addr = buffer_ptr.usize();
        self.live.with(py, NOT_READY, |live| {
            match live.client.unregister_buffer(addr) {
                Ok(()) => {
                    live.memory.unregister(addr);
                    0
                }
                Err(_) => INVALID,
            }
        })
    }

    /// Memory usable by the zero-copy calls without registering; 0 on failure.
    fn alloc_from_mem_pool(&self, py: Python<'_>, size: Unsigned) -> usize {
        let len = size.usize();
        self.live
            .with(py, 0, |live| match live.client.alloc_from_mem_pool(len) {
                Ok(addr) => {
                    live.memory.pooled(addr, len);
                    addr
                }
                Err(_) => 0,
            })
    }
}
