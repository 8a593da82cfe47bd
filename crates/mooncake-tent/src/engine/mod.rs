//! [`TentEngine`]: one classic [`TransferEngine`] per local address (that
//! path's listener and connections, its memory registrations mirrored), and
//! the peers it has opened, each with its paths, scheduler and health.
//!
//! - `peer`: opening a peer, its advertised endpoints, probes;
//! - `spray`: `transfer_sync`: selection, slicing, the dispatch loop,
//!   failover and stall handling;
//! - `worker`: the threads that run one slice on one path.

mod peer;
mod spray;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{EngineConfig, SegmentHandle, TransferEngine};
use parking_lot::{Mutex, RwLock};

use crate::config::TentConfig;
use crate::http::MetricsServer;
use crate::metrics::Metrics;
use peer::Peer;

pub use peer::PathInfo;

/// The TENT engine. Cheap to clone; calls block and are safe from any thread.
#[derive(Clone)]
pub struct TentEngine {
    inner: Arc<Inner>,
}

struct Inner {
    config: TentConfig,
    /// One classic engine per local address; the first names this engine.
    locals: Vec<TransferEngine>,
    own_host: Option<String>,
    peers: RwLock<Vec<Arc<Peer>>>,
    by_name: Mutex<HashMap<String, SegmentHandle>>,
    /// Memory registered through this engine (on every path).
    registered: RwLock<Vec<(usize, usize)>>,
    /// A small registered buffer the probes read into.
    probe_buf: ProbeBuf,
    metrics: Arc<Metrics>,
    /// Serves the metrics (None: disabled, or the port was taken).
    metrics_server: Mutex<Option<MetricsServer>>,
    closed: AtomicBool,
}

/// Bytes nobody reads: probes land here.
struct ProbeBuf {
    mem: Box<[u8]>,
}

impl ProbeBuf {
    const LEN: usize = 4096;
    const SLOT: usize = 64;

    fn addr(&self, slot: usize) -> usize {
        self.mem.as_ptr() as usize + (slot * Self::SLOT) % Self::LEN
    }
}

