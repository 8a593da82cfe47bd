//! [`TransferEngine`]: its construction and shutdown, and the public types
//! of its API. The API itself is split by concern:
//! - `registration`: local and managed memory;
//! - `segments`: opening and locating segments;
//! - `batches`: batch lifecycle and `transfer_sync`;
//! - `submit`: validation and routing of requests to transports;
//! - `notify`: notifies to and from peers.

mod batches;
mod metrics;
mod notify;
mod registration;
mod segments;
mod submit;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Mutex, RwLock};

use crate::config::EngineConfig;
use crate::listener::RpcServer;
use crate::metadata::{self, rpc_meta_key, segment_key, MetadataStore, MetadataUri};
use crate::rawmem::SharedRegion;
use crate::rpc::{self, LocalState};
use crate::segment::RpcMeta;
use crate::transport::local::LocalTransport;
use crate::transport::shm::ShmTransport;
use crate::transport::tcp::{Limits, TcpTransport};
use batches::Batches;
use segments::{split_host_port, SegmentTable};

/// Identifies an opened segment.
pub type SegmentHandle = u64;
/// Identifies an allocated batch (never 0).
pub type BatchId = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// Copy from the target segment into local memory.
    Read,
    /// Copy from local memory into the target segment.
    Write,
}

/// One transfer, as the reference defines it.
#[derive(Clone, Copy, Debug)]
pub struct TransferRequest {
    pub opcode: Opcode,
    /// Local address; must lie inside registered memory.
    pub source: usize,
    pub target_id: SegmentHandle,
    /// Remote *virtual address* inside a registered buffer of the target.
    pub target_offset: u64,
    pub length: usize,
}

/// A small message delivered to a peer's `get_notifies`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notify {
    pub name: String,
    pub msg: String,
}

/// How many requests each transport has carried (for tests, benchmarks
/// and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    pub local: u64,
    pub shm: u64,
    pub tcp: u64,
    /// Bytes submitted to each transport.
    pub local_bytes: u64,
    pub shm_bytes: u64,
    pub tcp_bytes: u64,
}

/// The transfer engine. Cheap to clone; all calls block and are safe from
/// any thread. Dropping the last clone (or [`TransferEngine::shutdown`])
/// stops the listener and removes this engine's metadata keys.
#[derive(Clone)]
pub struct TransferEngine {
    inner: Arc<Inner>,
}

struct Inner {
    config: EngineConfig,
    name: String,
    hostname: String,
    rpc_port: u16,
    local: Arc<LocalState>,
    metadata: Option<Arc<dyn MetadataStore>>,
    /// The `rpc_meta` value this engine publishes.
    rpc_meta: RpcMeta,
    managed: Mutex<HashMap<usize, SharedRegion>>,
    segments: RwLock<SegmentTable>,
    batches: Mutex<Batches>,
    next_batch: AtomicU64,
    local_transport: LocalTransport,
    shm: ShmTransport,
    tcp: TcpTransport,
    server: Mutex<Option<RpcServer>>,
    closed: AtomicBool,
    /// Requests and bytes per transport, completion latencies.
    metrics: Arc<metrics::EngineMetrics>,
}

/// The address the RPC listener binds: `MC_TCP_BIND_ADDRESS` when set,
/// else the address `local_hostname` names when it is an IP address (peers
/// reach us there, nothing else needs to), else every interface: a host
/// name may resolve to another address locally (`127.0.1.1`) than for peers.
fn listen_host(bind_address: Option<&str>, hostname: &str) -> String {
    if let Some(a) = bind_address {
        return a.to_string();
    }
    let bare = hostname.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => "0.0.0.0".to_string(),
    }
}

fn invalid(msg: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorCode::ERR_INVALID_ARGUMENT, msg)
}

