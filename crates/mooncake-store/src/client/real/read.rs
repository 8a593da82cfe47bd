//! The read executor: looks replicas up (best first), carries out each
//! replica's [`ReadPlan`] (memcpy, shared-memory copies, one engine batch
//! per round) and falls back to the next replica when one fails.

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{Opcode, SegmentHandle, TransferRequest};

use super::super::metrics::Route;
use super::super::offload::service::{StagedBatch, TierServe};
use super::super::offload::TierShared;
use super::super::staging::StagingBuf;
use super::super::validate::validate_read_key;
use super::flight::Flight;
use super::plan::{plan_read, Frag, Piece, ReadPlan};
use super::{batch_answer, RealClient};
use crate::types::{
    DiskDescriptor, LocalDiskDescriptor, MemoryDescriptor, ReplicaKind, ReplicaStatus,
};

/// The fragments one key reads, from its replicas (best first), and the
/// key (asked about again when a read from its only replica stalls).
pub(super) type FetchPlan<'r> = (&'r [MemoryDescriptor], Vec<Frag>, &'r str);

/// Replica lists found by [`RealClient::lookup`]. Objects only on disk
/// were staged by their tier's owner for this read; the staged copies are
/// released when this drops, so the caller keeps it until its reads end.
pub(super) struct Lookup<'c> {
    found: Vec<Result<Vec<MemoryDescriptor>>>,
    client: &'c RealClient,
    /// (tier service, batch) of each staged batch.
    staged: Vec<(String, u64)>,
    /// Shared-filesystem copies read into the staging pool.
    _files: Vec<StagingBuf>,
}

impl std::ops::Deref for Lookup<'_> {
    type Target = Vec<Result<Vec<MemoryDescriptor>>>;
    fn deref(&self) -> &Self::Target {
        &self.found
    }
}

impl std::ops::DerefMut for Lookup<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.found
    }
}

impl Drop for Lookup<'_> {
    fn drop(&mut self) {
        for (addr, batch) in self.staged.drain(..) {
            self.client.release_staged(&addr, batch);
        }
    }
}

