//! The real client: owns a transfer engine, optionally contributes a
//! segment, and moves object bytes for puts and gets. Everything here works
//! on addresses in this process; the public [`Client`](super::Client) and
//! the dummy-client service translate their callers' buffers into them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{
    EngineConfig, Opcode, SegmentHandle, TransferEngine, TransferRequest, TransferState,
};
use parking_lot::{Mutex, RwLock};

use super::config::{split_host_port, ClientConfig};
use super::registry::BufferRegistry;
use super::replica::{self, Locality};
use super::staging::{StagingBuf, StagingPool};
use super::validate::{validate_key, validate_read_key, validate_value_len};
use super::{BufferHandle, DestFn};
use crate::master_client::MasterClient;
use crate::types::{
    ClientId, MemoryDescriptor, ReplicaDesc, ReplicateConfig, SegmentInfo, TaskAssignment, TaskId,
    TaskInfo,
};

/// Largest single buffer one mounted segment uses; bigger contributions are
/// mounted as several segments so each stays one shared-memory mapping of
/// bounded size.
pub const MAX_SEGMENT_CHUNK: u64 = 16 << 30;
/// How often the client tells the master it is alive (well under any sane
/// `client_ttl`).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// How often a client holding a segment asks the master for copy and move
/// tasks to execute.
pub const TASK_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Tasks taken per poll; the rest wait for the next one.
const TASKS_PER_POLL: u32 = 16;
/// Port range the reference picks from when `local_hostname` has no port.
const AUTO_PORT_RANGE: std::ops::Range<u16> = 12300..14300;

struct MountedSegment {
    info: SegmentInfo,
    addr: usize,
    len: usize,
}

/// Where a value's bytes come from.
pub(crate) enum Payload<'a> {
    /// Caller memory the engine does not know; staged before sending.
    Bytes(Vec<&'a [u8]>),
    /// Registered memory in this process, as `(addr, len)` parts.
    Mem(Vec<(usize, usize)>),
}

impl Payload<'_> {
    fn len(&self) -> u64 {
        match self {
            Payload::Bytes(parts) => parts.iter().map(|p| p.len() as u64).sum(),
            Payload::Mem(parts) => parts.iter().map(|p| p.1 as u64).sum(),
        }
    }
}

/// One piece of a read: `len` bytes at `src_off` in the object land at `dst`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frag {
    pub src_off: u64,
    pub dst: usize,
    pub len: usize,
}

/// A copy this process does itself instead of asking the engine.
struct LocalCopy {
    src: usize,
    dst: usize,
    len: usize,
}

/// An engine batch that requests join as they are planned, so the engine
/// moves early requests while later ones are still being prepared (a put of
/// many `bytes` values stages value i+1 while value i is on the wire).
/// [`Flight::finish`] does the local copies, waits, and reports one outcome
/// per submitted request, in submission order.
struct Flight<'c> {
    client: &'c RealClient,
    /// `Err`: the batch could not be allocated; every request fails with it.
    batch: Result<Option<mooncake_transfer::BatchId>>,
    /// Per request: its index in the batch, or why it never joined.
    joined: Vec<Result<usize>>,
    in_batch: usize,
}

impl<'c> Flight<'c> {
    /// Room for `capacity` requests (an upper bound; 0 allocates nothing).
    fn new(client: &'c RealClient, capacity: usize) -> Self {
        let batch = if capacity == 0 {
            Ok(None)
        } else {
            client.engine.allocate_batch(capacity).map(Some)
        };
        Flight {
            client,
            batch,
            joined: Vec::new(),
            in_batch: 0,
        }
    }

    /// Starts `requests` now; a refused submission fails only them.
    fn submit(&mut self, requests: &[TransferRequest]) {
        if requests.is_empty() {
            return;
        }
        let outcome = match &self.batch {
            Ok(Some(batch)) => self.client.engine.submit(*batch, requests),
            Ok(None) => Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                "transfer batch sized for no requests",
            )),
            Err(e) => Err(e.clone()),
        };
        match outcome {
            Ok(()) => {
                self.joined
                    .extend((0..requests.len()).map(|i| Ok(self.in_batch + i)));
                self.in_batch += requests.len();
            }
            Err(e) => self.joined.extend(requests.iter().map(|_| Err(e.clone()))),
        }
    }

    /// Runs `copies` while the batch is in flight, waits for it, frees it.
    fn finish(self, copies: &[LocalCopy]) -> Vec<Result<()>> {
        for c in copies {
            // SAFETY: every LocalCopy was built from a source checked with
            // `check_local` (or a live slice / staging buffer) and a
            // destination inside this process's own segment or a checked
            // caller buffer; ranges of distinct copies never overlap
            // because each belongs to a distinct allocation.
            unsafe { std::ptr::copy_nonoverlapping(c.src as *const u8, c.dst as *mut u8, c.len) };
        }
        let Ok(Some(batch)) = self.batch else {
            return self.joined.into_iter().map(|r| r.map(|_| ())).collect();
        };
        let engine = &self.client.engine;
        if self.in_batch > 0 {
            self.client.poll_batch(batch);
            let _ = engine.wait_batch(batch);
        }
        let out = self
            .joined
            .into_iter()
            .map(|slot| {
                let i = slot?;
                match engine.transfer_status(batch, i) {
                    Ok(s) if s.state == TransferState::Completed => Ok(()),
                    Ok(s) => Err(Error::new(
                        ErrorCode::TRANSFER_FAIL,
                        format!(
                            "transfer {:?}{}",
                            s.state,
                            s.error.map(|c| format!(" ({c})")).unwrap_or_default()
                        ),
                    )),
                    Err(e) => Err(e),
                }
            })
            .collect();
        if let Err(e) = engine.free_batch(batch) {
            tracing::warn!(error = %e, "free_batch failed");
        }
        out
    }
}

pub(crate) struct RealClient {
    id: ClientId,
    master: MasterClient,
    engine: TransferEngine,
    endpoint: String,
    host: String,
    segments: Vec<MountedSegment>,
    staging: Option<StagingPool>,
    registry: BufferRegistry,
    pool_allocs: Mutex<HashMap<usize, StagingBuf>>,
    handles: RwLock<HashMap<String, SegmentHandle>>,
    local_memcpy: bool,
    closed: AtomicBool,
    heartbeat: Mutex<Option<Heartbeat>>,
    executor: Mutex<Option<Worker>>,
}

fn closed_err() -> Error {
    Error::new(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, "client is closed")
}

fn env_flag(name: &str, default: bool) -> bool {
    match std::env::var(name) {
        Ok(v) => mooncake_common::gflags::parse_bool(&v).unwrap_or(default),
        Err(_) => default,
    }
}

