//! [`TransferEngine`]: registered memory, segments, batches, and the routing
//! of each request to a transport (own segment → memcpy; same host with a
//! shared buffer → mapped memcpy; otherwise TCP).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Mutex, RwLock};

use crate::batch::{Batch, IdleHook, TransferStatus};
use crate::config::EngineConfig;
use crate::memory::Region;
use crate::metadata::{self, rpc_meta_key, segment_key, MetadataStore, MetadataUri};
use crate::rawmem::SharedRegion;
use crate::rpc::{self, LocalState, RpcServer};
use crate::segment::{RpcMeta, SegmentDesc, ShmDesc};
use crate::transport::local::LocalTransport;
use crate::transport::shm::ShmTransport;
use crate::transport::tcp::{Limits, TcpTransport};
use crate::transport::{OpenSegment, Transport, Work};

/// How long past a frame's cut-off unregistering waits for peers' frames
/// (only a stalled thread needs it).
const RETIRE_SLACK: Duration = Duration::from_secs(5);

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
    managed: Mutex<HashMap<usize, SharedRegion>>,
    segments: RwLock<SegmentTable>,
    batches: Mutex<Batches>,
    next_batch: AtomicU64,
    local_transport: LocalTransport,
    shm: ShmTransport,
    tcp: TcpTransport,
    server: Mutex<Option<RpcServer>>,
    closed: AtomicBool,
    /// Requests routed to local, shm, tcp (the order of `transports()`).
    routed: [AtomicU64; 3],
}

#[derive(Default)]
struct Batches {
    live: HashMap<BatchId, Arc<Batch>>,
    /// `transfer_sync` batches whose timed-out requests were still draining
    /// when it returned; freed by a later allocation once idle.
    parked: Vec<BatchId>,
}

impl Batches {
    fn reap_parked(&mut self) {
        let live = &mut self.live;
        self.parked.retain(|id| match live.get(id) {
            Some(b) if !b.is_idle() => true,
            _ => {
                live.remove(id);
                false
            }
        });
    }
}

/// A segment named by a submission, with what the submission uses of it.
struct Target {
    seg: Arc<OpenSegment>,
    desc: Arc<SegmentDesc>,
    /// `(index in the transport list, route)`, in preference order.
    routes: Vec<(usize, Box<dyn crate::transport::Route>)>,
}

#[derive(Default)]
struct SegmentTable {
    by_handle: HashMap<SegmentHandle, Arc<OpenSegment>>,
    by_name: HashMap<String, SegmentHandle>,
    next: SegmentHandle,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::ERR_INVALID_ARGUMENT, msg)
}

/// Splits `host[:port]` (IPv6 hosts in brackets).
pub(crate) fn split_host_port(name: &str) -> (String, Option<u16>) {
    if let Some(rest) = name.strip_prefix('[') {
        if let Some((host, tail)) = rest.split_once(']') {
            return (
                host.to_string(),
                tail.strip_prefix(':').and_then(|p| p.parse().ok()),
            );
        }
    }
    match name.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(p) => (host.to_string(), Some(p)),
            Err(_) => (name.to_string(), None),
        },
        _ => (name.to_string(), None),
    }
}

