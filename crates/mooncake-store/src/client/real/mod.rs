//! The real client: owns a transfer engine, optionally contributes a
//! segment, and moves object bytes for puts and gets. Everything here works
//! on addresses in this process; the public [`Client`](super::Client) and
//! the dummy-client service translate their callers' buffers into them.
//!
//! - `plan`: pure planning of what bytes move how (memcpy, shared memory,
//!   engine transfer), for writes and reads;
//! - `write` / `read`: the executors of those plans, around the master's
//!   calls; `flight`: the engine batch they share; `hedge`: a late read
//!   asked again of another replica;
//! - `sessions`: put and get sessions (reserve once, move ranges, end);
//! - `dynamic`: segments mounted and unmounted while the client runs;
//! - `tasks`: the copy and move tasks the master assigns to this client;
//! - `setup`: the engine, the staging pool and the segments; `worker`: the
//!   heartbeat and the task thread.

mod dynamic;
mod flight;
mod hedge;
mod plan;
mod read;
mod sessions;
mod setup;
mod tasks;
mod worker;
mod write;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{SegmentHandle, TransferEngine};
use parking_lot::{Mutex, RwLock};

use super::file_tier::FileWriter;
use super::metrics::{ClientMetrics, Route};
use super::offload::service::TierPeers;
use super::offload::Offload;
use super::prefault::Prefault;
use super::registry::{BufferRegistry, PoolAllocations};
use super::replica::Site;
use super::slow_peers::SlowPeers;
use super::staging::{StagingBuf, StagingPool};
use super::validate::validate_read_key;
use super::{BufferHandle, ClientImpl, DestFn, Payload, RangeRead, WriteCmd};
use crate::master_client::MasterClient;
use crate::types::{ClientId, ReplicaDesc, SegmentInfo, TaskId, TaskInfo, WriteOptions};
use plan::{check_source_range, scatter, Frag};
pub(crate) use sessions::SessionRange;
use worker::Worker;

struct MountedSegment {
    info: SegmentInfo,
    addr: usize,
    len: usize,
}

pub(crate) struct RealClient {
    id: ClientId,
    master: MasterClient,
    engine: TransferEngine,
    /// The port in this client's name, held while it lives (see `setup`).
    _name_claim: Option<socket2::Socket>,
    /// The engine endpoint and host, the mounted segments, memcpy on or off.
    site: Site,
    segments: Vec<MountedSegment>,
    staging: Option<StagingPool>,
    registry: BufferRegistry,
    pool_allocs: PoolAllocations,
    handles: RwLock<HashMap<String, SegmentHandle>>,
    closed: AtomicBool,
    heartbeat: Mutex<Option<Worker>>,
    executor: Mutex<Option<Worker>>,
    /// Store client metrics (`MC_STORE_CLIENT_METRIC`).
    pub(crate) metrics: Option<Arc<ClientMetrics>>,
    /// This client's SSD tier, when it runs one.
    offload: Mutex<Option<Offload>>,
    /// This client's writer for the shared-filesystem tier, when it has one.
    file_writer: Mutex<Option<FileWriter>>,
    /// Other storage clients' tier services (reads of disk-only objects).
    tier_peers: TierPeers,
    /// Faulting in the segments and staging pool after setup.
    prefault: Mutex<Option<Prefault>>,
    /// Put and get sessions in progress.
    sessions: sessions::Sessions,
    /// Segments mounted at run time, and the infos of all mounted ones.
    dynamic: dynamic::DynamicSegments,
    /// Read latencies per peer and the peers passed over as slow (`None`:
    /// hedged reads off).
    slow: Option<Mutex<SlowPeers>>,
}

impl RealClient {
    /// Counts `bytes` moved over `route`, when metrics are on.
    pub(super) fn count_route(&self, route: Route, write: bool, bytes: usize) {
        if let (Some(m), true) = (&self.metrics, bytes > 0) {
            m.observe_route(route, write, bytes as u64);
        }
    }
}

fn closed_err() -> Error {
    Error::new(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, "client is closed")
}

/// A batch call's answer spread over its `n` keys: a failed call fails
/// every key.
fn batch_answer<T: Clone>(answer: Result<Vec<Result<T>>>, n: usize) -> Vec<Result<T>> {
    match answer {
        Ok(v) if v.len() == n => v,
        Ok(v) => {
            let e = Error::new(
                ErrorCode::RPC_FAIL,
                format!("master answered {} of {n} keys", v.len()),
            );
            vec![Err(e); n]
        }
        Err(e) => vec![Err(e); n],
    }
}

