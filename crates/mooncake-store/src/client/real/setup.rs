//! Starting a real client: the engine, the staging pool, the segments it
//! mounts, the heartbeat; and unmounting at the end.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{EngineConfig, TransferEngine};
use parking_lot::{Mutex, RwLock};

use super::super::config::{self, split_host_port, ClientConfig};
use super::super::file_tier::FileWriter;
use super::super::offload::service::TierPeers;
use super::super::offload::{Offload, OffloadSetup};
use super::super::prefault::Prefault;
use super::super::registry::{BufferRegistry, PoolAllocations};
use super::super::replica::Site;
use super::super::slow_peers::SlowPeers;
use super::super::staging::StagingPool;
use super::dynamic::{DynamicSegments, MAX_SEGMENT_CHUNK};
use super::{worker, MountedSegment, RealClient};
use crate::master_client::MasterClient;
use crate::types::{ClientId, SegmentInfo};

/// Port range the reference names a client after when `local_hostname` has
/// no port (`MC_STORE_CLIENT_MIN_PORT`, `MC_STORE_CLIENT_MAX_PORT`).
const AUTO_PORT_RANGE: (u16, u16) = (12300, 14300);
/// Ports tried for that name (`MC_STORE_CLIENT_SETUP_RETRIES`).
const AUTO_PORT_TRIES: u32 = 20;
/// How long a staging allocation waits for room when the pool is full.
const STAGING_WAIT: Duration = Duration::from_secs(30);

impl RealClient {
    /// Connects to the master, starts the engine (or uses `shared`, an
    /// engine the caller also uses: its name, metadata and port), allocates
    /// the staging pool and mounts the segments; the environment overrides
    /// `config` (see [`ClientConfig::apply_env`]).
    pub(crate) fn setup(
        config: &ClientConfig,
        shared: Option<TransferEngine>,
    ) -> Result<RealClient> {
        let config = config::resolve(config)?;
        config.validate()?;
        let master = MasterClient::connect_as(
            &config.master_server_address,
            &config.cluster_id,
            config.cluster_token.clone(),
            &config.tenant_id,
        )?;
        let (engine, name_claim) = match shared {
            Some(engine) => {
                if engine.local_server_name() != config.local_hostname.trim() {
                    tracing::info!(
                        "store uses the shared engine's name {} (local_hostname {:?})",
                        engine.local_server_name(),
                        config.local_hostname
                    );
                }
                (engine, None)
            }
            None => {
                check_rdma_devices(&config)?;
                start_engine(&config)?
            }
        };
        let id: ClientId = rand::random();
        let staging = staging_pool(&engine, config.local_buffer_size, config.huge_pages.size())?;

        let mut client = RealClient {
            id,
            master,
            site: Site {
                endpoint: engine.local_server_name(),
                host: engine.hostname(),
                segments: Vec::new(),
                memcpy: config.local_memcpy,
            },
            engine,
            _name_claim: name_claim,
            segments: Vec::new(),
            staging,
            registry: BufferRegistry::new(),
            pool_allocs: PoolAllocations::default(),
            handles: RwLock::new(HashMap::new()),
            closed: AtomicBool::new(false),
            heartbeat: Mutex::new(None),
            executor: Mutex::new(None),
            metrics: None,
            offload: Mutex::new(None),
            file_writer: Mutex::new(None),
            tier_peers: TierPeers::default(),
            prefault: Mutex::new(None),
            sessions: Default::default(),
            dynamic: DynamicSegments::new(Vec::new()),
            slow: config::hedge_config().map(|c| Mutex::new(SlowPeers::new(c))),
        };
        client.metrics = config::client_metrics("real");
        if let Some(m) = &client.metrics {
            client.master.observe_rpcs(m.clone());
            let engine = client.engine.clone();
            m.set_engine_source(move || {
                let s = engine.transport_stats();
                [
                    [s.local, s.shm, s.tcp],
                    [s.local_bytes, s.shm_bytes, s.tcp_bytes],
                ]
            });
        }
        // Introduce ourselves (a pure client mounts nothing), then mount.
        match client.master.ping(id) {
            Ok(()) => {}
            Err(e) if e.code == ErrorCode::CLIENT_NOT_FOUND => {}
            Err(e) => return Err(e),
        }
        client.mount_segments(config.global_segment_size, config.huge_pages.size())?;
        client.site.segments = client
            .segments
            .iter()
            .map(|s| (s.addr as u64, s.len as u64))
            .collect();
        // Reads of shared-filesystem copies land in the staging pool and
        // are copied out from there like a replica of our own.
        if let Some(p) = &client.staging {
            client.site.segments.push((p.base() as u64, p.capacity()));
        }
        // The staging pool first: every byte put and get goes through it.
        let staging = client
            .staging
            .as_ref()
            .map(|p| (p.base(), p.capacity() as usize));
        let segments = client.segments.iter().map(|s| (s.addr, s.len));
        let fresh: Vec<(usize, usize)> = staging.into_iter().chain(segments).collect();
        // SAFETY: segments and staging pool stay mapped until the client is
        // dropped, and `close` (first thing in drop) stops the prefault.
        *client.prefault.lock() = unsafe { Prefault::start(fresh) };
        let infos = client.segments.iter().map(|s| s.info.clone()).collect();
        client.dynamic = DynamicSegments::new(infos);
        *client.heartbeat.lock() = Some(worker::heartbeat(
            client.master.clone(),
            client.engine.clone(),
            id,
            client.dynamic.mounted.clone(),
        ));
        if config.enable_offload {
            if let Err(e) = client.start_offload(&config) {
                client.unmount_all();
                return Err(e.with_context("starting the SSD tier"));
            }
        }
        client.start_file_writer();
        Ok(client)
    }

