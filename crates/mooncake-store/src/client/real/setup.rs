//! Starting a real client: the engine, the staging pool, the segments it
//! mounts, the heartbeat; and unmounting at the end.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{EngineConfig, TransferEngine};
use parking_lot::{Mutex, RwLock};

use super::super::config::{process_env, split_host_port, ClientConfig};
use super::super::registry::{BufferRegistry, PoolAllocations};
use super::super::replica::Site;
use super::super::staging::StagingPool;
use super::{worker, MountedSegment, RealClient};
use crate::master_client::MasterClient;
use crate::types::{ClientId, SegmentInfo};

/// Largest single buffer one mounted segment uses; bigger contributions are
/// mounted as several segments so each stays one shared-memory mapping of
/// bounded size.
const MAX_SEGMENT_CHUNK: u64 = 16 << 30;
/// Port range the reference picks from when `local_hostname` has no port.
const AUTO_PORT_RANGE: std::ops::Range<u16> = 12300..14300;
/// How long a staging allocation waits for room when the pool is full.
const STAGING_WAIT: Duration = Duration::from_secs(30);

impl RealClient {
    /// Connects to the master, starts the engine, allocates the staging pool
    /// and mounts the segments; the environment overrides `config` (see
    /// [`ClientConfig::apply_env`]).
    pub(crate) fn setup(config: &ClientConfig) -> Result<RealClient> {
        let mut config = config.clone();
        config.apply_env(process_env);
        config.validate()?;
        let master =
            MasterClient::connect_in_cluster(&config.master_server_address, &config.cluster_id)?;
        let engine = start_engine(&config)?;
        let id: ClientId = rand::random();
        let staging = staging_pool(&engine, config.local_buffer_size)?;

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
            segments: Vec::new(),
            staging,
            registry: BufferRegistry::new(),
            pool_allocs: PoolAllocations::default(),
            handles: RwLock::new(HashMap::new()),
            closed: AtomicBool::new(false),
            heartbeat: Mutex::new(None),
            executor: Mutex::new(None),
        };
        // Introduce ourselves (a pure client mounts nothing), then mount.
        match client.master.ping(id) {
            Ok(()) => {}
            Err(e) if e.code == ErrorCode::CLIENT_NOT_FOUND => {}
            Err(e) => return Err(e),
        }
        client.mount_segments(config.global_segment_size)?;
        client.site.segments = client
            .segments
            .iter()
            .map(|s| (s.addr as u64, s.len as u64))
            .collect();
        let infos = client.segments.iter().map(|s| s.info.clone()).collect();
        *client.heartbeat.lock() = Some(worker::heartbeat(client.master.clone(), id, infos));
        Ok(client)
    }

    fn mount_segments(&mut self, total: u64) -> Result<()> {
        let endpoint = self.site.endpoint.clone();
        let mut left = total;
        let mut index = 0;
        while left > 0 {
            let len = left.min(MAX_SEGMENT_CHUNK);
            let len_usize = usize::try_from(len).map_err(|_| {
                Error::new(ErrorCode::INVALID_PARAMS, "global_segment_size too large")
            })?;
            let addr = self.engine.allocate_managed_buffer(len_usize)?;
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

/// The registered staging pool of `len` bytes (`None` for 0).
fn staging_pool(engine: &TransferEngine, len: u64) -> Result<Option<StagingPool>> {
    if len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(len)
        .map_err(|_| Error::new(ErrorCode::INVALID_PARAMS, "local_buffer_size too large"))?;
    let map = memmap2::MmapMut::map_anon(len).map_err(|e| {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("local buffer of {len} bytes: {e}"),
        )
    })?;
    engine.register_local_memory(map.as_ptr() as usize, len, "cpu:0", false)?;
    Ok(Some(StagingPool::new(Box::new(map), STAGING_WAIT)))
}

fn start_engine(config: &ClientConfig) -> Result<TransferEngine> {
    let (host, port) = split_host_port(&config.local_hostname)?;
    let make = |port: u16| {
        let name = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let mut ec = EngineConfig::new(&config.metadata_server, &name);
        ec.protocol = config.protocol.clone();
        ec.device_name = config.device_name.clone();
        ec.rpc_port = Some(port);
        TransferEngine::new(ec)
    };
    if let Some(port) = port {
        return make(port);
    }
    // The reference picks a port in 12300..14300; retry a few on collisions.
    let mut last = Error::new(ErrorCode::ERR_SOCKET, "no free port in 12300..14300");
    for _ in 0..16 {
        let port = rand::random::<u16>() % (AUTO_PORT_RANGE.end - AUTO_PORT_RANGE.start)
            + AUTO_PORT_RANGE.start;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_err() {
            continue;
        }
        match make(port) {
            Ok(e) => return Ok(e),
            Err(e) => last = e,
        }
    }
    Err(last)
}