impl RealClient {
    pub fn setup(config: &ClientConfig) -> Result<RealClient> {
        config.validate()?;
        let master = MasterClient::connect(&config.master_server_address)?;
        let engine = start_engine(config)?;
        let endpoint = engine.local_server_name();
        let host = engine.hostname();
        let id: ClientId = rand::random();

        let staging = if config.local_buffer_size > 0 {
            let len = usize::try_from(config.local_buffer_size).map_err(|_| {
                Error::new(ErrorCode::INVALID_PARAMS, "local_buffer_size too large")
            })?;
            let map = memmap2::MmapMut::map_anon(len).map_err(|e| {
                Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("local buffer of {len} bytes: {e}"),
                )
            })?;
            engine.register_local_memory(map.as_ptr() as usize, len, "cpu:0", false)?;
            Some(StagingPool::new(Box::new(map), Duration::from_secs(30)))
        } else {
            None
        };

        let mut client = RealClient {
            id,
            master,
            engine,
            endpoint,
            host,
            segments: Vec::new(),
            staging,
            registry: BufferRegistry::new(),
            pool_allocs: Mutex::new(HashMap::new()),
            handles: RwLock::new(HashMap::new()),
            local_memcpy: env_flag("MC_STORE_MEMCPY", true),
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
        let infos = client.segments.iter().map(|s| s.info.clone()).collect();
        *client.heartbeat.lock() = Some(Heartbeat::spawn(client.master.clone(), id, infos));
        Ok(client)
    }