impl TransferEngine {
    /// Starts the RPC listener and publishes this engine's `rpc_meta` and
    /// segment descriptor.
    pub fn new(config: EngineConfig) -> Result<TransferEngine> {
        let config = config.sanitized();
        let protocol = match config.protocol.trim() {
            "" | "tcp" => "tcp".to_string(),
            "rdma" => return Err(rdma_unavailable(&config.device_name)),
            other => {
                return Err(invalid(format!(
                    "unsupported protocol {other:?} (expected tcp or rdma)"
                )))
            }
        };
        let uri = MetadataUri::parse(&config.metadata_server)?;
        let metadata = match uri {
            MetadataUri::P2p => None,
            ref kv => Some(metadata::connect(kv)?),
        };

        let given = config.local_server_name.trim();
        let given = if given.is_empty() {
            "localhost".to_string()
        } else {
            given.to_string()
        };
        let (hostname, name_port) = split_host_port(&given);
        let bind_host = config
            .rpc_bind_address
            .clone()
            .unwrap_or_else(|| "0.0.0.0".to_string());
        let listener = rpc::bind(
            &bind_host,
            config.rpc_port.or(name_port),
            (config.min_rpc_port, config.max_rpc_port),
        )?;
        let rpc_port = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorCode::ERR_SOCKET, e.to_string()))?
            .port();
        let name = if metadata.is_none() {
            format!("{hostname}:{rpc_port}")
        } else {
            given
        };

        let control_max = config.handshake_max_length as u64;
        let local = Arc::new(LocalState {
            name: name.clone(),
            protocol: protocol.clone(),
            rpc_port,
            host_id: rpc::published_host_id(config.force_tcp),
            registry: RwLock::new(Default::default()),
            notifies: Mutex::default(),
            control_max,
            io_timeout: config.transfer_timeout,
        });
        let server = RpcServer::start(listener, local.clone())?;
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
                },
            ),
            local_transport: LocalTransport,
            config,
            name,
            hostname,
            rpc_port,
            local,
            metadata,
            managed: Mutex::new(HashMap::new()),
            segments: RwLock::new(SegmentTable {
                next: 1,
                ..Default::default()
            }),
            batches: Mutex::default(),
            next_batch: AtomicU64::new(1),
            server: Mutex::new(Some(server)),
            closed: AtomicBool::new(false),
            routed: Default::default(),
        };
        if let Some(store) = &inner.metadata {
            let meta = RpcMeta {
                ip_or_host_name: inner.hostname.clone(),
                rpc_port,
            };
            store.put(&rpc_meta_key(&inner.name), &meta.to_json())?;
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

    /// Registers `[addr, addr+length)` so requests may use it (and, when
    /// `remote_accessible`, peers may read and write it).
    ///
    /// The caller promises the memory stays valid until it is unregistered
    /// (the same contract as the reference's `void*` API).
    pub fn register_local_memory(
        &self,
        addr: usize,
        length: usize,
        location: &str,
        remote_accessible: bool,
    ) -> Result<()> {
        self.inner
            .register(&[(addr, length)], location, remote_accessible, None)
    }

    pub fn unregister_local_memory(&self, addr: usize) -> Result<()> {
        self.inner.unregister(&[addr])
    }

    pub fn register_local_memory_batch(
        &self,
        buffers: &[(usize, usize)],
        location: &str,
    ) -> Result<()> {
        self.inner.register(buffers, location, true, None)
    }

    pub fn unregister_local_memory_batch(&self, addrs: &[usize]) -> Result<()> {
        self.inner.unregister(addrs)
    }

    /// Engine-owned memory backed by shared memory (so same-host peers can
    /// map it), zeroed, page-aligned, already registered and published.
    pub fn allocate_managed_buffer(&self, length: usize) -> Result<usize> {
        if length == 0 {
            return Err(invalid("managed buffer of zero bytes"));
        }
        let region = SharedRegion::create("mooncake-segment", length).map_err(|e| {
            Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("allocate {length} bytes of shared memory: {e}"),
            )
        })?;
        let id = region.file_id();
        let shm = ShmDesc {
            pid: std::process::id(),
            fd: region.raw_fd(),
            dev: id.dev,
            ino: id.ino,
        };
        let addr = region.addr();
        self.inner
            .register(&[(addr, length)], "cpu:0", true, Some(shm))?;
        self.inner.managed.lock().insert(addr, region);
        Ok(addr)
    }

    /// Unregisters and releases a buffer from [`Self::allocate_managed_buffer`].
    pub fn free_managed_buffer(&self, addr: usize, length: usize) -> Result<()> {
        {
            let managed = self.inner.managed.lock();
            if !managed.contains_key(&addr) {
                return Err(Error::new(
                    ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                    format!("{addr:#x} is not a managed buffer"),
                ));
            }
            let registered = self
                .inner
                .local
                .registry
                .read()
                .find(addr, 0)
                .map(|r| r.len);
            if length != 0 && registered.is_some_and(|l| l != length) {
                return Err(invalid(format!(
                    "managed buffer {addr:#x} has length {registered:?}, not {length}"
                )));
            }
            // Same-host peers that mapped it stop using it now.
            managed[&addr].mark_freed();
        }
        // Unregistering waits for peers' frames in flight; then unmap.
        let unregistered = self.inner.unregister_inner(&[addr]);
        if let Err(e) = &unregistered {
            if e.code == ErrorCode::ERR_ADDRESS_NOT_REGISTERED {
                return unregistered; // a concurrent free got there first
            }
        }
        let region = self.inner.managed.lock().remove(&addr);
        if let Err(e) = &unregistered {
            if e.code == ErrorCode::ERR_BATCH_BUSY {
                // A peer's frame may still touch it: never unmap (leak instead).
                tracing::warn!("managed buffer {addr:#x} leaked: {e}");
                std::mem::forget(region);
            }
        }
        unregistered
    }

    /// Opens a segment by name (this engine's own name works too).
    pub fn open_segment(&self, name: &str) -> Result<SegmentHandle> {
        self.inner.open_segment(name)
    }

    pub fn close_segment(&self, handle: SegmentHandle) -> Result<()> {
        let seg = {
            let mut t = self.inner.segments.write();
            let seg = t
                .by_handle
                .remove(&handle)
                .ok_or_else(|| invalid(format!("no segment handle {handle}")))?;
            t.by_name.remove(&seg.name);
            seg
        };
        self.inner.shm.close_segment(&seg);
        Ok(())
    }

    /// The descriptor of an opened segment (fresh for this engine's own).
    pub fn segment_descriptor(&self, handle: SegmentHandle) -> Result<Arc<SegmentDesc>> {
        let seg = self.inner.segment(handle)?;
        if seg.is_local {
            return Ok(Arc::new(self.inner.local.descriptor()));
        }
        Ok(seg.desc())
    }

    /// Re-reads an opened segment's descriptor (new buffers of the peer).
    pub fn refresh_segment(&self, handle: SegmentHandle) -> Result<Arc<SegmentDesc>> {
        let seg = self.inner.segment(handle)?;
        self.inner.refresh(&seg)?;
        self.segment_descriptor(handle)
    }

    /// Address of the segment's first buffer, 0 when it has none.
    pub fn first_buffer_address(&self, segment_name: &str) -> Result<u64> {
        let handle = self.open_segment(segment_name)?;
        Ok(self.refresh_segment(handle)?.first_buffer_address())
    }

    /// A batch that accepts up to `batch_size` requests in total.
    pub fn allocate_batch(&self, batch_size: usize) -> Result<BatchId> {
        if batch_size == 0 {
            return Err(invalid("batch size 0"));
        }
        let id = self.inner.next_batch.fetch_add(1, Ordering::Relaxed);
        let batch = Batch::new(batch_size, self.inner.config.transfer_timeout);
        self.inner.add_batch(id, batch);
        Ok(id)
    }

    /// Starts `requests`. All are validated first: on error nothing starts.
    pub fn submit(&self, batch: BatchId, requests: &[TransferRequest]) -> Result<()> {
        self.inner.submit(batch, requests, None)
    }

    /// Like [`Self::submit`]; once every request of the batch has completed,
    /// `notify` is delivered to the first request's target.
    pub fn submit_with_notify(
        &self,
        batch: BatchId,
        requests: &[TransferRequest],
        notify: Notify,
    ) -> Result<()> {
        let first = requests
            .first()
            .ok_or_else(|| invalid("submit_with_notify without requests"))?;
        let target = self.inner.segment(first.target_id)?;
        let (local, rpc_addr) = (self.inner.local.clone(), target.rpc_addr);
        let (timeout, control_max) = (
            self.inner.config.transfer_timeout,
            self.inner.local.control_max,
        );
        let hook = Box::new(move |all_ok: bool| {
            if !all_ok {
                return;
            }
            match rpc_addr {
                None => {
                    if let Err(code) = local.notifies.lock().push(notify) {
                        tracing::warn!("notify after transfer dropped: {code:?}");
                    }
                }
                Some(addr) => {
                    // Off the transport's thread: this makes a connection.
                    let _ = std::thread::Builder::new()
                        .name("mc-notify".into())
                        .spawn(move || {
                            if let Err(e) = rpc::send_notify(addr, &notify, timeout, control_max) {
                                tracing::warn!("notify after transfer: {e}");
                            }
                        });
                }
            }
        });
        self.inner.submit(batch, requests, Some(hook))
    }

    /// Moves bytes between caller memory and a same-host peer's shared
    /// buffer right here, without a batch or a worker thread, when shared
    /// memory serves `[remote, remote+len)` of `target` (same host, shm not
    /// disabled by `MC_FORCE_TCP`, buffer mapped and not freed). `Ok(false)`:
    /// it does not, nothing was copied; submit a batch instead (which also
    /// refreshes a stale descriptor and reports the precise error).
    /// `ERR_ADDRESS_NOT_REGISTERED` when the owner freed the buffer during
    /// the copy.
    ///
    /// Unlike [`Self::submit`], `local` need not be registered: the copy is
    /// over when this returns, so no transport keeps the address.
    ///
    /// # Safety
    /// `local..local+len` must be valid for writes (`Read`) or reads
    /// (`Write`) for the duration of the call.
    pub unsafe fn copy_shared(
        &self,
        target: SegmentHandle,
        opcode: Opcode,
        local: usize,
        remote: u64,
        len: usize,
    ) -> Result<bool> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::new(ErrorCode::INTERNAL_ERROR, "engine is shut down"));
        }
        if len == 0 || local.checked_add(len).is_none() {
            return Ok(false);
        }
        let seg = self.inner.segment(target)?;
        // SAFETY: forwarded from the caller.
        let done = unsafe { self.inner.shm.copy_direct(&seg, opcode, local, remote, len) }
            .map_err(|code| {
                Error::new(
                    code,
                    format!(
                        "{remote:#x}+{len} of segment {} was freed during the copy",
                        seg.name
                    ),
                )
            })?;
        if done {
            self.inner.routed[1].fetch_add(1, Ordering::Relaxed);
        }
        Ok(done)
    }

    /// Status of request `task_id` (index in submission order) of `batch`.
    pub fn transfer_status(&self, batch: BatchId, task_id: usize) -> Result<TransferStatus> {
        self.inner
            .batch(batch)?
            .task_status(task_id, Instant::now())
    }

    /// Aggregate status of the batch.
    pub fn batch_status(&self, batch: BatchId) -> Result<TransferStatus> {
        Ok(self.inner.batch(batch)?.status(Instant::now()))
    }

    /// Blocks (no spinning) until every request of the batch is finished or timed out.
    ///
    /// A request reported `Timeout` (here or by a status call) no longer
    /// touches local memory: the report waits for a response being written
    /// into it to end. A timeout does not undo a request, though: bytes of a
    /// write already sent may still land at the target.
    pub fn wait_batch(&self, batch: BatchId) -> Result<TransferStatus> {
        Ok(self.inner.batch(batch)?.wait())
    }

    /// Frees a batch; refused (`ERR_BATCH_BUSY`) while requests run.
    pub fn free_batch(&self, batch: BatchId) -> Result<()> {
        let b = self.inner.batch(batch)?;
        b.prepare_free()?;
        self.inner.batches.lock().live.remove(&batch);
        Ok(())
    }

    /// allocate + submit + wait + free. The error carries the first failed
    /// request's code. After a timeout, a batch whose aborted requests are
    /// still draining is freed later (by a later allocation) rather than
    /// turning the result into `ERR_BATCH_BUSY`.
    pub fn transfer_sync(&self, requests: &[TransferRequest]) -> Result<()> {
        let batch = self.allocate_batch(requests.len().max(1))?;
        let result = self
            .submit(batch, requests)
            .map(|()| self.inner.batch(batch).map(|b| b.wait()));
        if let Err(e) = self.free_batch(batch) {
            tracing::debug!("transfer_sync: batch {batch} freed later: {e}");
            self.inner.batches.lock().parked.push(batch);
        }
        let status = result??;
        match status.state {
            crate::TransferState::Completed => Ok(()),
            state => Err(Error::new(
                status.error.unwrap_or(ErrorCode::TRANSFER_FAIL),
                format!("transfer ended {state:?}"),
            )),
        }
    }

    /// Delivers `notify` to the owner of segment `target`.
    pub fn send_notify(&self, target: SegmentHandle, notify: Notify) -> Result<()> {
        let seg = self.inner.segment(target)?;
        match seg.rpc_addr {
            None => self
                .inner
                .local
                .notifies
                .lock()
                .push(notify)
                .map_err(|code| Error::new(code, "too many notifies waiting for get_notifies")),
            Some(addr) => rpc::send_notify(
                addr,
                &notify,
                self.inner.config.transfer_timeout,
                self.inner.local.control_max,
            ),
        }
    }

    /// Drains the notifies received so far. At most 64 Ki notifies (64 MiB)
    /// wait here; past that, new ones are refused with `ERR_TOO_MANY_REQUESTS`.
    pub fn get_notifies(&self) -> Vec<Notify> {
        self.inner.local.notifies.lock().drain()
    }

    /// Requests carried by each transport so far.
    pub fn transport_stats(&self) -> TransportStats {
        let n = |i: usize| self.inner.routed[i].load(Ordering::Relaxed);
        TransportStats {
            local: n(0),
            shm: n(1),
            tcp: n(2),
        }
    }

    /// Stops the listener and connections and removes the metadata keys.
    /// Later transfers fail; managed buffers stay mapped until the last clone drops.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