impl TransferEngine {
    /// Starts the RPC listener and publishes this engine's `rpc_meta` and
    /// segment descriptor.
    pub fn new(config: EngineConfig) -> Result<TransferEngine> {
        let config = config.sanitized();
        if let Some(e) = &config.token_error {
            return Err(invalid(e.clone()));
        }
        let protocol = match config.protocol.trim() {
            "" | "tcp" => "tcp".to_string(),
            "rdma" => {
                // As the reference on a host without an RDMA NIC: the
                // engine starts and moves bytes over TCP; said out loud.
                tracing::warn!(
                    "protocol rdma (device {:?}): this build has no RDMA transport, serving over tcp",
                    config.device_name
                );
                "tcp".to_string()
            }
            other => {
                return Err(invalid(format!(
                    "unsupported protocol {other:?} (expected tcp or rdma)"
                )))
            }
        };
        let uri = MetadataUri::parse(&config.metadata_server)?;
        let metadata = match uri {
            MetadataUri::P2p => None,
            ref kv => Some(metadata::connect_with_token(
                kv,
                config.cluster_token.as_ref(),
            )?),
        };

        let given = config.local_server_name.trim();
        let given = if given.is_empty() {
            "localhost".to_string()
        } else {
            given.to_string()
        };
        let (hostname, name_port) = split_host_port(&given);
        let p2p = metadata.is_none();
        let bind_host = listen_host(config.rpc_bind_address.as_deref(), &hostname);
        let port = listening_port(
            p2p,
            config.legacy_rpc_port_binding,
            config.rpc_port,
            name_port,
        );
        let listener = rpc::bind(&bind_host, port, (config.min_rpc_port, config.max_rpc_port))?;
        let rpc_port = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorCode::ERR_SOCKET, e.to_string()))?
            .port();
        let name = if p2p {
            join_host_port(&hostname, rpc_port)
        } else {
            given
        };
        let published_host = published_host(&hostname, config.rpc_bind_address.as_deref());
        let control_max = config.handshake_max_length as u64;
        let local = Arc::new(LocalState {
            name: name.clone(),
            protocol: protocol.clone(),
            rpc_port,
            host_id: rpc::published_host_id(config.force_tcp),
            devices: RwLock::new(Vec::new()),
            registry: RwLock::new(Default::default()),
            notifies: Mutex::default(),
            control_max,
            io_timeout: config.transfer_timeout,
            cluster_token: config.cluster_token.clone(),
            idle_timeout: config.rpc_limits.idle_timeout,
        });
        let server = RpcServer::start(listener, local.clone(), config.rpc_limits)?;
        let connect_timeout = config.transfer_timeout.min(Duration::from_secs(5));
        let inner = Inner {
            shm: ShmTransport::new(!config.force_tcp, crate::segment::local_host_id()),
            tcp: TcpTransport::new(
                config.tcp_connections,
                config.slice_size,
                Limits {
                    connect_timeout,
                    write_timeout: config.transfer_timeout,
                    control_max,
                    cluster_token: config.cluster_token.clone(),
                    reuse_within: config.rpc_limits.idle_timeout / 2,
                },
            ),
            local_transport: LocalTransport,
            config,
            name,
            hostname,
            rpc_port,
            local,
            metadata,
            rpc_meta: RpcMeta {
                ip_or_host_name: published_host,
                rpc_port,
            },
            managed: Mutex::new(HashMap::new()),
            segments: RwLock::new(SegmentTable::new()),
            batches: Mutex::default(),
            next_batch: AtomicU64::new(1),
            server: Mutex::new(Some(server)),
            closed: AtomicBool::new(false),
            metrics: Arc::default(),
        };
        if let Some(every) = metrics::config_from_env(|k| std::env::var(k).ok()) {
            metrics::start_reporting(&inner.metrics, every);
        }
        if let Some(store) = &inner.metadata {
            if let Err(e) = store.put(&rpc_meta_key(&inner.name), &inner.rpc_meta.to_json()) {
                // The name may belong to a running engine (the HTTP metadata
                // server refuses a second rpc_meta value): leave its keys.
                inner.closed.store(true, Ordering::Release);
                if let Some(mut server) = inner.server.lock().take() {
                    server.stop();
                }
                return Err(e.with_context(format!("publishing {:?}", inner.name)));
            }
            inner.publish()?;
        }
        tracing::info!(
            "transfer engine {} listening on port {rpc_port}",
            inner.name
        );
        Ok(TransferEngine {
            inner: Arc::new(inner),
        })
    }

    /// The segment name peers open to reach this engine.
    pub fn local_server_name(&self) -> String {
        self.inner.name.clone()
    }

    pub fn rpc_port(&self) -> u16 {
        self.inner.rpc_port
    }

    /// Host part of the local server name.
    pub fn hostname(&self) -> String {
        self.inner.hostname.clone()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Requests carried by each transport so far.
    pub fn transport_stats(&self) -> TransportStats {
        let m = &self.inner.metrics;
        let n = |i: usize| m.requests[i].load(Ordering::Relaxed);
        let b = |i: usize| m.bytes[i].load(Ordering::Relaxed);
        TransportStats {
            local: n(0),
            shm: n(1),
            tcp: n(2),
            local_bytes: b(0),
            shm_bytes: b(1),
            tcp_bytes: b(2),
        }
    }

    /// Publishes this engine's keys again if the metadata store has lost
    /// them (a restarted metadata server, or a master embedding one that
    /// restarted or failed over), so that new peers can open this segment.
    /// Returns whether it published. Keys held by anyone else are left.
    pub fn republish_if_lost(&self) -> Result<bool> {
        self.inner.republish_if_lost()
    }

    /// Stops the listener and connections and removes the metadata keys.
    /// Later transfers fail; managed buffers stay mapped until the last clone drops.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// Sets the `devices` list of this engine's segment descriptor and
    /// publishes it: the hook by which an engine layered on this one (TENT)
    /// advertises its other endpoints to peers. Peers see it in
    /// [`Self::segment_descriptor`] once they open or refresh the segment.
    pub fn set_devices(&self, devices: Vec<serde_json::Value>) -> Result<()> {
        *self.inner.local.devices.write() = devices;
        self.inner.publish()
    }

    /// Withdraws this engine's segment descriptor from the metadata service
    /// (the reference's `removeLocalSegment`): peers that have not opened
    /// the segment can no longer, until registering memory publishes it
    /// again. In P2P mode there is no service to withdraw it from: peers
    /// ask this engine itself, so there is nothing to do.
    pub fn remove_local_segment(&self) -> Result<()> {
        match &self.inner.metadata {
            Some(store) => store.delete(&segment_key(&self.inner.name)),
            None => Ok(()),
        }
    }
}

