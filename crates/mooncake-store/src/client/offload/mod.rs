//! A storage client's SSD tier, wired to the master: `mooncake_client
//! --enable_offload` and Python's `setup(enable_ssd_offload=True)` start
//! it next to the memory segment.
//!
//! - at start the tier directory is scanned (torn or corrupt objects are
//!   dropped and reported), mounted on the master under the directory's
//!   identity (copies a previous process registered pass to this one at
//!   once) and every object found is registered again;
//! - `worker`: the offload loop. It takes the master's tasks, copies each
//!   object from this client's own segment into the tier, commits (one
//!   group commit per round: nothing waits for a bucket to fill) and only
//!   then reports the copies; the master keeps the memory copy until it
//!   hears. It also deletes copies of removed objects and runs the tier's
//!   two-phase eviction (the master forgets a copy before its file goes);
//!   `stats` logs where its time goes;
//! - `service`: readers of disk-only objects ask this client to stage them
//!   into its engine-managed buffer and pull the bytes with the engine.

pub(crate) mod poll;
pub mod service;
mod stats;
mod worker;

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::TransferEngine;
use parking_lot::Mutex;

use super::staging::{Region, StagingBuf, StagingPool};
use crate::master_client::MasterClient;
use crate::rpc::{Server, ServerOptions, WhenFull};
use crate::tier::{DiskTier, TierConfig, Verify};
use crate::types::ClientId;
use service::{StagedBatch, StagedObject, TierHandler, TierServe};

/// How long staging a read waits for room in the staging buffer.
const STAGING_WAIT: Duration = Duration::from_secs(10);

/// The engine-managed buffer staged reads go to.
struct ManagedRegion {
    addr: usize,
    len: usize,
}

impl Region for ManagedRegion {
    fn addr(&self) -> usize {
        self.addr
    }
    fn size(&self) -> usize {
        self.len
    }
}

/// What the tier shares with its worker and its service.
pub(crate) struct TierShared {
    id: ClientId,
    master: MasterClient,
    pub(crate) tier: DiskTier,
    tier_id: String,
    /// This client's engine endpoint (where readers pull staged bytes).
    engine_endpoint: String,
    /// This tier service's address, as the master hands it to readers.
    pub(crate) service_addr: String,
    /// This client's own segments `(addr, len)`: offload reads only there.
    segments: Vec<(usize, usize)>,
    staging: StagingPool,
    batches: Mutex<HashMap<u64, (Instant, Vec<StagingBuf>)>>,
    next_batch: AtomicU64,
    gc_ttl: Duration,
    started: Instant,
    stop: AtomicBool,
}

impl TierShared {
    /// The tier's clock (LRU order): ms since this process started it.
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Whether `[addr, addr+len)` lies in one of this client's segments.
    fn own_range(&self, addr: u64, len: u64) -> Option<&'static [u8]> {
        let (addr, len) = (usize::try_from(addr).ok()?, usize::try_from(len).ok()?);
        let end = addr.checked_add(len)?;
        self.segments
            .iter()
            .any(|&(a, l)| addr >= a && end <= a + l)
            // SAFETY: the range lies in a segment this client allocated and
            // keeps mapped for its lifetime; the master leased the object
            // for the copy, so nothing rewrites it meanwhile.
            .then(|| unsafe { std::slice::from_raw_parts(addr as *const u8, len) })
    }

    /// `own_range` for writing: a promotion fills replicas the master just
    /// placed in this client's segments (nobody reads them before PutEnd).
    #[allow(clippy::mut_from_ref)]
    fn own_range_mut(&self, addr: u64, len: u64) -> Option<&'static mut [u8]> {
        let bytes = self.own_range(addr, len)?;
        // SAFETY: as `own_range`; the range is a put in flight by this
        // client, so this is its only user until PutEnd.
        Some(unsafe { std::slice::from_raw_parts_mut(bytes.as_ptr() as *mut u8, bytes.len()) })
    }

    /// The staging buffer's `(addr, len)`.
    pub(crate) fn staging_range(&self) -> (usize, usize) {
        (self.staging.base(), self.staging.capacity() as usize)
    }

    /// Drops staged batches their readers never released.
    fn gc_batches(&self) {
        let ttl = self.gc_ttl;
        self.batches.lock().retain(|_, (at, _)| at.elapsed() < ttl);
    }
}

impl TierServe for TierShared {
    fn stage(&self, keys: &[&str]) -> Result<StagedBatch> {
        let now = self.now();
        // Room for every key the tier holds, then one batch read: values
        // that lie back to back in a bucket come in one request.
        let mut slots: Vec<Result<StagingBuf>> = keys
            .iter()
            .map(|&key| {
                self.tier
                    .location(key)
                    .ok_or_else(|| {
                        Error::new(
                            ErrorCode::OBJECT_NOT_FOUND,
                            format!("{key:?} is not in this tier"),
                        )
                    })
                    .and_then(|loc| self.staging.allocate(loc.len))
            })
            .collect();
        let mut reads: Vec<(&str, &mut [u8])> = Vec::with_capacity(keys.len());
        let mut slot_of = Vec::with_capacity(keys.len());
        for (i, (key, slot)) in keys.iter().zip(slots.iter_mut()).enumerate() {
            if let Ok(buf) = slot {
                reads.push((key, buf.as_mut_slice()));
                slot_of.push(i);
            }
        }
        let results = self.tier.read_batch(&mut reads, now);
        drop(reads);
        for (i, r) in slot_of.into_iter().zip(results) {
            if let Err(e) = r {
                slots[i] = Err(Error::new(e.code(), e.to_string()));
            }
        }
        let mut objects = Vec::with_capacity(keys.len());
        let mut bufs = Vec::with_capacity(keys.len());
        for staged in slots {
            objects.push(staged.map(|buf| {
                let o = StagedObject {
                    address: buf.addr() as u64,
                    size: buf.len() as u64,
                };
                bufs.push(buf);
                o
            }));
        }
        let batch_id = self.next_batch.fetch_add(1, Ordering::Relaxed);
        self.batches.lock().insert(batch_id, (Instant::now(), bufs));
        Ok(StagedBatch {
            batch_id,
            endpoint: self.engine_endpoint.clone(),
            objects,
        })
    }