fn rdma_unavailable(device: &str) -> Error {
    #[cfg(feature = "rdma")]
    {
        match crate::transport::rdma::open(device) {
            Err(e) => e,
            Ok(never) => match never {},
        }
    }
    #[cfg(not(feature = "rdma"))]
    {
        Error::new(
            ErrorCode::ERR_DEVICE_NOT_FOUND,
            format!("protocol rdma (device {device:?}): this build has no RDMA support (cargo feature `rdma`)"),
        )
    }
}

impl Inner {
    fn publish(&self) -> Result<()> {
        if let Some(store) = &self.metadata {
            store.put(&segment_key(&self.name), &self.local.descriptor().to_json())?;
        }
        Ok(())
    }

    fn register(
        &self,
        buffers: &[(usize, usize)],
        location: &str,
        remote: bool,
        shm: Option<ShmDesc>,
    ) -> Result<()> {
        let location = match location.trim() {
            "" | "*" => "cpu:0",
            l => l,
        };
        {
            let mut reg = self.local.registry.write();
            for (i, &(addr, len)) in buffers.iter().enumerate() {
                let region = Region::new(addr, len, location.to_string(), remote, shm.clone());
                if let Err(e) = reg.insert(region) {
                    let undone: Vec<_> = buffers[..i]
                        .iter()
                        .filter_map(|&(a, _)| reg.remove(a).ok())
                        .collect();
                    drop(reg);
                    self.retire(undone)?;
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.publish() {
            let undone: Vec<_> = {
                let mut reg = self.local.registry.write();
                buffers
                    .iter()
                    .filter_map(|&(a, _)| reg.remove(a).ok())
                    .collect()
            };
            self.retire(undone)?;
            return Err(e);
        }
        Ok(())
    }

    /// Waits until no peer frame uses the memory of `regions`, which have
    /// left the registry (so no new frame can start on them). Frames are
    /// bounded by the I/O timeout, so this normally returns well within it;
    /// `ERR_BATCH_BUSY` says a frame still holds the memory past that bound
    /// (the caller must then keep the memory alive).
    fn retire(&self, regions: Vec<Region>) -> Result<()> {
        // A frame is cut off after twice the I/O timeout (rpc.rs).
        let give_up = Instant::now() + self.local.io_timeout * 2 + RETIRE_SLACK;
        for r in regions {
            if !r.pin.retire(give_up) {
                return Err(Error::new(
                    ErrorCode::ERR_BATCH_BUSY,
                    format!(
                        "{:#x}: a peer's frame still uses this memory; keep it alive",
                        r.addr
                    ),
                ));
            }
        }
        Ok(())
    }

    fn unregister(&self, addrs: &[usize]) -> Result<()> {
        let managed = self.managed.lock();
        if let Some(a) = addrs.iter().find(|a| managed.contains_key(a)) {
            return Err(invalid(format!(
                "{a:#x} is a managed buffer; use free_managed_buffer"
            )));
        }
        drop(managed);
        self.unregister_inner(addrs)
    }

    /// Removes `addrs` from the registry (peers' new frames are refused at
    /// once), republishes, then waits for peers' frames still using them.
    fn unregister_inner(&self, addrs: &[usize]) -> Result<()> {
        let removed: Vec<Region> = {
            let mut reg = self.local.registry.write();
            if let Some(a) = addrs
                .iter()
                .find(|&&a| reg.find(a, 0).is_none_or(|r| r.addr != a))
            {
                return Err(Error::new(
                    ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                    format!("{a:#x} is not registered"),
                ));
            }
            addrs.iter().filter_map(|&a| reg.remove(a).ok()).collect()
        };
        let published = self.publish();
        self.retire(removed)?;
        published
    }

    fn segment(&self, handle: SegmentHandle) -> Result<Arc<OpenSegment>> {
        self.segments
            .read()
            .by_handle
            .get(&handle)
            .cloned()
            .ok_or_else(|| invalid(format!("no segment handle {handle}")))
    }

    fn add_batch(&self, id: BatchId, batch: Batch) {
        let mut batches = self.batches.lock();
        if !batches.parked.is_empty() {
            batches.reap_parked();
        }
        batches.live.insert(id, Arc::new(batch));
    }

    fn batch(&self, id: BatchId) -> Result<Arc<Batch>> {
        self.batches
            .lock()
            .live
            .get(&id)
            .cloned()
            .ok_or_else(|| invalid(format!("no batch {id}")))
    }

    /// Where segment `name` listens, and its descriptor.
    fn locate(&self, name: &str) -> Result<(std::net::SocketAddr, SegmentDesc)> {
        let timeout = self.config.transfer_timeout.min(Duration::from_secs(10));
        match &self.metadata {
            None => {
                let (host, port) = split_host_port(name);
                let port = port.ok_or_else(|| {
                    Error::new(
                        ErrorCode::ERR_INVALID_ARGUMENT,
                        format!("P2P segment name {name:?} is not host:port"),
                    )
                })?;
                let addr = rpc::resolve(&host, port)?;
                let desc = rpc::fetch_descriptor(addr, name, timeout, self.local.control_max)?;
                Ok((addr, desc))
            }
            Some(store) => {
                let missing = || {
                    Error::new(
                        ErrorCode::ERR_METADATA,
                        format!("segment {name:?} is not published"),
                    )
                };
                let meta = store.get(&rpc_meta_key(name))?.ok_or_else(missing)?;
                let meta = RpcMeta::from_json(&meta)?;
                let desc = store.get(&segment_key(name))?.ok_or_else(missing)?;
                let desc = SegmentDesc::from_json(&desc)?;
                Ok((rpc::resolve(&meta.ip_or_host_name, meta.rpc_port)?, desc))
            }
        }
    }

    fn open_segment(&self, name: &str) -> Result<SegmentHandle> {
        let name = name.trim();
        if name.is_empty() {
            return Err(invalid("empty segment name"));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::new(ErrorCode::INTERNAL_ERROR, "engine is shut down"));
        }
        if let Some(&h) = self.segments.read().by_name.get(name) {
            return Ok(h);
        }
        let (is_local, rpc_addr, desc) = if name == self.name {
            (true, None, self.local.descriptor())
        } else {
            let (addr, desc) = self.locate(name)?;
            (false, Some(addr), desc)
        };
        let mut t = self.segments.write();
        if let Some(&h) = t.by_name.get(name) {
            return Ok(h);
        }
        let handle = t.next;
        t.next += 1;
        let seg = OpenSegment {
            handle,
            name: name.to_string(),
            is_local,
            rpc_addr,
            desc: RwLock::new(Arc::new(desc)),
        };
        t.by_handle.insert(handle, Arc::new(seg));
        t.by_name.insert(name.to_string(), handle);
        Ok(handle)
    }

    fn refresh(&self, seg: &OpenSegment) -> Result<()> {
        let desc = if seg.is_local {
            self.local.descriptor()
        } else {
            self.locate(&seg.name)?.1
        };
        *seg.desc.write() = Arc::new(desc);
        Ok(())
    }

    fn submit(
        &self,
        batch_id: BatchId,
        requests: &[TransferRequest],
        on_idle: Option<IdleHook>,
    ) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::new(ErrorCode::INTERNAL_ERROR, "engine is shut down"));
        }
        let batch = self.batch(batch_id)?;
        // The segments named, each looked up once (usually one or two).
        let mut targets: Vec<Target> = Vec::new();
        let mut which: Vec<usize> = Vec::with_capacity(requests.len());
        for r in requests {
            let t = match targets.iter().position(|t| t.seg.handle == r.target_id) {
                Some(t) => t,
                None => {
                    let seg = self.segment(r.target_id)?;
                    let desc = seg.desc();
                    targets.push(Target {
                        seg,
                        desc,
                        routes: Vec::new(),
                    });
                    targets.len() - 1
                }
            };
            which.push(t);
        }
        // Validate everything before anything moves.
        {
            let reg = self.local.registry.read();
            for (i, (r, &t)) in requests.iter().zip(&which).enumerate() {
                reg.check_local(r.source, r.length).map_err(|code| {
                    Error::new(
                        code,
                        format!(
                            "request {i}: local range {:#x}+{} is not registered",
                            r.source, r.length
                        ),
                    )
                })?;
                let local_target_ok = usize::try_from(r.target_offset)
                    .is_ok_and(|a| reg.check_local(a, r.length).is_ok());
                if targets[t].seg.is_local && !local_target_ok {
                    return Err(Error::new(
                        ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                        format!(
                            "request {i}: target range {:#x}+{} is not registered",
                            r.target_offset, r.length
                        ),
                    ));
                }
            }
        }
        for (i, (r, &t)) in requests.iter().zip(&which).enumerate() {
            let target = &mut targets[t];
            if target.seg.is_local
                || target
                    .desc
                    .find_buffer(r.target_offset, r.length as u64)
                    .is_some()
            {
                continue;
            }
            // The peer may have registered it since we read its descriptor.
            self.refresh(&target.seg)?;
            target.desc = target.seg.desc();
            if target
                .desc
                .find_buffer(r.target_offset, r.length as u64)
                .is_none()
            {
                return Err(Error::new(
                    ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                    format!(
                        "request {i}: {:#x}+{} is outside segment {}",
                        r.target_offset, r.length, target.seg.name
                    ),
                ));
            }
        }

