//! The store client: put/get over the transfer engine.
//!
//! - [`Client`]: the public, blocking API (`Clone + Send + Sync`); one method
//!   per non-tensor method of the Python `MooncakeDistributedStore`, each a
//!   thin shape over the [`ClientImpl`] both kinds of client implement.
//! - `real`: the embedded ("real") client that owns an engine, a staging
//!   pool and optionally a segment: a pure planner of the bytes each put and
//!   get moves, and the executors that move them.
//! - `dummy` / `dummy_server`: a dummy client holds no segment and forwards to a
//!   real client on the same host (`mooncake_client`), sharing memory with
//!   it so object bytes never cross the RPC socket.
//! - `config`: [`ClientConfig`], including the one place client environment
//!   variables are read.
//! - `rust_api`: the reference crate's `MooncakeStore` on top of [`Client`].

mod buffer;
mod command;
pub mod config;
pub mod dummy;
mod file_tier;
pub mod offload;
// Public for the dummy-protocol tests that speak it byte by byte.
pub mod dummy_proto;
mod dummy_server;
pub mod http;
mod metered;
pub mod metrics;
mod mounts;
mod peer;
mod prefault;
mod ranges;
mod real;
mod registry;
mod replica;
pub(crate) mod rust_api;
mod sessions;
mod shm;
mod slow_peers;
pub mod staging;
mod stall_watch;
mod validate;

use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::TransferEngine;

pub use buffer::{BufferHandle, LocalLease};
pub use config::{ClientConfig, HugePages};
pub use dummy::DummyTransport;
pub use dummy_server::{ServiceConfig, ServiceLimits, StoreService};
pub use http::ClientHttpServer;
pub use metrics::ClientMetrics;
pub use rust_api::{store_code, store_count, store_exist, store_status, MooncakeStore, StoreError};

pub(crate) use ranges::RangeRead;

use crate::types::{ClientId, ReplicaDesc, TaskId, TaskInfo, WriteOptions};
pub(crate) use command::{Source, WriteCmd};
use ranges::RangeBatch;
use staging::StagingBuf;
use validate::same_len;

/// Where a value's bytes come from.
#[derive(Clone, Debug)]
pub(crate) enum Payload<'a> {
    /// Caller memory the engine does not know: copied straight into a
    /// same-host replica's shared memory, or staged before the engine sends it.
    Bytes(Vec<&'a [u8]>),
    /// Memory in this process registered with [`Client::register_buffer`]
    /// (or from [`Client::alloc_from_mem_pool`]), as `(addr, len)` parts.
    Mem(Vec<(usize, usize)>),
}

impl Payload<'_> {
    /// The value's length: its parts' lengths added up.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Payload::Bytes(parts) => parts.iter().map(|p| p.len() as u64).sum(),
            Payload::Mem(parts) => parts.iter().map(|p| p.1 as u64).sum(),
        }
    }
}

/// Hands out one destination pointer per key once the sizes are known
/// (`None`: the lookup failed; the pointer is then ignored).
pub(crate) type DestFn<'a> = dyn FnMut(&[Option<usize>]) -> Result<Vec<*mut u8>> + 'a;

/// What both the real and the dummy client provide; [`Client`] shapes the
/// caller's arguments and calls these.
pub(crate) trait ClientImpl: Send + Sync {
    fn client_id(&self) -> ClientId;
    fn hostname(&self) -> String;
    fn health_check(&self) -> Result<()>;
    fn close(&self) -> Result<()>;

    fn register_buffer(&self, addr: usize, len: usize) -> Result<()>;
    fn unregister_buffer(&self, addr: usize) -> Result<()>;
    fn alloc_from_mem_pool(&self, size: usize) -> Result<usize>;
    fn free_to_mem_pool(&self, addr: usize) -> Result<()>;
    /// Bytes of the staging pool (0: none).
    fn local_buffer_size(&self) -> u64;
    /// `len` bytes of the staging pool if it has room now, else `None`.
    fn lease_local_buffer(&self, len: usize) -> Result<Option<StagingBuf>>;