    fn mount_segments(&mut self, total: u64) -> Result<()> {
        let mut left = total;
        let mut index = 0;
        while left > 0 {
            let len = left.min(MAX_SEGMENT_CHUNK);
            let len_usize = usize::try_from(len).map_err(|_| {
                Error::new(ErrorCode::INVALID_PARAMS, "global_segment_size too large")
            })?;
            let addr = self.engine.allocate_managed_buffer(len_usize)?;
            let name = if index == 0 {
                self.endpoint.clone()
            } else {
                format!("{}#{index}", self.endpoint)
            };
            let info = SegmentInfo {
                name,
                base: addr as u64,
                size: len,
                transport_endpoint: self.endpoint.clone(),
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

    fn unmount_all(&self) {
        for seg in &self.segments {
            if let Err(e) = self.master.unmount_segment(self.id, &seg.info.name) {
                tracing::warn!(segment = %seg.info.name, error = %e, "unmount failed");
            }
        }
    }

    pub fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(hb) = self.heartbeat.lock().take() {
            hb.stop();
        }
        if let Some(ex) = self.executor.lock().take() {
            ex.stop();
        }
        self.unmount_all();
        Ok(())
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            Err(closed_err())
        } else {
            Ok(())
        }
    }

    pub fn client_id(&self) -> ClientId {
        self.id
    }

    pub fn hostname(&self) -> String {
        self.endpoint.clone()
    }

    pub fn health_check(&self) -> Result<()> {
        self.check_open()?;
        match self.master.ping(self.id) {
            // The master answered and registered us; the heartbeat remounts.
            Err(e) if e.code == ErrorCode::CLIENT_NOT_FOUND => Ok(()),
            r => r,
        }
    }

    // ---- memory -------------------------------------------------------

    pub fn register_buffer(&self, addr: usize, len: usize) -> Result<()> {
        self.check_open()?;
        self.registry.register(addr, len)?;
        if let Err(e) = self.engine.register_local_memory(addr, len, "cpu:0", true) {
            let _ = self.registry.unregister(addr);
            return Err(e);
        }
        Ok(())
    }

    pub fn unregister_buffer(&self, addr: usize) -> Result<()> {
        self.registry.unregister(addr)?;
        self.engine.unregister_local_memory(addr)
    }

    pub fn alloc_from_mem_pool(&self, size: usize) -> Result<usize> {
        let buf = self.staging_pool()?.allocate(size as u64)?;
        let addr = buf.addr();
        self.pool_allocs.lock().insert(addr, buf);
        Ok(addr)
    }

    pub fn free_to_mem_pool(&self, addr: usize) -> Result<()> {
        self.pool_allocs
            .lock()
            .remove(&addr)
            .map(drop)
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("{addr:#x} was not allocated from the memory pool"),
                )
            })
    }

    fn staging_pool(&self) -> Result<&StagingPool> {
        self.staging.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                "local_buffer_size is 0: this node only stores data; use registered buffers",
            )
        })
    }

    /// Checks that caller memory `[addr, addr+len)` is registered (or comes
    /// from the memory pool) before any byte moves.
    pub fn check_local(&self, addr: usize, len: usize) -> Result<()> {
        if let Some(pool) = &self.staging {
            if len > 0 && pool.contains(addr, len) {
                return Ok(());
            }
        }
        self.registry.check(addr, len)
    }

    /// Whether `[addr, addr+len)` lies inside one of this client's own segments.
    fn own_range(&self, addr: u64, len: u64) -> bool {
        self.segments.iter().any(|s| {
            addr >= s.addr as u64
                && addr
                    .checked_add(len)
                    .is_some_and(|end| end <= (s.addr + s.len) as u64)
        })
    }

    fn is_own(&self, d: &MemoryDescriptor) -> bool {
        self.local_memcpy
            && replica::locality(d, &self.endpoint, &self.host) == Locality::Own
            && self.own_range(d.buffer_address, d.size)
    }

    fn handle(&self, endpoint: &str) -> Result<SegmentHandle> {
        if let Some(&h) = self.handles.read().get(endpoint) {
            return Ok(h);
        }
        let h = self.engine.open_segment(endpoint)?;
        self.handles.write().insert(endpoint.to_owned(), h);
        Ok(h)
    }

    // ---- transfers ----------------------------------------------------

    /// Runs `requests` as one engine batch and `copies` (local memcpys) while
    /// it is in flight. Returns one outcome per request.
    fn run_transfers(&self, requests: &[TransferRequest], copies: &[LocalCopy]) -> Vec<Result<()>> {
        let mut flight = Flight::new(self, requests.len());
        flight.submit(requests);
        flight.finish(copies)
    }

    /// Polls a submitted batch for a short window before `wait_batch` puts
    /// this thread to sleep: small transfers finish within microseconds, and
    /// being woken costs more than that on a VM (see `proto::spin`).
    fn poll_batch(&self, batch: mooncake_transfer::BatchId) {
        let window = crate::proto::spin::client_window();
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        while start.elapsed() < window {
            match self.engine.batch_status(batch) {
                Ok(s) if s.state == TransferState::Waiting => {}
                _ => return,
            }
            spins += 1;
            if spins.is_multiple_of(16) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    // ---- writes -------------------------------------------------------

    /// Puts (or upserts) every `(key, payload)`: one start RPC, all replicas
    /// of all objects in one engine batch, one end RPC for the objects that
    /// were written and one revoke RPC for those that were not.
    pub fn write(
        &self,
        keys: &[String],
        payloads: Vec<Payload<'_>>,
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<Result<()>> {
        assert_eq!(keys.len(), payloads.len());
        let mut results: Vec<Result<()>> = vec![Ok(()); keys.len()];
        if let Err(e) = self.check_open() {
            return vec![Err(e); keys.len()];
        }
        // 1. Local checks, so bad input never reaches the master.
        let mut live = Vec::new();
        for (i, (key, p)) in keys.iter().zip(&payloads).enumerate() {
            let check = validate_key(key)
                .and_then(|()| validate_value_len(p.len()))
                .and_then(|()| match p {
                    Payload::Bytes(_) => self.staging_pool().and_then(|pool| {
                        // A value the staging pool can never hold is refused up front.
                        if p.len() > pool.capacity() {
                            Err(Error::new(
                                ErrorCode::INVALID_PARAMS,
                                format!(
                                    "value of {} bytes exceeds the {} byte local buffer",
                                    p.len(),
                                    pool.capacity()
                                ),
                            ))
                        } else {
                            Ok(())
                        }
                    }),
                    Payload::Mem(parts) => {
                        parts.iter().try_for_each(|&(a, l)| self.check_local(a, l))
                    }
                });
            match check {
                Ok(()) => live.push(i),
                Err(e) => results[i] = Err(e),
            }
        }
        if live.is_empty() {
            return results;
        }
        // 2. Ask the master for space.
        let live_keys: Vec<String> = live.iter().map(|&i| keys[i].clone()).collect();
        let lens: Vec<u64> = live.iter().map(|&i| payloads[i].len()).collect();
        let started: Vec<Result<Vec<ReplicaDesc>>> = if live.len() == 1 {
            let r = if upsert {
                self.master
                    .upsert_start(self.id, &live_keys[0], lens[0], cfg)
            } else {
                self.master.put_start(self.id, &live_keys[0], lens[0], cfg)
            };
            vec![r]
        } else {
            let r = if upsert {
                self.master
                    .batch_upsert_start(self.id, &live_keys, &lens, cfg)
            } else {
                self.master.batch_put_start(self.id, &live_keys, &lens, cfg)
            };
            match r {
                Ok(v) if v.len() == live.len() => v,
                Ok(v) => vec![
                    Err(Error::new(
                        ErrorCode::RPC_FAIL,
                        format!("master answered {} of {}", v.len(), live.len())
                    ));
                    live.len()
                ],
                Err(e) => vec![Err(e); live.len()],
            }
        };

        // 3. Plan the copies: memcpy into own segments, engine writes
        // elsewhere, each object's requests started as soon as they are
        // planned (its value staged), so staging overlaps sending.
        let capacity: usize = started
            .iter()
            .zip(&live)
            .filter_map(|(r, &i)| Some((r.as_ref().ok()?, i)))
            .map(|(replicas, i)| {
                let parts = match &payloads[i] {
                    Payload::Mem(parts) => parts.len().max(1),
                    Payload::Bytes(_) => 1,
                };
                replicas
                    .iter()
                    .filter_map(ReplicaDesc::memory)
                    .filter(|t| !self.is_own(t))
                    .count()
                    * parts
            })
            .sum();
        let mut flight = Flight::new(self, capacity);
        let mut requests: Vec<TransferRequest> = Vec::new();
        let mut req_owner: Vec<usize> = Vec::new(); // index into `live`
        let mut copies: Vec<LocalCopy> = Vec::new();
        let mut staged: Vec<StagingBuf> = Vec::new();
        let mut written: Vec<bool> = vec![false; live.len()]; // put_start succeeded
        for (li, start) in started.into_iter().enumerate() {
            let i = live[li];
            let replicas = match start {
                Ok(r) => r,
                Err(e) => {
                    results[i] = Err(e);
                    continue;
                }
            };
            written[li] = true;
            let first = requests.len();
            if let Err(e) = self.plan_write(
                &payloads[i],
                lens[li],
                &replicas,
                li,
                &mut requests,
                &mut req_owner,
                &mut copies,
                &mut staged,
            ) {
                results[i] = Err(e);
            }
            flight.submit(&requests[first..]);
        }

        // 4. The local copies, while the engine moves the rest.
        for (r, &li) in flight.finish(&copies).into_iter().zip(&req_owner) {
            if let Err(e) = r {
                let slot = &mut results[live[li]];
                if slot.is_ok() {
                    *slot = Err(e.with_context(format!("writing {}", keys[live[li]])));
                }
            }
        }
        drop(staged);

        // 5. Publish what was written, revoke the rest.
        let (mut to_end, mut to_revoke) = (Vec::new(), Vec::new());
        for (li, &i) in live.iter().enumerate() {
            if written[li] {
                if results[i].is_ok() {
                    to_end.push(i);
                } else {
                    to_revoke.push(i);
                }
            }
        }
        if !to_end.is_empty() {
            let end_keys: Vec<String> = to_end.iter().map(|&i| keys[i].clone()).collect();
            let ended: Vec<Result<()>> = if end_keys.len() == 1 {
                vec![self.master.put_end(self.id, &end_keys[0])]
            } else {
                match self.master.batch_put_end(self.id, &end_keys) {
                    Ok(v) if v.len() == end_keys.len() => v,
                    Ok(_) => vec![
                        Err(Error::new(
                            ErrorCode::RPC_FAIL,
                            "short batch_put_end answer"
                        ));
                        end_keys.len()
                    ],
                    Err(e) => vec![Err(e); end_keys.len()],
                }
            };
            for (r, &i) in ended.into_iter().zip(&to_end) {
                if let Err(e) = r {
                    results[i] = Err(e);
                    to_revoke.push(i);
                }
            }
        }
        if !to_revoke.is_empty() {
            let revoke_keys: Vec<String> = to_revoke.iter().map(|&i| keys[i].clone()).collect();
            let outcome = if revoke_keys.len() == 1 {
                self.master.put_revoke(self.id, &revoke_keys[0])
            } else {
                self.master
                    .batch_put_revoke(self.id, &revoke_keys)
                    .map(|_| ())
            };
            if let Err(e) = outcome {
                // The master drops puts that never finish on its own.
                tracing::warn!(error = %e, "put_revoke failed");
            }
        }
        results
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_write<'p>(
        &self,
        payload: &Payload<'p>,
        len: u64,
        replicas: &[ReplicaDesc],
        owner: usize,
        requests: &mut Vec<TransferRequest>,
        req_owner: &mut Vec<usize>,
        copies: &mut Vec<LocalCopy>,
        staged: &mut Vec<StagingBuf>,
    ) -> Result<()> {
        let targets: Vec<&MemoryDescriptor> =
            replicas.iter().filter_map(ReplicaDesc::memory).collect();
        if targets.is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_REPLICA,
                "master gave no memory replica",
            ));
        }
        for t in &targets {
            if t.size < len {
                return Err(Error::new(
                    ErrorCode::INVALID_REPLICA,
                    format!("replica of {} bytes for a {len} byte value", t.size),
                ));
            }
        }
        /// Where one replica's bytes go.
        enum Route {
            /// Our own segment: a memcpy.
            Own,
            /// Already copied into a same-host peer's shared memory.
            Written,
            Engine(SegmentHandle),
        }
        let mut routes = Vec::with_capacity(targets.len());
        for t in &targets {
            routes.push(if self.is_own(t) {
                Route::Own
            } else {
                Route::Engine(self.handle(&t.transport_endpoint)?)
            });
        }
        // Plain bytes go straight into a same-host peer's shared memory when
        // it serves the replica; only the rest need a registered copy.
        if let Payload::Bytes(slices) = payload {
            for (t, route) in targets.iter().zip(routes.iter_mut()) {
                if let Route::Engine(target_id) = *route {
                    if self.write_shared(target_id, t.buffer_address, slices) {
                        *route = Route::Written;
                    }
                }
            }
        }
        let needs_engine = routes.iter().any(|r| matches!(r, Route::Engine(_)));
        // The source as registered parts.
        let parts: Vec<(usize, usize)> = match payload {
            Payload::Mem(parts) => parts.clone(),
            Payload::Bytes(slices) if !needs_engine => slices
                .iter()
                .map(|s| (s.as_ptr() as usize, s.len()))
                .collect(),
            Payload::Bytes(slices) => {
                let mut buf = self.staging_pool()?.allocate(len)?;
                let dst = buf.as_mut_slice();
                let mut off = 0;
                for s in slices {
                    dst[off..off + s.len()].copy_from_slice(s);
                    off += s.len();
                }
                let parts = vec![(buf.addr(), buf.len())];
                staged.push(buf);
                parts
            }
        };
        for (t, route) in targets.iter().zip(routes) {
            let mut off = 0u64;
            for &(addr, plen) in &parts {
                if plen == 0 {
                    continue;
                }
                match route {
                    Route::Written => {}
                    Route::Own => copies.push(LocalCopy {
                        src: addr,
                        dst: (t.buffer_address + off) as usize,
                        len: plen,
                    }),
                    Route::Engine(target_id) => {
                        requests.push(TransferRequest {
                            opcode: Opcode::Write,
                            source: addr,
                            target_id,
                            target_offset: t.buffer_address + off,
                            length: plen,
                        });
                        req_owner.push(owner);
                    }
                }
                off += plen as u64;
            }
        }
        Ok(())
    }

    /// Writes `slices` back to back at `remote` in a same-host peer's
    /// shared memory, in this thread. `false` when shared memory does not
    /// serve the range (the engine then writes the whole value).
    fn write_shared(&self, target: SegmentHandle, remote: u64, slices: &[&[u8]]) -> bool {
        let mut off = 0u64;
        for s in slices.iter().filter(|s| !s.is_empty()) {
            // SAFETY: `s` is a live slice of `s.len()` readable bytes.
            let copied = unsafe {
                self.engine.copy_shared(
                    target,
                    Opcode::Write,
                    s.as_ptr() as usize,
                    remote + off,
                    s.len(),
                )
            };
            if !copied.unwrap_or(false) {
                return false;
            }
            off += s.len() as u64;
        }
        true
    }

    // ---- reads --------------------------------------------------------

    /// Replica lists for `keys`, best replica first (one RPC).
    pub fn lookup(&self, keys: &[String]) -> Vec<Result<Vec<MemoryDescriptor>>> {
        if let Err(e) = self.check_open() {
            return vec![Err(e); keys.len()];
        }
        let mut out: Vec<Result<Vec<MemoryDescriptor>>> = Vec::with_capacity(keys.len());
        let mut ask = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            match validate_read_key(k) {
                Ok(()) => {
                    ask.push(i);
                    out.push(Ok(Vec::new()));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        if ask.is_empty() {
            return out;
        }
        let ask_keys: Vec<String> = ask.iter().map(|&i| keys[i].clone()).collect();
        let answers = if ask_keys.len() == 1 {
            vec![self.master.get_replica_list(&ask_keys[0])]
        } else {
            match self.master.batch_get_replica_list(&ask_keys) {
                Ok(v) if v.len() == ask_keys.len() => v,
                Ok(_) => {
                    vec![Err(Error::new(ErrorCode::RPC_FAIL, "short batch answer")); ask_keys.len()]
                }
                Err(e) => vec![Err(e); ask_keys.len()],
            }
        };
        for (a, &i) in answers.into_iter().zip(&ask) {
            out[i] = a.and_then(|resp| {
                let ranked = replica::rank(&resp.replicas, &self.endpoint, &self.host);
                if ranked.is_empty() {
                    Err(Error::new(
                        ErrorCode::REPLICA_IS_NOT_READY,
                        format!("{} has no readable memory replica", keys[i]),
                    ))
                } else {
                    Ok(ranked)
                }
            });
        }
        out
    }

    /// Reads every plan's fragments from its replicas, best first, falling
    /// back to the next replica of a plan whose transfer failed. Each round
    /// is one engine batch.
    pub fn fetch(&self, plans: &[(&[MemoryDescriptor], Vec<Frag>)]) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = vec![Ok(()); plans.len()];
        let mut attempt = vec![0usize; plans.len()];
        let mut pending: Vec<usize> = (0..plans.len())
            .filter(|&i| !plans[i].1.is_empty())
            .collect();
        while !pending.is_empty() {
            let mut requests = Vec::new();
            let mut req_owner = Vec::new();
            let mut copies = Vec::new();
            let mut failed_now: Vec<(usize, Error)> = Vec::new();
            for &p in &pending {
                let (replicas, frags) = &plans[p];
                let Some(rep) = replicas.get(attempt[p]) else {
                    continue;
                };
                if let Some(f) = frags.iter().find(|f| f.src_off + f.len as u64 > rep.size) {
                    failed_now.push((
                        p,
                        Error::new(
                            ErrorCode::INVALID_PARAMS,
                            format!(
                                "read of {}+{} past the {} byte object",
                                f.src_off, f.len, rep.size
                            ),
                        ),
                    ));
                    continue;
                }
                if self.is_own(rep) {
                    for f in frags {
                        copies.push(LocalCopy {
                            src: (rep.buffer_address + f.src_off) as usize,
                            dst: f.dst,
                            len: f.len,
                        });
                    }
                    continue;
                }
                match self.handle(&rep.transport_endpoint) {
                    Ok(target_id) => {
                        for f in frags {
                            let remote = rep.buffer_address + f.src_off;
                            // SAFETY: a fragment's destination is memory the
                            // caller holds for this call (staging, a checked
                            // registered buffer, or a fresh heap buffer).
                            let copied = unsafe {
                                self.engine.copy_shared(
                                    target_id,
                                    Opcode::Read,
                                    f.dst,
                                    remote,
                                    f.len,
                                )
                            };
                            if copied.unwrap_or(false) {
                                continue;
                            }
                            requests.push(TransferRequest {
                                opcode: Opcode::Read,
                                source: f.dst,
                                target_id,
                                target_offset: rep.buffer_address + f.src_off,
                                length: f.len,
                            });
                            req_owner.push(p);
                        }
                    }
                    Err(e) => failed_now.push((p, e)),
                }
            }
            for (r, &p) in self
                .run_transfers(&requests, &copies)
                .into_iter()
                .zip(&req_owner)
            {
                if let Err(e) = r {
                    failed_now.push((p, e));
                }
            }
            let mut retry = Vec::new();
            failed_now.sort_by_key(|(p, _)| *p);
            failed_now.dedup_by_key(|(p, _)| *p);
            for (p, e) in failed_now {
                attempt[p] += 1;
                if attempt[p] < plans[p].0.len() && e.code != ErrorCode::INVALID_PARAMS {
                    retry.push(p);
                } else {
                    results[p] = Err(e);
                }
            }
            pending = retry;
        }
        results
    }

    /// Reads whole objects into caller buffers given as scatter lists of
    /// registered memory. Returns each object's size.
    pub fn read_into(&self, keys: &[String], dests: &[Vec<(usize, usize)>]) -> Vec<Result<u64>> {
        let mut results: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        let mut checked: Vec<bool> = Vec::with_capacity(keys.len());
        for d in dests {
            let r = d.iter().try_for_each(|&(a, l)| self.check_local(a, l));
            checked.push(r.is_ok());
            results.push(r.map(|()| 0));
        }
        let ask: Vec<usize> = (0..keys.len()).filter(|&i| checked[i]).collect();
        let ask_keys: Vec<String> = ask.iter().map(|&i| keys[i].clone()).collect();
        let found = self.lookup(&ask_keys);
        let mut plans = Vec::new();
        let mut plan_owner = Vec::new();
        for (lr, &i) in found.iter().zip(&ask) {
            match lr {
                Err(e) => results[i] = Err(e.clone()),
                Ok(replicas) => {
                    let size = replicas[0].size;
                    match scatter(size, &dests[i]) {
                        Ok(frags) => {
                            results[i] = Ok(size);
                            plans.push((replicas.as_slice(), frags));
                            plan_owner.push(i);
                        }
                        Err(e) => results[i] = Err(e),
                    }
                }
            }
        }
        for (r, &i) in self.fetch(&plans).into_iter().zip(&plan_owner) {
            if let Err(e) = r {
                results[i] = Err(e);
            }
        }
        results
    }

    /// Reads whole objects into fresh buffers: staging memory, or the heap
    /// when the best replica is this process's own memory and `heap` is set.
    pub fn read_values(&self, keys: &[String], heap: bool) -> Vec<Result<BufferHandle>> {
        let found = self.lookup(keys);
        let mut results: Vec<Result<BufferHandle>> = Vec::with_capacity(keys.len());
        let mut plans = Vec::new();
        let mut plan_owner = Vec::new();
        for (i, lr) in found.iter().enumerate() {
            let replicas = match lr {
                Ok(r) => r,
                Err(e) => {
                    results.push(Err(e.clone()));
                    continue;
                }
            };
            let size = replicas[0].size as usize;
            let handle = if heap && self.is_own(&replicas[0]) {
                Ok(BufferHandle::heap(vec![0u8; size]))
            } else {
                self.staging_pool()
                    .and_then(|p| p.allocate(size as u64))
                    .map(BufferHandle::staged)
            };
            match handle {
                Ok(h) => {
                    let frags = if size == 0 {
                        Vec::new()
                    } else {
                        vec![Frag {
                            src_off: 0,
                            dst: h.ptr(),
                            len: size,
                        }]
                    };
                    // A heap destination is only valid for the own replica.
                    let reps = if h.is_heap() {
                        &replicas[..1]
                    } else {
                        &replicas[..]
                    };
                    plans.push((reps, frags));
                    plan_owner.push(i);
                    results.push(Ok(h));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        for (r, &i) in self.fetch(&plans).into_iter().zip(&plan_owner) {
            if let Err(e) = r {
                results[i] = Err(e);
            }
        }
        results
    }

    /// Whole objects into caller memory that `dest` provides once the sizes
    /// are known (`dest(sizes)`: one pointer per key, valid for `size` bytes
    /// where the size is `Some`; it need not be registered). A replica in our
    /// own segment or in a same-host peer's shared memory is copied once,
    /// straight into it; the others are fetched through the staging pool
    /// (which the engine can reach), all in one batch, and copied once more.
    pub fn read_values_with(&self, keys: &[String], dest: &mut DestFn<'_>) -> Vec<Result<usize>> {
        let found = self.lookup(keys);
        let sizes: Vec<Option<usize>> = found
            .iter()
            .map(|r| r.as_ref().ok().map(|reps| reps[0].size as usize))
            .collect();
        let mut results: Vec<Result<usize>> = found
            .iter()
            .map(|r| match r {
                Ok(reps) => Ok(reps[0].size as usize),
                Err(e) => Err(e.clone()),
            })
            .collect();
        if sizes.iter().all(Option::is_none) {
            return results;
        }
        let outs = match dest(&sizes) {
            Ok(v) if v.len() == keys.len() => v,
            Ok(v) => {
                let e = Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("{} destinations for {} keys", v.len(), keys.len()),
                );
                return results.into_iter().map(|r| r.and(Err(e.clone()))).collect();
            }
            Err(e) => return results.into_iter().map(|r| r.and(Err(e.clone()))).collect(),
        };
        let mut staged: Vec<StagingBuf> = Vec::new();
        let mut plans = Vec::new();
        let mut plan_owner = Vec::new();
        for (i, lr) in found.iter().enumerate() {
            let Ok(replicas) = lr else { continue };
            let size = replicas[0].size as usize;
            // SAFETY: `dest` promised `size` writable bytes at `outs[i]`.
            if size == 0 || unsafe { self.copy_direct(replicas, outs[i] as usize, size) } {
                continue;
            }
            match self.staging_pool().and_then(|p| p.allocate(size as u64)) {
                Ok(buf) => {
                    plans.push((
                        &replicas[..],
                        vec![Frag {
                            src_off: 0,
                            dst: buf.addr(),
                            len: size,
                        }],
                    ));
                    plan_owner.push(i);
                    staged.push(buf);
                }
                Err(e) => results[i] = Err(e),
            }
        }
        let fetched = self.fetch(&plans);
        for ((r, &i), buf) in fetched.into_iter().zip(&plan_owner).zip(&staged) {
            match r {
                // SAFETY: the staging buffer is ours until dropped; `outs[i]`
                // holds `size` writable bytes of other memory.
                Ok(()) => unsafe {
                    std::ptr::copy_nonoverlapping(buf.as_slice().as_ptr(), outs[i], buf.len())
                },
                Err(e) => results[i] = Err(e),
            }
        }
        results
    }

    /// Copies a whole object into `out` without an engine batch when a
    /// replica allows it: one in our own segment, or one in a same-host
    /// peer's shared memory. `false` when none does (nothing was copied).
    ///
    /// # Safety
    /// `out..out+size` must be writable memory not overlapping any segment.
    unsafe fn copy_direct(&self, replicas: &[MemoryDescriptor], out: usize, size: usize) -> bool {
        for rep in replicas {
            if rep.size < size as u64 {
                continue;
            }
            if self.is_own(rep) {
                // SAFETY: the replica lies in our own segment (`is_own`
                // checked the range) and its lease keeps it from being freed
                // while we copy; the caller vouches for `out`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        rep.buffer_address as usize as *const u8,
                        out as *mut u8,
                        size,
                    )
                };
                return true;
            }
            let Ok(target) = self.handle(&rep.transport_endpoint) else {
                continue;
            };
            // SAFETY: forwarded from the caller.
            let copied = unsafe {
                self.engine
                    .copy_shared(target, Opcode::Read, out, rep.buffer_address, size)
            };
            if copied.unwrap_or(false) {
                return true;
            }
        }
        false
    }

    /// Ranged reads: per `(buffer i, key j, fragment k)` an outcome, so one
    /// bad fragment fails only itself. Buffers must be registered; each
    /// fragment is checked against its buffer's registered size and the
    /// object's size.
    pub fn read_ranges(&self, reqs: &[RangeRead]) -> Vec<Result<u64>> {
        let mut results: Vec<Result<u64>> = reqs.iter().map(|r| Ok(r.len as u64)).collect();
        // One lookup per distinct key.
        let mut key_index: HashMap<&str, usize> = HashMap::new();
        let mut uniq: Vec<String> = Vec::new();
        for r in reqs {
            key_index.entry(r.key.as_str()).or_insert_with(|| {
                uniq.push(r.key.clone());
                uniq.len() - 1
            });
        }
        let found = self.lookup(&uniq);
        // Group valid fragments by key so each key's frags fall back together.
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); uniq.len()];
        for (n, r) in reqs.iter().enumerate() {
            let u = key_index[r.key.as_str()];
            let check = match &found[u] {
                Err(e) => Err(e.clone()),
                Ok(reps) => {
                    let size = reps[0].size;
                    if r.len == 0 {
                        Err(Error::new(ErrorCode::INVALID_PARAMS, "fragment of 0 bytes"))
                    } else if !matches!(r.src_off.checked_add(r.len as u64), Some(end) if end <= size)
                    {
                        Err(Error::new(
                            ErrorCode::INVALID_PARAMS,
                            format!(
                                "source range {}+{} past the {size} byte object {}",
                                r.src_off, r.len, r.key
                            ),
                        ))
                    } else {
                        self.check_dest_range(r.buffer, r.buffer_len, r.dst_off, r.len)
                    }
                }
            };
            match check {
                Ok(()) => groups[u].push(n),
                Err(e) => results[n] = Err(e),
            }
        }
        let mut plans = Vec::new();
        let mut plan_owner = Vec::new();
        for (u, members) in groups.into_iter().enumerate() {
            if members.is_empty() {
                continue;
            }
            let Ok(reps) = &found[u] else { continue };
            let frags = members
                .iter()
                .map(|&n| Frag {
                    src_off: reqs[n].src_off,
                    dst: reqs[n].buffer + reqs[n].dst_off as usize,
                    len: reqs[n].len,
                })
                .collect();
            plans.push((reps.as_slice(), frags));
            plan_owner.push(members);
        }
        for (r, members) in self.fetch(&plans).into_iter().zip(&plan_owner) {
            if let Err(e) = r {
                for &n in members {
                    results[n] = Err(e.clone());
                }
            }
        }
        results
    }

    /// `[buffer+dst_off, +len)` must lie in the registered buffer at `buffer`
    /// (and within `buffer_len` when the caller states it).
    fn check_dest_range(
        &self,
        buffer: usize,
        buffer_len: Option<usize>,
        dst_off: u64,
        len: usize,
    ) -> Result<()> {
        let overflow = || {
            Error::new(
                ErrorCode::BUFFER_OVERFLOW,
                format!("fragment {dst_off}+{len} runs past its buffer"),
            )
        };
        // The buffer's extent: what the caller stated, else the registered
        // buffer (or pool) it starts in.
        let extent = match buffer_len {
            Some(cap) => {
                self.check_local(buffer, cap)?;
                cap as u64
            }
            None => self.extent_from(buffer)?,
        };
        match dst_off.checked_add(len as u64) {
            Some(end) if end <= extent => Ok(()),
            _ => Err(overflow()),
        }
    }

    /// Bytes from `addr` to the end of the registered buffer (or the staging
    /// pool) holding it.
    fn extent_from(&self, addr: usize) -> Result<u64> {
        if let Some(pool) = &self.staging {
            if pool.contains(addr, 1) {
                return Ok((pool.base() + pool.capacity() as usize - addr) as u64);
            }
        }
        let (start, len) = self.registry.containing(addr, 1)?;
        Ok((start + len - addr) as u64)
    }

    // ---- copy and move tasks --------------------------------------------

    /// Starts the thread executing the copy and move tasks the master assigns
    /// to this client, if it holds a segment. Call once the client is shared;
    /// the thread holds it weakly and ends with it (or at `close`).
    pub fn start_executor(self: &Arc<Self>) {
        if self.segments.is_empty() {
            return;
        }
        let weak: Weak<RealClient> = Arc::downgrade(self);
        let worker = Worker::spawn("mooncake-tasks", TASK_POLL_INTERVAL, move || {
            match weak.upgrade() {
                Some(client) if !client.closed.load(Ordering::Relaxed) => {
                    client.run_tasks();
                    true
                }
                _ => false,
            }
        });
        *self.executor.lock() = Some(worker);
    }

    /// Executes the tasks waiting for this client and reports each outcome.
    fn run_tasks(&self) {
        let tasks = match self.master.fetch_tasks(self.id, TASKS_PER_POLL) {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(error = %e, "fetch_tasks failed");
                return;
            }
        };
        for task in tasks {
            let outcome = self.execute_task(&task);
            let message = match &outcome {
                Ok(()) => String::new(),
                Err(e) => {
                    tracing::warn!(task = %format!("{:032x}", task.id), key = %task.key, error = %e, "task failed");
                    e.to_string()
                }
            };
            if let Err(e) =
                self.master
                    .mark_task_complete(self.id, task.id, outcome.is_ok(), &message)
            {
                tracing::warn!(error = %e, "mark_task_complete failed");
            }
        }
    }

    /// Copies `task.key` onto the task's targets: new replicas are allocated
    /// by the master, filled from an existing replica, then published (a
    /// move's source replica goes at that point) or revoked.
    fn execute_task(&self, task: &TaskAssignment) -> Result<()> {
        // Looking the replicas up first leases them for the copy.
        let sources = self
            .lookup(std::slice::from_ref(&task.key))
            .pop()
            .unwrap_or_else(|| Err(Error::new(ErrorCode::INTERNAL_ERROR, "empty lookup")))?;
        let fresh =
            self.master
                .replica_transfer_start(self.id, &task.key, &task.source, &task.targets)?;
        if fresh.is_empty() {
            return Ok(()); // every target already held a replica
        }
        let filled = self.fill_replicas(&sources, &fresh);
        let published = filled.and_then(|()| self.master.replica_transfer_end(self.id, &task.key));
        if let Err(e) = published {
            if let Err(r) = self.master.replica_transfer_revoke(self.id, &task.key) {
                tracing::warn!(key = %task.key, error = %r, "replica_transfer_revoke failed");
            }
            return Err(e);
        }
        Ok(())
    }

    /// Writes the object held by `sources` (ranked replicas) into the new
    /// replicas `fresh`: those in this client's segments are read in one
    /// engine batch (memcpy for an own source); any other target is then
    /// written from the first local copy.
    fn fill_replicas(&self, sources: &[MemoryDescriptor], fresh: &[ReplicaDesc]) -> Result<()> {
        let size = sources[0].size;
        let targets: Vec<&MemoryDescriptor> =
            fresh.iter().filter_map(ReplicaDesc::memory).collect();
        if targets.len() != fresh.len() || targets.iter().any(|t| t.size != size) {
            return Err(Error::new(
                ErrorCode::INVALID_REPLICA,
                format!("master allocated replicas that do not fit the {size} byte object"),
            ));
        }
        if size == 0 {
            return Ok(());
        }
        let len = usize::try_from(size)
            .map_err(|_| Error::new(ErrorCode::INVALID_REPLICA, "object too large"))?;
        let (local, remote): (Vec<&MemoryDescriptor>, Vec<&MemoryDescriptor>) = targets
            .into_iter()
            .partition(|t| self.own_range(t.buffer_address, t.size));
        let Some(first) = local.first() else {
            return Err(Error::new(
                ErrorCode::INVALID_REPLICA,
                "no new replica lies in this client's segments",
            ));
        };
        let frags: Vec<Frag> = local
            .iter()
            .map(|t| Frag {
                src_off: 0,
                dst: t.buffer_address as usize,
                len,
            })
            .collect();
        self.fetch(&[(sources, frags)]).pop().unwrap_or(Ok(()))?;
        let mut requests = Vec::with_capacity(remote.len());
        for t in remote {
            requests.push(TransferRequest {
                opcode: Opcode::Write,
                source: first.buffer_address as usize,
                target_id: self.handle(&t.transport_endpoint)?,
                target_offset: t.buffer_address,
                length: len,
            });
        }
        self.run_transfers(&requests, &[]).into_iter().collect()
    }

    // ---- metadata -----------------------------------------------------

    pub fn get_replica_desc(&self, keys: &[String]) -> Result<Vec<Result<Vec<ReplicaDesc>>>> {
        self.check_open()?;
        if keys.len() == 1 {
            // Batches go to the master as they are; it answers bad keys per key.
            validate_read_key(&keys[0])?;
            return Ok(vec![self
                .master
                .get_replica_list(&keys[0])
                .map(|r| r.replicas)]);
        }
        Ok(self
            .master
            .batch_get_replica_list(keys)?
            .into_iter()
            .map(|r| r.map(|r| r.replicas))
            .collect())
    }
}