impl RealClient {
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            Err(closed_err())
        } else {
            Ok(())
        }
    }

    fn staging_pool(&self) -> Result<&StagingPool> {
        self.staging.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                "local_buffer_size is 0: this node only stores data; use registered buffers",
            )
        })
    }

    /// A staging buffer of `len` bytes.
    fn stage(&self, len: u64) -> Result<StagingBuf> {
        self.staging_pool()?.allocate(len)
    }

    /// Checks that caller memory `[addr, addr+len)` is registered (or comes
    /// from the memory pool) before any byte moves.
    pub(crate) fn check_local(&self, addr: usize, len: usize) -> Result<()> {
        if let Some(pool) = &self.staging {
            if len > 0 && pool.contains(addr, len) {
                return Ok(());
            }
        }
        self.registry.check(addr, len)
    }

    /// The engine's handle of the segment `endpoint` serves, opened once.
    fn handle(&self, endpoint: &str) -> Result<SegmentHandle> {
        if let Some(&h) = self.handles.read().get(endpoint) {
            return Ok(h);
        }
        let h = self.engine.open_segment(endpoint)?;
        self.handles.write().insert(endpoint.to_owned(), h);
        Ok(h)
    }
}

impl Drop for RealClient {
    fn drop(&mut self) {
        let _ = ClientImpl::close(self);
        // No call is in flight any more. The engine may outlive this client
        // (a shared one): take back what the client put on it, so it never
        // serves memory unmapped below.
        for seg in &self.segments {
            if let Err(e) = self.engine.free_managed_buffer(seg.addr, seg.len) {
                tracing::warn!(segment = %seg.info.name, error = %e, "freeing segment");
            }
        }
        let buffers = self.registry.all().into_iter().map(|(addr, _)| addr);
        for addr in self
            .staging
            .as_ref()
            .map(|s| s.base())
            .into_iter()
            .chain(buffers)
        {
            let _ = self.engine.unregister_local_memory(addr);
        }
    }
}

impl ClientImpl for RealClient {
    fn client_id(&self) -> ClientId {
        self.id
    }

    fn hostname(&self) -> String {
        self.site.endpoint.clone()
    }