    /// Puts or upserts every `(key, payload)` as `cmd` says, one outcome
    /// per key.
    fn write(
        &self,
        keys: &[String],
        payloads: Vec<Payload<'_>>,
        cmd: &WriteCmd<'_>,
    ) -> Vec<Result<()>>;
    fn read_into(&self, keys: &[String], dests: &[Vec<(usize, usize)>]) -> Vec<Result<u64>>;
    fn read_values(&self, keys: &[String], heap: bool) -> Vec<Result<BufferHandle>>;
    /// Whole objects into memory `dest(sizes)` provides once the sizes are
    /// known (one pointer per key, `size` writable bytes where the size is
    /// `Some`). By default through the staging pool (two copies); the real
    /// client copies replicas in its own segment or same-host shared memory
    /// straight across.
    fn read_values_with(&self, keys: &[String], dest: &mut DestFn<'_>) -> Vec<Result<usize>> {
        let staged = self.read_values(keys, false);
        let sizes: Vec<Option<usize>> = staged
            .iter()
            .map(|r| r.as_ref().ok().map(BufferHandle::size))
            .collect();
        if sizes.iter().all(Option::is_none) {
            return staged.into_iter().map(|r| r.map(|h| h.size())).collect();
        }
        let outs = match dest(&sizes) {
            Ok(v) if v.len() == keys.len() => v,
            Ok(_) => {
                return vec![
                    Err(Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        "short destination list"
                    ));
                    keys.len()
                ]
            }
            Err(e) => return vec![Err(e); keys.len()],
        };
        staged
            .into_iter()
            .zip(outs)
            .map(|(r, out)| {
                let h = r?;
                // SAFETY: `dest` hands out `size` writable bytes per found
                // key (see `Client::get_with`); the staged bytes are a
                // distinct allocation.
                unsafe { std::ptr::copy_nonoverlapping(h.as_slice().as_ptr(), out, h.size()) };
                Ok(h.size())
            })
            .collect()
    }
    fn read_ranges(&self, reqs: &[RangeRead]) -> Vec<Result<u64>>;

    fn get_size(&self, keys: &[String]) -> Vec<Result<u64>>;
    fn is_exist(&self, keys: &[String]) -> Result<Vec<Result<bool>>>;
    fn remove(&self, keys: &[String], force: bool) -> Result<Vec<Result<()>>>;
    fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64>;
    fn remove_all(&self, force: bool) -> Result<u64>;
    fn replica_desc(&self, keys: &[String]) -> Result<Vec<Result<Vec<ReplicaDesc>>>>;

    fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<TaskId>;
    fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<TaskId>;
    fn query_task(&self, id: TaskId) -> Result<TaskInfo>;
    fn batch_replica_clear(&self, keys: &[String], segment_name: &str) -> Result<Vec<String>>;

    /// The embedded client, which alone keeps put and get sessions.
    fn as_real(&self) -> Option<&real::RealClient> {
        None
    }
}

/// A Mooncake Store client. Cheap to clone; every method blocks and may be
/// called from any thread.
#[derive(Clone)]
pub struct Client {
    inner: Arc<dyn ClientImpl>,
    metrics: Option<Arc<ClientMetrics>>,
}

fn one<T>(mut v: Vec<Result<T>>) -> Result<T> {
    v.pop()
        .unwrap_or_else(|| Err(Error::new(ErrorCode::INTERNAL_ERROR, "empty batch answer")))
}

/// A value's or a destination's memory: `(addr, len)` parts in order.
type Buffers = Vec<(usize, usize)>;

/// `(addrs[i], sizes[i])` for each of `n` keys.
fn buffers(n: usize, addrs: &[usize], sizes: &[usize]) -> Result<Buffers> {
    same_len("buffer_ptrs", n, addrs.len())?;
    same_len("sizes", n, sizes.len())?;
    Ok(addrs.iter().copied().zip(sizes.iter().copied()).collect())
}