        let tasks = batch.add_tasks(requests.len(), Instant::now(), on_idle)?;
        // Each target's routes in preference order: local, shm, tcp.
        let transports: [&dyn Transport; 3] = [&self.local_transport, &self.shm, &self.tcp];
        for target in &mut targets {
            target.routes = transports
                .iter()
                .enumerate()
                .filter_map(|(k, t)| Some((k, t.route(&target.seg)?)))
                .collect();
        }
        // Group by (target, route), keeping submission order within a group.
        let mut groups: Vec<(usize, usize, Vec<Work>)> = Vec::new();
        for ((r, task), &t) in requests.iter().zip(tasks).zip(&which) {
            let Some(k) = targets[t]
                .routes
                .iter()
                .position(|(_, route)| route.serves(r.target_offset, r.length))
            else {
                task.fail(ErrorCode::ERR_INVALID_ARGUMENT);
                continue;
            };
            let work = Work {
                task,
                opcode: r.opcode,
                local: r.source,
                remote: r.target_offset,
                len: r.length,
            };
            match groups.iter_mut().find(|g| g.0 == t && g.1 == k) {
                Some(g) => g.2.push(work),
                None => groups.push((t, k, vec![work])),
            }
        }
        for (t, k, work) in groups {
            let (transport, route) = &targets[t].routes[k];
            tracing::trace!(
                "{} request(s) to segment {} via {}",
                work.len(),
                targets[t].seg.name,
                transports[*transport].name()
            );
            self.routed[*transport].fetch_add(work.len() as u64, Ordering::Relaxed);
            route.submit(work);
        }
        Ok(())
    }

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
    fn engine_is_send_and_sync() {
        fn check<T: Send + Sync + Clone>() {}
        check::<TransferEngine>();
    }

    /// A `transfer_sync` batch still draining after a timeout is parked, not
    /// leaked, and freed by a later allocation once idle.
    #[test]
    fn parked_batches_are_reaped_once_idle() {
        let mut c = EngineConfig::defaults("P2PHANDSHAKE", "127.0.0.1");
        c.rpc_bind_address = Some("127.0.0.1".into());
        let e = TransferEngine::new(c).unwrap();
        let start = Instant::now();
        let batch = Batch::new(1, Duration::from_secs(5)).with_drain_wait(Duration::ZERO);
        let task = batch.add_tasks(1, start, None).unwrap().remove(0);
        task.expect_slices(1);
        // Timed out with its slice still in flight.
        let later = start + Duration::from_secs(6);
        assert_eq!(batch.status(later).state, crate::TransferState::Timeout);
        let id = 1000;
        e.inner.add_batch(id, batch);
        assert_eq!(
            e.free_batch(id).unwrap_err().code,
            ErrorCode::ERR_BATCH_BUSY
        );
        e.inner.batches.lock().parked.push(id);
        let other = e.allocate_batch(1).unwrap();
        assert!(e.inner.batch(id).is_ok(), "still draining: kept");
        task.slice_done(Ok(1));
        e.allocate_batch(1).unwrap();
        assert!(e.inner.batch(id).is_err(), "reaped once idle");
        assert!(e.inner.batches.lock().parked.is_empty());
        e.free_batch(other).unwrap();
    }

    #[test]
    fn splits_names() {
        assert_eq!(split_host_port("node1"), ("node1".into(), None));
        assert_eq!(split_host_port("node1:1234"), ("node1".into(), Some(1234)));
        assert_eq!(
            split_host_port("127.0.0.1:80"),
            ("127.0.0.1".into(), Some(80))
        );
        assert_eq!(split_host_port("[::1]:80"), ("::1".into(), Some(80)));
        assert_eq!(split_host_port("::1"), ("::1".into(), None));
        assert_eq!(split_host_port("h:notaport"), ("h:notaport".into(), None));
    }
}