    /// Mounts the shared-filesystem tier when the master has one and this
    /// client holds a segment. Without the tier's directory here, the
    /// client keeps out of it (its objects leave memory as without a tier).
    fn start_file_writer(&self) {
        if self.segments.is_empty() {
            return;
        }
        let fsdir = match self.master.get_storage_config() {
            Ok(c) if !c.fsdir.is_empty() => c.fsdir,
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, "no storage config from the master");
                return;
            }
        };
        let segments = self.segments.iter().map(|s| (s.addr, s.len)).collect();
        match FileWriter::start(self.id, self.master.clone(), fsdir, segments) {
            Ok(w) => *self.file_writer.lock() = Some(w),
            Err(e) => tracing::warn!(
                error = %e,
                "shared-filesystem tier not mounted: this client's objects are not written there"
            ),
        }
    }

    /// Starts the SSD tier (`MOONCAKE_OFFLOAD_*`, the path from `config`
    /// first); its staging buffer counts as this client's own memory, so
    /// reads of its own disk-only objects are plain copies.
    fn start_offload(&mut self, config: &ClientConfig) -> Result<()> {
        if self.segments.is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "an SSD tier needs a segment (global_segment_size > 0)",
            ));
        }
        let tier_config = config::tier_config(config.offload_path.as_deref())?;
        let setup = OffloadSetup {
            id: self.id,
            master: self.master.clone(),
            engine: &self.engine,
            engine_endpoint: self.site.endpoint.clone(),
            host: self.site.host.clone(),
            segments: self.segments.iter().map(|s| (s.addr, s.len)).collect(),
        };
        let offload = Offload::start(tier_config, setup)?;
        let (base, len) = offload.shared().staging_range();
        self.site.segments.push((base as u64, len as u64));
        *self.offload.lock() = Some(offload);
        Ok(())
    }

    fn mount_segments(&mut self, total: u64, huge_page: Option<usize>) -> Result<()> {
        let endpoint = self.site.endpoint.clone();
        let mut left = total;
        let mut index = 0;
        while left > 0 {
            let len = left.min(MAX_SEGMENT_CHUNK);
            let len_usize = usize::try_from(len).map_err(|_| {
                Error::new(ErrorCode::INVALID_PARAMS, "global_segment_size too large")
            })?;
            let addr = match self.engine.allocate_managed_buffer_on(len_usize, huge_page) {
                Ok(addr) => addr,
                Err(e) => {
                    // As on a failed mount: the segments mounted so far go.
                    self.unmount_all();
                    return Err(e);
                }
            };
            let name = if index == 0 {
                endpoint.clone()
            } else {
                format!("{endpoint}#{index}")
            };
            let info = SegmentInfo {
                name,
                base: addr as u64,
                size: len,
                transport_endpoint: endpoint.clone(),
            };
            if let Err(e) = self.master.mount_segment(self.id, &info) {
                let _ = self.engine.free_managed_buffer(addr, len_usize);
                self.unmount_all();
                return Err(e.with_context(format!("mounting segment {}", info.name)));
            }
            self.segments.push(MountedSegment {
                info,
                addr,
                len: len_usize,
            });
            left -= len;
            index += 1;
        }
        Ok(())
    }

    pub(super) fn unmount_all(&self) {
        for seg in &self.segments {
            if let Err(e) = self.master.unmount_segment(self.id, &seg.info.name) {
                tracing::warn!(segment = %seg.info.name, error = %e, "unmount failed");
            }
        }
    }
}