/// One value per slice.
fn byte_values<'a>(values: &[&'a [u8]]) -> Vec<Payload<'a>> {
    values.iter().map(|v| Payload::Bytes(vec![*v])).collect()
}

/// One value per registered buffer `(addrs[i], sizes[i])`, for `n` keys.
fn mem_values(n: usize, addrs: &[usize], sizes: &[usize]) -> Result<Vec<Payload<'static>>> {
    Ok(buffers(n, addrs, sizes)?
        .into_iter()
        .map(|b| Payload::Mem(vec![b]))
        .collect())
}

/// Each of `n` keys' buffer list `(all_addrs[i][j], all_sizes[i][j])`; a key
/// whose two lists differ in length gets `INVALID_PARAMS`.
fn buffer_lists(
    n: usize,
    all_addrs: &[Vec<usize>],
    all_sizes: &[Vec<usize>],
) -> Result<Vec<Result<Buffers>>> {
    same_len("all_buffer_ptrs", n, all_addrs.len())?;
    same_len("all_sizes", n, all_sizes.len())?;
    Ok(all_addrs
        .iter()
        .zip(all_sizes)
        .map(|(a, s)| {
            if a.len() != s.len() {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    "buffer and size lists differ in length",
                ));
            }
            Ok(a.iter().copied().zip(s.iter().copied()).collect())
        })
        .collect())
}

/// Runs `run` on the keys whose item is `Ok` and answers every key: with its
/// item's error, or with what `run` answered for it.
fn run_valid<T, R>(
    keys: &[String],
    items: Vec<Result<T>>,
    run: impl FnOnce(&[String], Vec<T>) -> Vec<Result<R>>,
) -> Vec<Result<R>> {
    let mut results: Vec<Option<Result<R>>> = Vec::with_capacity(keys.len());
    let (mut ok_keys, mut ok_items, mut owners) = (Vec::new(), Vec::new(), Vec::new());
    for (i, item) in items.into_iter().enumerate() {
        match item {
            Ok(item) => {
                ok_keys.push(keys[i].clone());
                ok_items.push(item);
                owners.push(i);
                results.push(None);
            }
            Err(e) => results.push(Some(Err(e))),
        }
    }
    for (r, i) in run(&ok_keys, ok_items).into_iter().zip(owners) {
        results[i] = Some(r);
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| Err(Error::new(ErrorCode::INTERNAL_ERROR, "key not answered")))
        })
        .collect()
}

impl Client {
    /// Starts an embedded client: connects to the master, starts a transfer
    /// engine, allocates the staging pool (`local_buffer_size`) and mounts
    /// `global_segment_size` bytes of shared memory as this node's segment.
    /// The `MC_STORE_*` environment variables override `config` (see
    /// [`ClientConfig::apply_env`]).
    pub fn setup(config: &ClientConfig) -> Result<Client> {
        let client = Arc::new(real::RealClient::setup(config, None)?);
        client.start_executor();
        let metrics = client.metrics.clone();
        Ok(Client::metered(client, metrics))
    }

    /// [`Client::setup`] on an engine the caller already runs (and keeps
    /// using): the client takes the engine's name, metadata server and port,
    /// and ignores `config`'s `local_hostname`, `metadata_server`, `protocol`
    /// and `device_name`. Closing the client frees what it put on the engine
    /// (its segments, staging pool and registered buffers) and leaves the
    /// engine running.
    pub fn setup_with_engine(config: &ClientConfig, engine: TransferEngine) -> Result<Client> {
        let client = Arc::new(real::RealClient::setup(config, Some(engine))?);
        client.start_executor();
        let metrics = client.metrics.clone();
        Ok(Client::metered(client, metrics))
    }

    /// `inner`, its data calls counted in `metrics` when there are any.
    fn metered(inner: Arc<dyn ClientImpl>, metrics: Option<Arc<ClientMetrics>>) -> Client {
        let inner: Arc<dyn ClientImpl> = match &metrics {
            Some(m) => Arc::new(metered::Metered {
                inner,
                metrics: m.clone(),
            }),
            None => inner,
        };
        Client { inner, metrics }
    }