    fn health_check(&self) -> Result<()> {
        self.check_open()?;
        match self.master.ping(self.id) {
            // The master answered and registered us; the heartbeat remounts.
            Err(e) if e.code == ErrorCode::CLIENT_NOT_FOUND => Ok(()),
            r => r,
        }
    }

    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(mut p) = self.prefault.lock().take() {
            p.stop();
        }
        if let Some(hb) = self.heartbeat.lock().take() {
            hb.stop();
        }
        if let Some(ex) = self.executor.lock().take() {
            ex.stop();
        }
        if let Some(mut tier) = self.offload.lock().take() {
            tier.stop();
        }
        if let Some(mut w) = self.file_writer.lock().take() {
            w.stop();
        }
        self.unmount_all_dynamic();
        self.unmount_all();
        Ok(())
    }

    // ---- memory -------------------------------------------------------

    fn register_buffer(&self, addr: usize, len: usize) -> Result<()> {
        self.check_open()?;
        self.registry.register(addr, len)?;
        if let Err(e) = self.engine.register_local_memory(addr, len, "cpu:0", true) {
            let _ = self.registry.unregister(addr);
            return Err(e);
        }
        Ok(())
    }

    fn unregister_buffer(&self, addr: usize) -> Result<()> {
        self.registry.unregister(addr)?;
        self.engine.unregister_local_memory(addr)
    }

    fn alloc_from_mem_pool(&self, size: usize) -> Result<usize> {
        Ok(self.pool_allocs.keep(self.stage(size as u64)?))
    }

    fn free_to_mem_pool(&self, addr: usize) -> Result<()> {
        self.pool_allocs.free(addr)
    }

    fn local_buffer_size(&self) -> u64 {
        self.staging.as_ref().map_or(0, StagingPool::capacity)
    }

    fn lease_local_buffer(&self, len: usize) -> Result<Option<StagingBuf>> {
        self.check_open()?;
        Ok(self.staging_pool()?.try_allocate(len as u64))
    }

    // ---- writes -------------------------------------------------------

    /// One start RPC for all values, all replicas of all of them in one
    /// engine batch, one end RPC for the values that were written and one
    /// revoke RPC for those that were not.
    fn write(
        &self,
        keys: &[String],
        payloads: Vec<Payload<'_>>,
        cmd: &WriteCmd<'_>,
    ) -> Vec<Result<()>> {
        assert_eq!(keys.len(), payloads.len());
        let opts = cmd.opts;
        if let Err(e) = self.check_open() {
            return vec![Err(e); keys.len()];
        }
        if !opts.config.groups_fit(keys.len()) {
            let e = Error::new(
                ErrorCode::INVALID_PARAMS,
                "group_ids must name one group per key",
            );
            return vec![Err(e); keys.len()];
        }
        // Local checks first, so bad input never reaches the master.
        let mut results: Vec<Result<()>> = keys
            .iter()
            .zip(&payloads)
            .map(|(key, p)| self.check_write(key, p))
            .collect();
        if results.iter().all(Result::is_ok) {
            // The usual case: every key goes on, no copies of keys needed.
            let payloads: Vec<&Payload<'_>> = payloads.iter().collect();
            let started = self.start_writes(keys, &payloads, opts);
            let sent = self.send_values(keys, &payloads, &started);
            return self.end_writes(keys, sent);
        }
        let live: Vec<usize> = (0..keys.len()).filter(|&i| results[i].is_ok()).collect();
        if live.is_empty() {
            return results;
        }
        let live_keys: Vec<String> = live.iter().map(|&i| keys[i].clone()).collect();
        let live_payloads: Vec<&Payload<'_>> = live.iter().map(|&i| &payloads[i]).collect();
        let live_opts;
        let opts = if opts.config.group_ids.is_some() {
            live_opts = WriteOptions {
                config: opts.config.for_keys(&live),
                upsert: opts.upsert,
            };
            &live_opts
        } else {
            opts
        };
        let started = self.start_writes(&live_keys, &live_payloads, opts);
        let sent = self.send_values(&live_keys, &live_payloads, &started);
        for (r, i) in self.end_writes(&live_keys, sent).into_iter().zip(live) {
            results[i] = r;
        }
        results
    }

    // ---- reads --------------------------------------------------------

    /// Whole objects into caller buffers given as scatter lists of
    /// registered memory. Returns each object's size.
    fn read_into(&self, keys: &[String], dests: &[Vec<(usize, usize)>]) -> Vec<Result<u64>> {
        let mut results: Vec<Result<u64>> = dests
            .iter()
            .map(|d| {
                d.iter()
                    .try_for_each(|&(a, l)| self.check_local(a, l))
                    .map(|()| 0)
            })
            .collect();
        let ask: Vec<usize> = (0..keys.len()).filter(|&i| results[i].is_ok()).collect();
        let ask_keys: Vec<String> = ask.iter().map(|&i| keys[i].clone()).collect();
        let found = self.lookup(&ask_keys);
        let mut plans = Vec::new();
        let mut plan_owner = Vec::new();
        for (lr, &i) in found.iter().zip(&ask) {
            let planned = lr.as_ref().map_err(Error::clone).and_then(|replicas| {
                let size = replicas[0].size;
                Ok((replicas, size, scatter(size, &dests[i])?))
            });
            match planned {
                Ok((replicas, size, frags)) => {
                    results[i] = Ok(size);
                    plans.push((replicas.as_slice(), frags, keys[i].as_str()));
                    plan_owner.push(i);
                }
                Err(e) => results[i] = Err(e),
            }
        }
        self.fetch_for(&plans, &plan_owner, &mut results);
        results
    }

    /// Whole objects into fresh buffers: staging memory, or the heap when
    /// the best replica is this process's own memory and `heap` is set.
    fn read_values(&self, keys: &[String], heap: bool) -> Vec<Result<BufferHandle>> {
        let found = self.lookup(keys);
        let mut results: Vec<Result<BufferHandle>> = Vec::with_capacity(keys.len());
        let mut plans = Vec::new();
        let mut plan_owner = Vec::new();
        for (i, lr) in found.iter().enumerate() {
            let handle = lr.as_ref().map_err(Error::clone).and_then(|replicas| {
                let size = replicas[0].size;
                if heap && self.site.is_own(&replicas[0]) {
                    // A heap destination is only valid for the own replica.
                    let h = BufferHandle::heap(vec![0u8; size as usize]);
                    Ok((h, &replicas[..1]))
                } else {
                    Ok((BufferHandle::staged(self.stage(size)?), &replicas[..]))
                }
            });
            match handle {
                Ok((h, replicas)) => {
                    plans.push((replicas, whole(h.ptr(), h.size()), keys[i].as_str()));
                    plan_owner.push(i);
                    results.push(Ok(h));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        self.fetch_for(&plans, &plan_owner, &mut results);
        results
    }

    /// Whole objects into caller memory that `dest` provides once the sizes
    /// are known (`dest(sizes)`: one pointer per key, valid for `size` bytes
    /// where the size is `Some`; it need not be registered). A replica in our
    /// own segment or in a same-host peer's shared memory is copied once,
    /// straight into it; the others are fetched through the staging pool
    /// (which the engine can reach), all in one batch, and copied once more.
    fn read_values_with(&self, keys: &[String], dest: &mut DestFn<'_>) -> Vec<Result<usize>> {
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
            if size == 0 || unsafe { self.read_direct(replicas, outs[i] as usize, size) } {
                continue;
            }
            match self.stage(size as u64) {
                Ok(buf) => {
                    plans.push((&replicas[..], whole(buf.addr(), size), keys[i].as_str()));
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

    /// Ranged reads: per `(buffer i, key j, fragment k)` an outcome, so one
    /// bad fragment fails only itself. Buffers must be registered; each
    /// fragment is checked against its buffer's registered size and the
    /// object's size. One lookup per distinct key; a key's fragments fall
    /// back to its next replica together.
    fn read_ranges(&self, reqs: &[RangeRead]) -> Vec<Result<u64>> {
        let mut results: Vec<Result<u64>> = reqs.iter().map(|r| Ok(r.len as u64)).collect();
        let mut key_index: HashMap<&str, usize> = HashMap::new();
        let mut uniq: Vec<String> = Vec::new();
        for r in reqs {
            key_index.entry(r.key.as_str()).or_insert_with(|| {
                uniq.push(r.key.clone());
                uniq.len() - 1
            });
        }
        let found = self.lookup(&uniq);
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); uniq.len()];
        for (n, r) in reqs.iter().enumerate() {
            let u = key_index[r.key.as_str()];
            let check = found[u].as_ref().map_err(Error::clone).and_then(|reps| {
                check_source_range(&r.key, reps[0].size, r.src_off, r.len)?;
                self.check_dest_range(r.buffer, r.buffer_len, r.dst_off, r.len)
            });
            match check {
                Ok(()) => groups[u].push(n),
                Err(e) => results[n] = Err(e),
            }
        }
        let mut plans = Vec::new();
        let mut plan_owner = Vec::new();
        for (u, members) in groups.into_iter().enumerate() {
            let Ok(reps) = &found[u] else { continue };
            if members.is_empty() {
                continue;
            }
            let frags = members
                .iter()
                .map(|&n| Frag {
                    src_off: reqs[n].src_off,
                    dst: reqs[n].buffer + reqs[n].dst_off as usize,
                    len: reqs[n].len,
                })
                .collect();
            plans.push((reps.as_slice(), frags, uniq[u].as_str()));
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

    // ---- metadata -----------------------------------------------------

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

    // A single key is checked here; batches go to the master as they are,
    // and it answers bad keys per key.

    fn is_exist(&self, keys: &[String]) -> Result<Vec<Result<bool>>> {
        self.check_open()?;
        if let [key] = keys {
            if key.is_empty() {
                return Ok(vec![Ok(false)]);
            }
            return Ok(vec![
                validate_read_key(key).and_then(|()| self.master.exist_key(key))
            ]);
        }
        self.master.batch_exist_key(keys)
    }

    fn remove(&self, keys: &[String], force: bool) -> Result<Vec<Result<()>>> {
        self.check_open()?;
        if let [key] = keys {
            return Ok(vec![
                validate_read_key(key).and_then(|()| self.master.remove(key, force))
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
        self.check_open()?;
        if let [key] = keys {
            validate_read_key(key)?;
            return Ok(vec![self.master.get_replica_list(key).map(|r| r.replicas)]);
        }
        Ok(self
            .master
            .batch_get_replica_list(keys)?
            .into_iter()
            .map(|r| r.map(|r| r.replicas))
            .collect())
    }

    // ---- replica tasks --------------------------------------------------

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

    fn as_real(&self) -> Option<&RealClient> {
        Some(self)
    }
}

/// The fragments of reading a whole object of `len` bytes to `dst`.
fn whole(dst: usize, len: usize) -> Vec<Frag> {
    if len == 0 {
        return Vec::new();
    }
    vec![Frag {
        src_off: 0,
        dst,
        len,
    }]
}