impl RealClient {
    /// Replica lists for `keys`, best replica first (one RPC to the master,
    /// and one per tier owner for objects only on disk).
    pub(super) fn lookup(&self, keys: &[String]) -> Lookup<'_> {
        let mut disk: Vec<(usize, LocalDiskDescriptor)> = Vec::new();
        let mut files: Vec<(usize, DiskDescriptor)> = Vec::new();
        let found = self.lookup_replicas(keys, &mut disk, &mut files);
        let mut out = Lookup {
            found,
            client: self,
            staged: Vec::new(),
            _files: Vec::new(),
        };
        if !disk.is_empty() {
            self.stage_from_tiers(keys, disk, &mut out);
        }
        for (i, d) in files {
            out.found[i] = self.read_file_copy(&keys[i], &d).map(|buf| {
                let desc = MemoryDescriptor {
                    segment_name: self.site.endpoint.clone(),
                    transport_endpoint: self.site.endpoint.clone(),
                    buffer_address: buf.addr() as u64,
                    size: d.object_size,
                    suspected: false,
                };
                out._files.push(buf);
                vec![desc]
            });
        }
        out
    }

    /// Reads a shared-filesystem copy from the mount into the staging
    /// pool, checked (key, length, checksum).
    fn read_file_copy(&self, key: &str, d: &DiskDescriptor) -> Result<StagingBuf> {
        let pool = self.staging.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                "reading the shared-filesystem tier needs a staging buffer (local_buffer_size > 0)",
            )
        })?;
        let mut buf = pool.allocate(d.object_size)?;
        let path = std::path::Path::new(&d.file_path);
        crate::tier::shared_fs::read_object(path, key, buf.as_mut_slice()).map_err(|e| {
            let code = match e {
                crate::tier::TierError::NotFound => ErrorCode::OBJECT_NOT_FOUND,
                ref e => e.code(),
            };
            Error::new(code, format!("{key}: {e}"))
        })?;
        Ok(buf)
    }

    /// Asks each tier owner to stage the disk-only objects in `disk` and
    /// points their replica lists at the staged copies.
    fn stage_from_tiers(
        &self,
        keys: &[String],
        mut disk: Vec<(usize, LocalDiskDescriptor)>,
        out: &mut Lookup<'_>,
    ) {
        disk.sort_by(|a, b| a.1.transport_endpoint.cmp(&b.1.transport_endpoint));
        for group in disk.chunk_by(|a, b| a.1.transport_endpoint == b.1.transport_endpoint) {
            let addr = &group[0].1.transport_endpoint;
            let ks: Vec<&str> = group.iter().map(|(i, _)| keys[*i].as_str()).collect();
            match self.stage_at(addr, &ks) {
                Ok(batch) => {
                    out.staged.push((addr.clone(), batch.batch_id));
                    for ((i, d), staged) in group.iter().zip(batch.objects) {
                        out.found[*i] = staged.and_then(|o| {
                            if o.size != d.object_size {
                                return Err(Error::new(
                                    ErrorCode::OBJECT_NOT_FOUND,
                                    format!("{}: the tier holds another version", keys[*i]),
                                ));
                            }
                            Ok(vec![MemoryDescriptor {
                                segment_name: batch.endpoint.clone(),
                                transport_endpoint: batch.endpoint.clone(),
                                buffer_address: o.address,
                                size: o.size,
                                suspected: false,
                            }])
                        });
                    }
                }
                Err(e) => {
                    for (i, _) in group {
                        out.found[*i] = Err(e.clone());
                    }
                }
            }
        }
    }

    /// Has the tier service at `addr` stage `keys` (this client's own tier
    /// without a round trip).
    fn stage_at(&self, addr: &str, keys: &[&str]) -> Result<StagedBatch> {
        if let Some(own) = self.own_tier(addr) {
            return own.stage(keys);
        }
        self.tier_peers.stage(addr, keys)
    }

    /// Reads of disk-only objects sent to other clients' tier services.
    pub(crate) fn offload_rpc_read_count(&self) -> u64 {
        self.tier_peers.read_count()
    }

    fn release_staged(&self, addr: &str, batch: u64) {
        match self.own_tier(addr) {
            Some(own) => own.release(batch),
            None => self.tier_peers.release(addr, batch),
        }
    }

    fn own_tier(&self, addr: &str) -> Option<std::sync::Arc<TierShared>> {
        let offload = self.offload.lock();
        let shared = offload.as_ref()?.shared();
        (shared.service_addr == addr).then(|| shared.clone())
    }

    /// Replica lists for `keys` from the master; keys with no memory
    /// replica but a copy in an SSD tier are listed in `disk`, those with
    /// one on the shared filesystem in `files`.
    fn lookup_replicas(
        &self,
        keys: &[String],
        disk: &mut Vec<(usize, LocalDiskDescriptor)>,
        files: &mut Vec<(usize, DiskDescriptor)>,
    ) -> Vec<Result<Vec<MemoryDescriptor>>> {
        if let Err(e) = self.check_open() {
            return vec![Err(e); keys.len()];
        }
        let mut out: Vec<Result<Vec<MemoryDescriptor>>> = keys
            .iter()
            .map(|k| validate_read_key(k).map(|()| Vec::new()))
            .collect();
        let ask: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_ok()).collect();
        if ask.is_empty() {
            return out;
        }
        let ask_keys: Vec<String> = ask.iter().map(|&i| keys[i].clone()).collect();
        let answers = match ask_keys.as_slice() {
            [key] => vec![self.master.get_replica_list(key)],
            _ => batch_answer(
                self.master.batch_get_replica_list(&ask_keys),
                ask_keys.len(),
            ),
        };
        for (a, &i) in answers.into_iter().zip(&ask) {
            out[i] = a.and_then(|resp| {
                let mut ranked = self.site.rank(&resp.replicas);
                if let Some(slow) = &self.slow {
                    slow.lock().order(&mut ranked, std::time::Instant::now());
                }
                let on_disk = resp.replicas.iter().find_map(|r| match &r.kind {
                    ReplicaKind::LocalDisk(d) if r.status == ReplicaStatus::Complete => Some(d),
                    _ => None,
                });
                if let (true, Some(d)) = (ranked.is_empty(), on_disk) {
                    disk.push((i, d.clone()));
                    return Ok(Vec::new());
                }
                let in_file = resp.replicas.iter().find_map(|r| match &r.kind {
                    ReplicaKind::Disk(d) if r.status == ReplicaStatus::Complete => Some(d),
                    _ => None,
                });
                if let (true, Some(d)) = (ranked.is_empty(), in_file) {
                    files.push((i, d.clone()));
                    return Ok(Vec::new());
                }
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
    /// is one engine batch; a plan late in it is hedged (`hedge`).
    pub(super) fn fetch(&self, plans: &[FetchPlan<'_>]) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = vec![Ok(()); plans.len()];
        let mut attempt = vec![0usize; plans.len()];
        let mut pending: Vec<usize> = (0..plans.len())
            .filter(|&i| !plans[i].1.is_empty())
            .collect();
        while !pending.is_empty() {
            let mut requests = Vec::new();
            let mut req_owner = Vec::new();
            let mut req_peer = Vec::new();
            // Reads from a Suspected owner's replica: their own batch, with
            // a short deadline, so a stalled owner fails them quickly.
            let mut wary = Vec::new();
            let mut wary_owner = Vec::new();
            let mut copies = Vec::new();
            let mut failed_now: Vec<(usize, Error)> = Vec::new();
            for &p in &pending {
                let (replicas, frags, _) = &plans[p];
                let Some(rep) = replicas.get(attempt[p]) else {
                    continue;
                };
                match plan_read(rep, frags, &self.site) {
                    Err(e) => failed_now.push((p, e)),
                    Ok(ReadPlan::Memcpy(c)) => {
                        let bytes = c.iter().map(|c| c.len).sum();
                        self.count_route(Route::Local, false, bytes);
                        copies.extend(c);
                    }
                    Ok(ReadPlan::Peer { endpoint, pieces }) => match self.handle(endpoint) {
                        Ok(target) => {
                            for piece in pieces {
                                // SAFETY: a fragment's destination is memory
                                // the caller holds for this call (staging, a
                                // checked registered buffer, or a fresh heap
                                // buffer).
                                if unsafe { self.read_shared(target, &piece) } {
                                    self.count_route(Route::Shm, false, piece.len);
                                    continue;
                                }
                                let (reqs, owners) = match rep.suspected {
                                    true => (&mut wary, &mut wary_owner),
                                    false => {
                                        req_peer.push(endpoint);
                                        (&mut requests, &mut req_owner)
                                    }
                                };
                                reqs.push(TransferRequest {
                                    opcode: Opcode::Read,
                                    source: piece.local,
                                    target_id: target,
                                    target_offset: piece.remote,
                                    length: piece.len,
                                });
                                owners.push(p);
                            }
                        }
                        Err(e) => failed_now.push((p, e)),
                    },
                }
            }
            let deadline = super::super::config::suspect_read_timeout();
            let mut wary_flight = Flight::with_timeout(&self.engine, wary.len(), deadline);
            wary_flight.submit(&wary);
            let outcomes =
                self.run_hedged(plans, &attempt, &requests, &req_owner, &req_peer, &copies);
            let wary_outcomes = wary_flight
                .finish(&[])
                .into_iter()
                .map(|r| r.map_err(|e| e.with_context("replica on a Suspected (silent) owner")));
            let mut fetched = 0;
            let all = outcomes.into_iter().chain(wary_outcomes);
            let owners = req_owner.iter().chain(&wary_owner);
            for ((r, &p), req) in all.zip(owners).zip(requests.iter().chain(&wary)) {
                match r {
                    Err(e) => failed_now.push((p, e)),
                    Ok(_) => fetched += req.length,
                }
            }
            self.count_route(Route::Engine, false, fetched);
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

    /// [`fetch`](Self::fetch), a failure landing in the result of the
    /// plan's owner (`owners[i]` for `plans[i]`).
    pub(super) fn fetch_for<T>(
        &self,
        plans: &[FetchPlan<'_>],
        owners: &[usize],
        results: &mut [Result<T>],
    ) {
        for (r, &i) in self.fetch(plans).into_iter().zip(owners) {
            if let Err(e) = r {
                results[i] = Err(e);
            }
        }
    }

    /// Copies `piece` out of a same-host peer's shared memory, in this
    /// thread; `false` when shared memory does not serve it.
    ///
    /// # Safety
    /// `piece.local` must be valid for `piece.len` bytes of writes.
    pub(super) unsafe fn read_shared(&self, target: SegmentHandle, piece: &Piece) -> bool {
        // SAFETY: forwarded from the caller.
        let copied = unsafe {
            self.engine
                .copy_shared(target, Opcode::Read, piece.local, piece.remote, piece.len)
        };
        copied.unwrap_or(false)
    }

    /// Copies a whole object into `out` without an engine batch when a
    /// replica allows it: one in our own segment, or one in a same-host
    /// peer's shared memory. `false` when none does (nothing was copied).
    ///
    /// # Safety
    /// `out..out+size` must be writable memory not overlapping any segment.
    pub(super) unsafe fn read_direct(
        &self,
        replicas: &[MemoryDescriptor],
        out: usize,
        size: usize,
    ) -> bool {
        let frag = [Frag {
            src_off: 0,
            dst: out,
            len: size,
        }];
        for rep in replicas {
            // A replica smaller than the object cannot serve it.
            let Ok(plan) = plan_read(rep, &frag, &self.site) else {
                continue;
            };
            match plan {
                ReadPlan::Memcpy(copies) => {
                    for c in copies {
                        // SAFETY: the replica lies in our own segment
                        // (`is_own` checked the range) and its lease keeps it
                        // from being freed while we copy; the caller vouches
                        // for `out`.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                c.src as *const u8,
                                c.dst as *mut u8,
                                c.len,
                            )
                        };
                    }
                    self.count_route(Route::Local, false, size);
                    return true;
                }
                ReadPlan::Peer { endpoint, pieces } => {
                    let Ok(target) = self.handle(endpoint) else {
                        continue;
                    };
                    // SAFETY: forwarded from the caller (the one piece is `out`).
                    if pieces
                        .iter()
                        .all(|p| unsafe { self.read_shared(target, p) })
                    {
                        self.count_route(Route::Shm, false, size);
                        return true;
                    }
                }
            }
        }
        false
    }

    /// `[buffer+dst_off, +len)` must lie in the registered buffer at `buffer`
    /// (and within `buffer_len` when the caller states it).
    pub(super) fn check_dest_range(
        &self,
        buffer: usize,
        buffer_len: Option<usize>,
        dst_off: u64,
        len: usize,
    ) -> Result<()> {
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
            _ => Err(Error::new(
                ErrorCode::BUFFER_OVERFLOW,
                format!("fragment {dst_off}+{len} runs past its buffer"),
            )),
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
}