    fn release(&self, batch_id: u64) {
        self.batches.lock().remove(&batch_id);
    }
}

/// A running tier: its shared state, its service and its worker.
pub(crate) struct Offload {
    shared: Arc<TierShared>,
    server: Option<Server>,
    worker: Option<JoinHandle<()>>,
}

/// Where the tier's pieces come from.
pub(crate) struct OffloadSetup<'a> {
    pub id: ClientId,
    pub master: MasterClient,
    pub engine: &'a TransferEngine,
    pub engine_endpoint: String,
    /// Host the tier service listens on and readers connect to.
    pub host: String,
    pub segments: Vec<(usize, usize)>,
}

impl Offload {
    /// Opens the tier, mounts it on the master, registers what it holds
    /// and starts the worker.
    pub(crate) fn start(config: TierConfig, setup: OffloadSetup<'_>) -> Result<Offload> {
        let tier_err = |e: crate::tier::TierError| Error::new(e.code(), e.to_string());
        let opened_at = Instant::now();
        let (tier, report) = DiskTier::open(config.clone(), Verify::Structure).map_err(tier_err)?;
        for p in &report.problems {
            tracing::warn!(problem = ?p, "SSD tier: dropped at startup");
        }
        let tier_id = tier.identity().map_err(tier_err)?;
        let len = usize::try_from(config.local_buffer_size.max(1 << 20))
            .map_err(|_| Error::new(ErrorCode::INVALID_PARAMS, "local buffer too large"))?;
        let addr = setup.engine.allocate_managed_buffer(len)?;
        let staging = StagingPool::new(Box::new(ManagedRegion { addr, len }), STAGING_WAIT);
        let listener = TcpListener::bind((setup.host.as_str(), 0)).map_err(|e| {
            Error::new(
                ErrorCode::ERR_SOCKET,
                format!("tier service on {}: {e}", setup.host),
            )
        })?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorCode::ERR_SOCKET, e.to_string()))?
            .port();
        let service_addr = if setup.host.contains(':') {
            format!("[{}]:{port}", setup.host)
        } else {
            format!("{}:{port}", setup.host)
        };
        let shared = Arc::new(TierShared {
            id: setup.id,
            master: setup.master,
            tier,
            tier_id,
            engine_endpoint: setup.engine_endpoint,
            service_addr,
            segments: setup.segments,
            staging,
            batches: Mutex::new(HashMap::new()),
            next_batch: AtomicU64::new(1),
            gc_ttl: config.client_buffer_gc_ttl.max(Duration::from_millis(1)),
            started: Instant::now(),
            stop: AtomicBool::new(false),
        });
        let options = ServerOptions {
            name: "mooncake-tier",
            max_connections: 1024,
            when_full: WhenFull::Wait,
            idle_timeout: None,
            frame_timeout: Duration::from_secs(30),
            nodelay: true,
            read_buffer: 8 << 10,
            poll: Duration::ZERO,
            stack_size: None,
        };
        let server = Server::start(listener, Arc::new(TierHandler(shared.clone())), options)
            .map_err(|e| Error::new(ErrorCode::ERR_SOCKET, e.to_string()))?;
        let restored = worker::mount_and_restore(&shared)?;
        tracing::info!(
            dir = %config.storage_path.display(),
            objects = restored,
            dropped = report.problems.len(),
            ms = opened_at.elapsed().as_millis() as u64,
            service = %shared.service_addr,
            "SSD tier ready"
        );
        let worker = spawn_worker(&shared)?;
        Ok(Offload {
            shared,
            server: Some(server),
            worker: Some(worker),
        })
    }

    pub(crate) fn shared(&self) -> &Arc<TierShared> {
        &self.shared
    }

    /// Withdraws the tier from the master before this client stops: the
    /// worker stops first (finishing its round), so it cannot mount the
    /// tier again, then the master forgets the tier and its copies. The
    /// service keeps answering reads already handed out. If the master
    /// cannot be told, the worker runs again and the error is returned.
    pub(crate) fn withdraw(&mut self) -> Result<()> {
        let was_running = self.stop_worker();
        if let Err(e) = self.shared.master.unmount_local_disk(self.shared.id) {
            if was_running {
                self.shared.stop.store(false, Ordering::SeqCst);
                self.worker = Some(spawn_worker(&self.shared)?);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Stops the worker; whether it was running.
    fn stop_worker(&mut self) -> bool {
        self.shared.stop.store(true, Ordering::SeqCst);
        match self.worker.take() {
            Some(w) => {
                let _ = w.join();
                true
            }
            None => false,
        }
    }

    /// Stops the worker (finishing the round in progress: staged copies
    /// are committed and reported) and the service.
    pub(crate) fn stop(&mut self) {
        self.stop_worker();
        if let Some(s) = self.server.take() {
            s.stop();
        }
        self.shared.batches.lock().clear();
    }
}

fn spawn_worker(shared: &Arc<TierShared>) -> Result<JoinHandle<()>> {
    let w = shared.clone();
    std::thread::Builder::new()
        .name("mooncake-offload".into())
        .spawn(move || worker::run(&w))
        .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, format!("offload thread: {e}")))
}

impl Drop for Offload {
    fn drop(&mut self) {
        self.stop();
    }
}