impl Drop for RealClient {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl super::Backend for RealClient {
    fn client_id(&self) -> ClientId {
        self.id
    }
    fn hostname(&self) -> String {
        self.endpoint.clone()
    }
    fn health_check(&self) -> Result<()> {
        RealClient::health_check(self)
    }
    fn close(&self) -> Result<()> {
        RealClient::close(self)
    }
    fn register_buffer(&self, addr: usize, len: usize) -> Result<()> {
        RealClient::register_buffer(self, addr, len)
    }
    fn unregister_buffer(&self, addr: usize) -> Result<()> {
        RealClient::unregister_buffer(self, addr)
    }
    fn alloc_from_mem_pool(&self, size: usize) -> Result<usize> {
        RealClient::alloc_from_mem_pool(self, size)
    }
    fn free_to_mem_pool(&self, addr: usize) -> Result<()> {
        RealClient::free_to_mem_pool(self, addr)
    }
    fn write(
        &self,
        keys: &[String],
        payloads: Vec<Payload<'_>>,
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<Result<()>> {
        RealClient::write(self, keys, payloads, cfg, upsert)
    }
    fn read_into(&self, keys: &[String], dests: &[Vec<(usize, usize)>]) -> Vec<Result<u64>> {
        RealClient::read_into(self, keys, dests)
    }
    fn read_values(&self, keys: &[String], heap: bool) -> Vec<Result<BufferHandle>> {
        RealClient::read_values(self, keys, heap)
    }
    fn read_values_with(&self, keys: &[String], dest: &mut DestFn<'_>) -> Vec<Result<usize>> {
        RealClient::read_values_with(self, keys, dest)
    }
    fn read_ranges(&self, reqs: &[RangeRead]) -> Vec<Result<u64>> {
        RealClient::read_ranges(self, reqs)
    }
    fn get_size(&self, keys: &[String]) -> Vec<Result<u64>> {
        // The master's GetSize grants no lease, unlike a replica lookup.
        keys.iter()
            .map(|k| {
                self.check_open()?;
                validate_read_key(k)?;
                self.master.get_size(k)
            })
            .collect()
    }
    fn is_exist(&self, keys: &[String]) -> Result<Vec<Result<bool>>> {
        self.check_open()?;
        if keys.len() == 1 {
            // Batches go to the master as they are; it answers bad keys per key.
            if keys[0].is_empty() {
                return Ok(vec![Ok(false)]);
            }
            return Ok(vec![
                validate_read_key(&keys[0]).and_then(|()| self.master.exist_key(&keys[0]))
            ]);
        }
        self.master.batch_exist_key(keys)
    }
    fn remove(&self, keys: &[String], force: bool) -> Result<Vec<Result<()>>> {
        self.check_open()?;
        if keys.len() == 1 {
            // Batches go to the master as they are; it answers bad keys per key.
            return Ok(vec![
                validate_read_key(&keys[0]).and_then(|()| self.master.remove(&keys[0], force))
            ]);
        }
        self.master.batch_remove(keys, force)
    }
    fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64> {
        self.check_open()?;
        self.master.remove_by_regex(pattern, force)
    }
    fn remove_all(&self, force: bool) -> Result<u64> {
        self.check_open()?;
        self.master.remove_all(force)
    }
    fn replica_desc(&self, keys: &[String]) -> Result<Vec<Result<Vec<ReplicaDesc>>>> {
        self.get_replica_desc(keys)
    }
    fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<TaskId> {
        self.check_open()?;
        self.master.create_copy_task(key, targets)
    }
    fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<TaskId> {
        self.check_open()?;
        self.master.create_move_task(key, source, target)
    }
    fn query_task(&self, id: TaskId) -> Result<TaskInfo> {
        self.check_open()?;
        self.master.query_task(id)
    }
    fn batch_replica_clear(&self, keys: &[String], segment_name: &str) -> Result<Vec<String>> {
        self.check_open()?;
        self.master.batch_replica_clear(self.id, keys, segment_name)
    }
}

/// One fragment of a ranged read, flattened from the buffer-major shape.
#[derive(Clone, Debug)]
pub(crate) struct RangeRead {
    pub buffer: usize,
    /// The caller's stated buffer size, when known (the dummy client knows it).
    pub buffer_len: Option<usize>,
    pub key: String,
    pub dst_off: u64,
    pub src_off: u64,
    pub len: usize,
}

/// Splits an object of `size` bytes over destination parts in order.
pub(crate) fn scatter(size: u64, dests: &[(usize, usize)]) -> Result<Vec<Frag>> {
    let capacity: u64 = dests.iter().map(|d| d.1 as u64).sum();
    if capacity < size {
        return Err(Error::new(
            ErrorCode::BUFFER_OVERFLOW,
            format!("object of {size} bytes does not fit a {capacity} byte buffer"),
        ));
    }
    let mut frags = Vec::new();
    let mut off = 0u64;
    for &(addr, len) in dests {
        if off == size {
            break;
        }
        let n = (len as u64).min(size - off) as usize;
        if n > 0 {
            frags.push(Frag {
                src_off: off,
                dst: addr,
                len: n,
            });
        }
        off += n as u64;
    }
    Ok(frags)
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

/// A background thread running `tick` every `interval` until it returns
/// false or the worker is stopped.
struct Worker {
    stop: mpsc::Sender<()>,
    join: JoinHandle<()>,
}

impl Worker {
    fn spawn(
        name: &str,
        interval: Duration,
        mut tick: impl FnMut() -> bool + Send + 'static,
    ) -> Worker {
        let (stop, rx) = mpsc::channel::<()>();
        let join = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                match rx.recv_timeout(interval) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                if !tick() {
                    return;
                }
            })
            .expect("spawn worker thread");
        Worker { stop, join }
    }