/// The port the listener binds; `None` picks a free one. In P2P mode and
/// with a metadata server (the reference's "new RPC mapping") the port in
/// `local_server_name` only names the segment, so two engines named after
/// ports other processes hold still start; `MC_LEGACY_RPC_PORT_BINDING`
/// binds the named port instead (metadata mode only, as in the reference).
fn listening_port(
    p2p: bool,
    legacy: bool,
    explicit: Option<u16>,
    name_port: Option<u16>,
) -> Option<u16> {
    match explicit {
        Some(p) => Some(p),
        None if legacy && !p2p => name_port,
        None => None,
    }
}

/// Where peers connect: a specific bind address (`MC_TCP_BIND_ADDRESS`),
/// else the host of `local_server_name`.
fn published_host(hostname: &str, bind_address: Option<&str>) -> String {
    match bind_address.map(str::parse::<std::net::IpAddr>) {
        Some(Ok(ip)) if !ip.is_unspecified() => ip.to_string(),
        Some(Err(_)) => bind_address.unwrap_or(hostname).to_string(),
        _ => hostname.to_string(),
    }
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl Inner {
    fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(mut server) = self.server.lock().take() {
            server.stop();
        }
        self.tcp.shutdown();
        if let Some(store) = &self.metadata {
            for key in [segment_key(&self.name), rpc_meta_key(&self.name)] {
                if let Err(e) = store.delete(&key) {
                    tracing::warn!("removing {key}: {e}");
                }
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listens_where_configured() {
        assert_eq!(listen_host(Some("10.0.0.5"), "127.0.0.1"), "10.0.0.5");
        assert_eq!(listen_host(None, "127.0.0.1"), "127.0.0.1");
        assert_eq!(listen_host(None, "[::1]"), "::1");
        assert_eq!(listen_host(None, "node7"), "0.0.0.0");
        assert_eq!(listen_host(None, "0.0.0.0"), "0.0.0.0");
    }

    #[test]
    fn the_named_port_is_bound_only_in_legacy_metadata_mode() {
        // (p2p, legacy, explicit, name port) -> port bound
        assert_eq!(listening_port(false, false, None, Some(12345)), None);
        assert_eq!(listening_port(false, true, None, Some(12345)), Some(12345));
        assert_eq!(listening_port(false, true, None, None), None);
        assert_eq!(listening_port(true, true, None, Some(12345)), None);
        assert_eq!(listening_port(true, false, None, Some(12345)), None);
        assert_eq!(listening_port(false, false, Some(7), Some(12345)), Some(7));
        assert_eq!(listening_port(true, false, Some(7), None), Some(7));
    }

    #[test]
    fn a_specific_bind_address_is_published() {
        assert_eq!(published_host("node1", None), "node1");
        assert_eq!(published_host("node1", Some("0.0.0.0")), "node1");
        assert_eq!(published_host("node1", Some("::")), "node1");
        assert_eq!(published_host("node1", Some("10.1.2.3")), "10.1.2.3");
        assert_eq!(published_host("node1", Some("node1.lan")), "node1.lan");
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
        assert_eq!(join_host_port("h", 80), "h:80");
    }

    #[test]
    fn engine_is_send_and_sync() {
        fn check<T: Send + Sync + Clone>() {}
        check::<TransferEngine>();
    }
}