impl TentEngine {
    /// Starts one classic engine per configured address and publishes each
    /// one's endpoints in all their descriptors (`devices`).
    pub fn new(config: TentConfig) -> Result<TentEngine> {
        let addresses: Vec<Option<String>> = if config.addresses.is_empty() {
            vec![None]
        } else {
            config.addresses.iter().cloned().map(Some).collect()
        };
        let p2p = config.metadata_server.trim() == "P2PHANDSHAKE";
        let mut locals = Vec::with_capacity(addresses.len());
        for (i, addr) in addresses.iter().enumerate() {
            let name = match (addr, p2p, i) {
                // P2P names are `host:port`; each path is its own host.
                (Some(a), true, _) => a.clone(),
                (_, _, 0) => config.local_segment_name.clone(),
                (_, _, i) => format!("{}@tent{i}", config.local_segment_name),
            };
            let mut c = EngineConfig::new(&config.metadata_server, &name);
            c.rpc_bind_address.clone_from(addr);
            if addr.is_some() {
                c.rpc_port = None;
            }
            c.transfer_timeout = config.stall_timeout;
            c.slice_size = c.slice_size.max(64 << 10);
            if let Some(n) = config.connections_per_path {
                c.tcp_connections = n.clamp(1, 64);
            }
            if !config
                .transports
                .contains(&crate::selector::TransportKind::Shm)
            {
                c.force_tcp = true;
            }
            locals.push(
                TransferEngine::new(c)
                    .map_err(|e| e.with_context(format!("TENT path {i} ({addr:?})")))?,
            );
        }
        let devices: Vec<serde_json::Value> = locals
            .iter()
            .enumerate()
            .map(|(i, e)| {
                serde_json::json!({
                    "name": format!("tcp{i}"),
                    "transport": "tcp",
                    "segment": e.local_server_name(),
                })
            })
            .collect();
        for e in &locals {
            e.set_devices(devices.clone())?;
        }
        let own = locals[0].open_segment(&locals[0].local_server_name())?;
        let own_host = locals[0].segment_descriptor(own)?.host_id.clone();
        let probe_buf = ProbeBuf {
            mem: vec![0u8; ProbeBuf::LEN].into_boxed_slice(),
        };
        for e in &locals {
            e.register_local_memory(probe_buf.addr(0), ProbeBuf::LEN, "cpu:0", false)?;
        }
        let metrics = Arc::new(Metrics::default());
        metrics.set_enabled(config.metrics.enabled);
        let metrics_server = if config.metrics.enabled {
            MetricsServer::start(&config.metrics, metrics.clone())
                .map_err(|e| tracing::warn!("{e}; TENT metrics are recorded but not served"))
                .ok()
        } else {
            None
        };
        Ok(TentEngine {
            inner: Arc::new(Inner {
                config,
                locals,
                own_host,
                peers: RwLock::new(Vec::new()),
                by_name: Mutex::new(HashMap::new()),
                registered: RwLock::new(Vec::new()),
                probe_buf,
                metrics,
                metrics_server: Mutex::new(metrics_server),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// The name peers open to reach this engine (its first path's).
    pub fn local_server_name(&self) -> String {
        self.inner.locals[0].local_server_name()
    }

    /// The first path's port.
    pub fn rpc_port(&self) -> u16 {
        self.inner.locals[0].rpc_port()
    }

    /// The classic engine of the first path: notifies, managed buffers.
    pub fn primary(&self) -> &TransferEngine {
        &self.inner.locals[0]
    }

    /// Every path's classic engine (tests close one to inject a fault).
    pub fn paths(&self) -> &[TransferEngine] {
        &self.inner.locals
    }

    pub fn config(&self) -> &TentConfig {
        &self.inner.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The port `/metrics` is served on, if it is.
    pub fn metrics_port(&self) -> Option<u16> {
        self.inner
            .metrics_server
            .lock()
            .as_ref()
            .map(MetricsServer::port)
    }

    /// Registers `[addr, addr+len)` on every path. The caller promises it
    /// stays valid until unregistered (as with the classic engine).
    pub fn register_local_memory(
        &self,
        addr: usize,
        len: usize,
        location: &str,
        remote_accessible: bool,
    ) -> Result<()> {
        for (i, e) in self.inner.locals.iter().enumerate() {
            if let Err(err) = e.register_local_memory(addr, len, location, remote_accessible) {
                for undo in &self.inner.locals[..i] {
                    let _ = undo.unregister_local_memory(addr);
                }
                return Err(err);
            }
        }
        self.inner.registered.write().push((addr, len));
        Ok(())
    }

    pub fn unregister_local_memory(&self, addr: usize) -> Result<()> {
        let mut first = None;
        for e in &self.inner.locals {
            if let Err(err) = e.unregister_local_memory(addr) {
                first.get_or_insert(err);
            }
        }
        self.inner.registered.write().retain(|&(a, _)| a != addr);
        first.map_or(Ok(()), Err)
    }

    /// Allocates a managed (shared-memory) buffer on the first path, which
    /// same-host peers map, and registers it on the other paths too.
    pub fn allocate_managed_buffer(&self, len: usize) -> Result<usize> {
        let addr = self.inner.locals[0].allocate_managed_buffer(len)?;
        for (i, e) in self.inner.locals.iter().enumerate().skip(1) {
            if let Err(err) = e.register_local_memory(addr, len, "cpu:0", true) {
                for undo in &self.inner.locals[1..i] {
                    let _ = undo.unregister_local_memory(addr);
                }
                let _ = self.inner.locals[0].free_managed_buffer(addr, len);
                return Err(err);
            }
        }
        self.inner.registered.write().push((addr, len));
        Ok(addr)
    }

    pub fn free_managed_buffer(&self, addr: usize, len: usize) -> Result<()> {
        self.inner.registered.write().retain(|&(a, _)| a != addr);
        for e in &self.inner.locals[1..] {
            let _ = e.unregister_local_memory(addr);
        }
        self.inner.locals[0].free_managed_buffer(addr, len)
    }

    /// Opens a peer by name: its first path's segment, then the endpoints
    /// its descriptor advertises. Endpoints that cannot be reached now
    /// start out of rotation and are probed.
    pub fn open_segment(&self, name: &str) -> Result<SegmentHandle> {
        let name = name.trim();
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::new(ErrorCode::INTERNAL_ERROR, "engine is shut down"));
        }
        if let Some(&h) = self.inner.by_name.lock().get(name) {
            return Ok(h);
        }
        let peer = Peer::open(&self.inner, name)?;
        let mut by_name = self.inner.by_name.lock();
        if let Some(&h) = by_name.get(name) {
            return Ok(h);
        }
        let mut peers = self.inner.peers.write();
        peers.push(Arc::new(peer));
        let h = peers.len() as SegmentHandle;
        by_name.insert(name.to_string(), h);
        Ok(h)
    }

    /// The paths to an opened peer: endpoint, state, telemetry.
    pub fn path_info(&self, handle: SegmentHandle) -> Result<Vec<PathInfo>> {
        Ok(self.inner.peer(handle)?.info())
    }

    /// Stops every path's engine; later transfers fail.
    pub fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::Release);
        drop(self.inner.metrics_server.lock().take());
        for e in &self.inner.locals {
            e.shutdown();
        }
    }
}

impl Inner {
    fn peer(&self, handle: SegmentHandle) -> Result<Arc<Peer>> {
        usize::try_from(handle)
            .ok()
            .and_then(|h| h.checked_sub(1))
            .and_then(|i| self.peers.read().get(i).cloned())
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::ERR_INVALID_ARGUMENT,
                    format!("no segment handle {handle}"),
                )
            })
    }

    fn is_registered(&self, addr: usize, len: usize) -> bool {
        self.registered
            .read()
            .iter()
            .any(|&(a, l)| addr >= a && addr.checked_add(len).is_some_and(|end| end <= a + l))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for e in &self.locals {
            let _ = e.unregister_local_memory(self.probe_buf.addr(0));
            e.shutdown();
        }
    }
}