    /// This client's metrics (`None` with `MC_STORE_CLIENT_METRIC=0`).
    pub fn metrics(&self) -> Option<&Arc<ClientMetrics>> {
        self.metrics.as_ref()
    }

    /// Serves `/metrics` and `/health` on `host:port` until the returned
    /// server is dropped. Fails when metrics are off or the port is taken.
    pub fn start_http_server(&self, host: &str, port: u16) -> Result<ClientHttpServer> {
        let metrics = self.metrics.clone().ok_or_else(|| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                "the client HTTP server needs client metrics (MC_STORE_CLIENT_METRIC=0 turned them off)",
            )
        })?;
        let inner = self.inner.clone();
        ClientHttpServer::start(
            host,
            port,
            metrics,
            Arc::new(move || inner.health_check().is_ok()),
        )
    }

    /// Starts a dummy client that forwards to the `mooncake_client` at
    /// `server_address` (`host:port`) on this host. It holds no segment; it
    /// shares `mem_pool_size` bytes (for [`alloc_from_mem_pool`]) plus a
    /// `local_buffer_size` staging pool with the real client.
    ///
    /// [`alloc_from_mem_pool`]: Client::alloc_from_mem_pool
    pub fn setup_dummy(
        mem_pool_size: u64,
        local_buffer_size: u64,
        server_address: &str,
    ) -> Result<Client> {
        Self::setup_dummy_over(
            mem_pool_size,
            local_buffer_size,
            server_address,
            DummyTransport::Auto,
        )
    }

    /// [`setup_dummy`](Client::setup_dummy) over a chosen transport: by
    /// default a dummy uses the service's Unix socket when the service is
    /// on this host, else TCP.
    pub fn setup_dummy_over(
        mem_pool_size: u64,
        local_buffer_size: u64,
        server_address: &str,
        transport: DummyTransport,
    ) -> Result<Client> {
        let inner = Arc::new(dummy::DummyClient::connect(
            mem_pool_size,
            local_buffer_size,
            server_address,
            transport,
        )?);
        let metrics = config::client_metrics("dummy");
        Ok(Client::metered(inner, metrics))
    }

    /// Unmounts this client's segments and stops its heartbeat. Later calls
    /// fail with `UNAVAILABLE_IN_CURRENT_STATUS`. Idempotent.
    pub fn close(&self) -> Result<()> {
        self.inner.close()
    }

    pub fn client_id(&self) -> ClientId {
        self.inner.client_id()
    }

    /// This client's engine endpoint, `host:port`.
    pub fn get_hostname(&self) -> String {
        self.inner.hostname()
    }

    /// Pings the master (through the real client, for a dummy).
    pub fn health_check(&self) -> Result<()> {
        self.inner.health_check()
    }

    // ---- memory -------------------------------------------------------

    /// Registers caller memory for the zero-copy calls.
    pub fn register_buffer(&self, addr: usize, len: usize) -> Result<()> {
        self.inner.register_buffer(addr, len)
    }

    pub fn unregister_buffer(&self, addr: usize) -> Result<()> {
        self.inner.unregister_buffer(addr)
    }

    /// Memory usable by the zero-copy calls without registering (the staging
    /// pool; for a dummy, the pool shared with the real client).
    pub fn alloc_from_mem_pool(&self, size: usize) -> Result<usize> {
        if size == 0 {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "allocation of 0 bytes",
            ));
        }
        self.inner.alloc_from_mem_pool(size)
    }

    /// Returns memory from [`alloc_from_mem_pool`](Self::alloc_from_mem_pool).
    pub fn free_to_mem_pool(&self, addr: usize) -> Result<()> {
        self.inner.free_to_mem_pool(addr)
    }

    /// Size of the local buffer (`local_buffer_size` at setup; 0: none).
    pub fn local_buffer_size(&self) -> u64 {
        self.inner.local_buffer_size()
    }

    /// Lends `len` bytes of the local buffer (registered staging memory, so
    /// usable by the zero-copy calls in place) until the lease drops.
    /// `Ok(None)` when the local buffer has no room for them now: unlike a
    /// put's staging, this never waits. Fails when the client is closed or
    /// has no local buffer.
    pub fn lease_local_buffer(&self, len: usize) -> Result<Option<LocalLease>> {
        Ok(self.inner.lease_local_buffer(len)?.map(LocalLease::new))
    }

    // ---- writes ---------------------------------------------------------
    //
    // Each write takes its `WriteOptions` (put or upsert, and placement; a
    // `&ReplicaPolicy` alone is a put) and only shapes its arguments into
    // one write command. The names are the Python methods'; an upsert is
    // the same call with `WriteOptions::upsert`.

    fn write(
        &self,
        keys: &[String],
        values: Vec<Payload<'_>>,
        opts: &WriteOptions,
        source: Source,
    ) -> Vec<Result<()>> {
        self.inner.write(keys, values, &WriteCmd { opts, source })
    }

    pub fn put(&self, key: &str, value: &[u8], opts: impl Into<WriteOptions>) -> Result<()> {
        self.put_parts(key, &[value], opts)
    }

    /// Stores the concatenation of `parts` as one object.
    pub fn put_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        opts: impl Into<WriteOptions>,
    ) -> Result<()> {
        let value = Payload::Bytes(parts.to_vec());
        one(self.write(&[key.to_owned()], vec![value], &opts.into(), Source::Bytes))
    }

    /// Stores `values[i]` under `keys[i]` (one master round trip to start
    /// them, one engine batch, one to end them); one outcome per key.
    pub fn put_batch(
        &self,
        keys: &[String],
        values: &[&[u8]],
        opts: impl Into<WriteOptions>,
    ) -> Result<Vec<Result<()>>> {
        same_len("values", keys.len(), values.len())?;
        Ok(self.write(keys, byte_values(values), &opts.into(), Source::Bytes))
    }

    /// Stores `size` bytes at `addr` (a registered buffer or pool memory).
    pub fn put_from(
        &self,
        key: &str,
        addr: usize,
        size: usize,
        opts: impl Into<WriteOptions>,
    ) -> Result<()> {
        let value = Payload::Mem(vec![(addr, size)]);
        one(self.write(&[key.to_owned()], vec![value], &opts.into(), Source::Mem))
    }

    /// Stores `[metadata][data]` as one object, read from two registered buffers.
    pub fn put_from_with_metadata(
        &self,
        key: &str,
        addr: usize,
        metadata_addr: usize,
        size: usize,
        metadata_size: usize,
        opts: impl Into<WriteOptions>,
    ) -> Result<()> {
        let value = Payload::Mem(vec![(metadata_addr, metadata_size), (addr, size)]);
        one(self.write(&[key.to_owned()], vec![value], &opts.into(), Source::Mem))
    }

    pub fn batch_put_from(
        &self,
        keys: &[String],
        addrs: &[usize],
        sizes: &[usize],
        opts: impl Into<WriteOptions>,
    ) -> Result<Vec<Result<()>>> {
        let values = mem_values(keys.len(), addrs, sizes)?;
        Ok(self.write(keys, values, &opts.into(), Source::Mem))
    }

    /// Each key's value is the concatenation of its buffers.
    pub fn batch_put_from_multi_buffers(
        &self,
        keys: &[String],
        all_addrs: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        opts: impl Into<WriteOptions>,
    ) -> Result<Vec<Result<()>>> {
        let lists = buffer_lists(keys.len(), all_addrs, all_sizes)?;
        let opts = opts.into();
        Ok(run_valid(keys, lists, |keys, lists| {
            let values = lists.into_iter().map(Payload::Mem).collect();
            self.write(keys, values, &opts, Source::Mem)
        }))
    }

    // ---- reads ------------------------------------------------------------

    /// The object's bytes (`OBJECT_NOT_FOUND` when missing).
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        one(self.inner.read_values(&[key.to_owned()], true)).map(BufferHandle::into_vec)
    }

    pub fn get_batch(&self, keys: &[String]) -> Vec<Result<Vec<u8>>> {
        self.inner
            .read_values(keys, true)
            .into_iter()
            .map(|r| r.map(BufferHandle::into_vec))
            .collect()
    }

    /// Reads the whole object into memory the caller allocates once the size
    /// is known (e.g. a Python `bytes` under construction): `dest(size)`
    /// returns a buffer of exactly `size` bytes, which need not be
    /// registered. See [`Self::get_batch_with`]. Returns the size; `dest` is
    /// not called when the object cannot be read.
    pub fn get_with<'a>(
        &self,
        key: &str,
        dest: impl FnOnce(usize) -> Result<&'a mut [u8]>,
    ) -> Result<usize> {
        let keys = [key.to_owned()];
        one(self.get_batch_with(&keys, |sizes| match sizes.first() {
            Some(&Some(size)) => Ok(vec![Some(dest(size)?)]),
            _ => Ok(vec![None]),
        }))
    }

    /// Reads whole objects into memory the caller allocates once their sizes
    /// are known: `dest(sizes)` gets one entry per key (`None` where the
    /// lookup failed) and returns, per `Some(size)`, a buffer of exactly that
    /// size, which need not be registered. A replica in this process's own
    /// segment or in a same-host peer's shared memory is copied once,
    /// straight into it; the others are fetched in one engine batch through
    /// the staging pool. `dest` is called at most once, and not at all when
    /// no object can be read. Returns each object's size.
    pub fn get_batch_with<'a>(
        &self,
        keys: &[String],
        dest: impl FnOnce(&[Option<usize>]) -> Result<Vec<Option<&'a mut [u8]>>>,
    ) -> Vec<Result<usize>> {
        let mut dest = Some(dest);
        let mut raw = |sizes: &[Option<usize>]| -> Result<Vec<*mut u8>> {
            let f = dest.take().ok_or_else(|| {
                Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    "get_batch_with: destinations asked twice",
                )
            })?;
            let bufs = f(sizes)?;
            if bufs.len() != sizes.len() {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("{} destinations for {} keys", bufs.len(), sizes.len()),
                ));
            }
            bufs.into_iter()
                .zip(sizes)
                .map(|(buf, &size)| match (buf, size) {
                    (_, None) => Ok(std::ptr::null_mut()),
                    (Some(b), Some(size)) if b.len() == size => Ok(b.as_mut_ptr()),
                    (b, Some(size)) => Err(Error::new(
                        ErrorCode::INVALID_PARAMS,
                        format!(
                            "destination of {} bytes for a {size} byte object",
                            b.map_or(0, |b| b.len())
                        ),
                    )),
                })
                .collect()
        };
        self.inner.read_values_with(keys, &mut raw)
    }

    /// The object's bytes in the client's staging pool, without a copy to
    /// the heap.
    pub fn get_buffer(&self, key: &str) -> Result<BufferHandle> {
        one(self.inner.read_values(&[key.to_owned()], false))
    }

    pub fn batch_get_buffer(&self, keys: &[String]) -> Vec<Result<BufferHandle>> {
        self.inner.read_values(keys, false)
    }

    /// Reads the whole object into `[addr, addr+size)`; returns its size.
    /// A buffer smaller than the object is `BUFFER_OVERFLOW` and nothing is
    /// written.
    pub fn get_into(&self, key: &str, addr: usize, size: usize) -> Result<u64> {
        one(self
            .inner
            .read_into(&[key.to_owned()], &[vec![(addr, size)]]))
    }

    pub fn batch_get_into(
        &self,
        keys: &[String],
        addrs: &[usize],
        sizes: &[usize],
    ) -> Result<Vec<Result<u64>>> {
        let dests: Vec<Vec<(usize, usize)>> = buffers(keys.len(), addrs, sizes)?
            .into_iter()
            .map(|b| vec![b])
            .collect();
        Ok(self.inner.read_into(keys, &dests))
    }

    /// Scatters each object over its buffers in order. Same-host replicas
    /// are always preferred, so `_prefer_same_node` needs no extra work.
    pub fn batch_get_into_multi_buffers(
        &self,
        keys: &[String],
        all_addrs: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        _prefer_same_node: bool,
    ) -> Result<Vec<Result<u64>>> {
        let lists = buffer_lists(keys.len(), all_addrs, all_sizes)?;
        Ok(run_valid(keys, lists, |keys, dests| {
            self.inner.read_into(keys, &dests)
        }))
    }

    /// Buffer-major ranged reads: `result[i][j][k]` is the outcome of
    /// fragment `k` of key `all_keys[i][j]` into buffer `buffer_ptrs[i]`
    /// (bytes read). A shape mismatch fails the entries it touches with
    /// `INVALID_PARAMS`; one bad fragment never fails the others.
    pub fn get_into_ranges(
        &self,
        buffer_ptrs: &[usize],
        all_keys: &[Vec<String>],
        all_dst_offsets: &[Vec<Vec<u64>>],
        all_src_offsets: &[Vec<Vec<u64>>],
        all_sizes: &[Vec<Vec<u64>>],
    ) -> Vec<Vec<Vec<Result<u64>>>> {
        let batch = RangeBatch::flatten(
            buffer_ptrs,
            all_keys,
            all_dst_offsets,
            all_src_offsets,
            all_sizes,
        );
        let outcomes = self.inner.read_ranges(&batch.reads);
        batch.answer(outcomes)
    }

    // ---- metadata -------------------------------------------------------

    /// Size of the object in bytes.
    pub fn get_size(&self, key: &str) -> Result<u64> {
        one(self.inner.get_size(&[key.to_owned()]))
    }

    pub fn batch_get_size(&self, keys: &[String]) -> Vec<Result<u64>> {
        self.inner.get_size(keys)
    }

    pub fn is_exist(&self, key: &str) -> Result<bool> {
        one(self.inner.is_exist(&[key.to_owned()])?)
    }

    pub fn batch_is_exist(&self, keys: &[String]) -> Result<Vec<Result<bool>>> {
        self.inner.is_exist(keys)
    }

    /// Removes the object; a leased object needs `force`.
    pub fn remove(&self, key: &str, force: bool) -> Result<()> {
        one(self.inner.remove(&[key.to_owned()], force)?)
    }

    pub fn batch_remove(&self, keys: &[String], force: bool) -> Result<Vec<Result<()>>> {
        self.inner.remove(keys, force)
    }

    /// Removes every key matching `pattern`; returns how many.
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64> {
        self.inner.remove_by_regex(pattern, force)
    }

    pub fn remove_all(&self, force: bool) -> Result<u64> {
        self.inner.remove_all(force)
    }

    pub fn get_replica_desc(&self, key: &str) -> Result<Vec<ReplicaDesc>> {
        one(self.inner.replica_desc(&[key.to_owned()])?)
    }

    pub fn batch_get_replica_desc(&self, keys: &[String]) -> Result<Vec<Result<Vec<ReplicaDesc>>>> {
        self.inner.replica_desc(keys)
    }

    // ---- replica tasks ----------------------------------------------------

    /// Asks the master to copy `key` onto each of `targets` (mounted segment
    /// names); the client owning the first target does the copy. Returns the
    /// task id to follow with [`query_task`](Self::query_task).
    pub fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<TaskId> {
        self.inner.create_copy_task(key, targets)
    }

    /// Asks the master to move `key`'s replica on segment `source` to `target`.
    pub fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<TaskId> {
        self.inner.create_move_task(key, source, target)
    }

    /// A task's state (`TASK_NOT_FOUND` for unknown or long-finished ids).
    pub fn query_task(&self, id: TaskId) -> Result<TaskInfo> {
        self.inner.query_task(id)
    }

    /// Drops the replicas on `segment_name` (every replica when it is empty)
    /// of those `keys` whose lease has expired; returns the keys cleared.
    pub fn batch_replica_clear(&self, keys: &[String], segment_name: &str) -> Result<Vec<String>> {
        self.inner.batch_replica_clear(keys, segment_name)
    }
}