    /// Stops the thread and waits for it, unless called from the thread
    /// itself (the executor may drop the client's last reference).
    fn stop(self) {
        let _ = self.stop.send(());
        if self.join.thread().id() != std::thread::current().id() {
            let _ = self.join.join();
        }
    }
}

/// The background thread that pings the master every
/// [`HEARTBEAT_INTERVAL`]; when the master no longer knows this client (it
/// restarted, or declared us dead after a long pause) the segments are
/// mounted again.
struct Heartbeat {
    stop: mpsc::Sender<()>,
    join: JoinHandle<()>,
}

impl Heartbeat {
    fn spawn(master: MasterClient, id: ClientId, segments: Vec<SegmentInfo>) -> Heartbeat {
        let (stop, rx) = mpsc::channel::<()>();
        let join = std::thread::Builder::new()
            .name("mooncake-heartbeat".into())
            .spawn(move || loop {
                match rx.recv_timeout(HEARTBEAT_INTERVAL) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                match master.ping(id) {
                    Ok(()) => {}
                    Err(e) if e.code == ErrorCode::CLIENT_NOT_FOUND => {
                        for seg in &segments {
                            if let Err(e) = master.mount_segment(id, seg) {
                                if e.code != ErrorCode::SEGMENT_ALREADY_EXISTS {
                                    tracing::warn!(segment = %seg.name, error = %e, "remount failed");
                                }
                            }
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "heartbeat failed"),
                }
            })
            .expect("spawn heartbeat thread");
        Heartbeat { stop, join }
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.join.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_splits_in_order() {
        let f = scatter(10, &[(100, 4), (200, 4), (300, 8)]).unwrap();
        let got: Vec<(u64, usize, usize)> = f.iter().map(|f| (f.src_off, f.dst, f.len)).collect();
        assert_eq!(got, [(0, 100, 4), (4, 200, 4), (8, 300, 2)]);
        assert_eq!(
            scatter(10, &[(100, 9)]).unwrap_err().code,
            ErrorCode::BUFFER_OVERFLOW
        );
        assert!(scatter(0, &[(100, 9)]).unwrap().is_empty());
    }
}