/// The registered staging pool of `len` bytes (`None` for 0), on huge
/// pages of `huge_page` bytes when given (the mapping rounded up to whole
/// huge pages; the pool uses all of it).
fn staging_pool(
    engine: &TransferEngine,
    len: u64,
    huge_page: Option<usize>,
) -> Result<Option<StagingPool>> {
    if len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(len)
        .map_err(|_| Error::new(ErrorCode::INVALID_PARAMS, "local_buffer_size too large"))?;
    let mut opts = memmap2::MmapOptions::new();
    let len = match huge_page {
        Some(h) => {
            opts.huge(Some(h.trailing_zeros() as u8));
            len.div_ceil(h) * h
        }
        None => len,
    };
    let map = opts.len(len).map_anon().map_err(|e| {
        let pages = match huge_page {
            Some(h) => format!(
                " on {} MiB huge pages (is the HugeTLB pool large enough?)",
                h >> 20
            ),
            None => String::new(),
        };
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("local buffer of {len} bytes{pages}: {e}"),
        )
    })?;
    engine.register_local_memory(map.as_ptr() as usize, len, "cpu:0", false)?;
    Ok(Some(StagingPool::new(Box::new(map), STAGING_WAIT)))
}

/// `protocol="rdma"` naming devices: none can be found, as the reference
/// finds none on a host without an RDMA NIC (without devices the engine
/// runs over TCP, as the reference's does).
fn check_rdma_devices(config: &ClientConfig) -> Result<()> {
    let devices = config.device_name.trim();
    if config.protocol.trim() == "rdma" && !devices.is_empty() && devices != "auto-discovery" {
        return Err(Error::new(
            ErrorCode::ERR_DEVICE_NOT_FOUND,
            format!("RDMA devices {devices:?}: this build has no RDMA transport"),
        ));
    }
    Ok(())
}

/// Starts this client's engine, named `local_hostname`. A name without a
/// port gets one in 12300..14300 that this client holds (a bound socket, no
/// listener) for its lifetime, so no other client on the host takes the same
/// name; the engine itself listens on a port it picks (see
/// [`EngineConfig::rpc_port`]), or, with `MC_LEGACY_RPC_PORT_BINDING`, on the
/// named one.
fn start_engine(config: &ClientConfig) -> Result<(TransferEngine, Option<socket2::Socket>)> {
    let (host, port) = split_host_port(&config.local_hostname)?;
    let make = |port: u16| {
        let mut ec = EngineConfig::new(&config.metadata_server, &join_host_port(&host, port));
        ec.protocol = config.protocol.clone();
        ec.device_name = config.device_name.clone();
        ec.cluster_token = config.cluster_token.clone();
        ec
    };
    if let Some(port) = port {
        return Ok((TransferEngine::new(make(port))?, None));
    }
    let (lo, hi, tries) = config::auto_ports(AUTO_PORT_RANGE, AUTO_PORT_TRIES);
    let mut last = Error::new(ErrorCode::ERR_SOCKET, format!("no free port in {lo}..{hi}"));
    for _ in 0..tries {
        let port = lo + rand::random::<u16>() % (hi - lo);
        let Ok(claim) = claim_port(port) else {
            continue;
        };
        let ec = make(port);
        // Legacy binding listens on the named port itself.
        let claim = (!ec.legacy_rpc_port_binding).then_some(claim);
        match TransferEngine::new(ec) {
            Ok(e) => return Ok((e, claim)),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Binds `port` on all interfaces without listening: connections to it are
/// refused, and no other process can bind it while the socket lives.
fn claim_port(port: u16) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
    socket.bind(&addr.into())?;
    Ok(socket)
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}
