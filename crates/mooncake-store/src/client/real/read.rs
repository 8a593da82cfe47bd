//! The read executor: looks replicas up (best first), carries out each
//! replica's [`ReadPlan`] (memcpy, shared-memory copies, one engine batch
//! per round) and falls back to the next replica when one fails.

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{Opcode, SegmentHandle, TransferRequest};

use super::super::validate::validate_read_key;
use super::flight::Flight;
use super::plan::{plan_read, Frag, Piece, ReadPlan};
use super::{batch_answer, RealClient};
use crate::types::MemoryDescriptor;

/// The fragments one key reads, from its replicas (best first).
pub(super) type FetchPlan<'r> = (&'r [MemoryDescriptor], Vec<Frag>);

impl RealClient {
    /// Replica lists for `keys`, best replica first (one RPC).
    pub(super) fn lookup(&self, keys: &[String]) -> Vec<Result<Vec<MemoryDescriptor>>> {
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
                let ranked = self.site.rank(&resp.replicas);
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
    pub(super) fn fetch(&self, plans: &[FetchPlan<'_>]) -> Vec<Result<()>> {
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
                match plan_read(rep, frags, &self.site) {
                    Err(e) => failed_now.push((p, e)),
                    Ok(ReadPlan::Memcpy(c)) => copies.extend(c),
                    Ok(ReadPlan::Peer { endpoint, pieces }) => match self.handle(endpoint) {
                        Ok(target) => {
                            for piece in pieces {
                                // SAFETY: a fragment's destination is memory
                                // the caller holds for this call (staging, a
                                // checked registered buffer, or a fresh heap
                                // buffer).
                                if unsafe { self.read_shared(target, &piece) } {
                                    continue;
                                }
                                requests.push(TransferRequest {
                                    opcode: Opcode::Read,
                                    source: piece.local,
                                    target_id: target,
                                    target_offset: piece.remote,
                                    length: piece.len,
                                });
                                req_owner.push(p);
                            }
                        }
                        Err(e) => failed_now.push((p, e)),
                    },
                }
            }
            let outcomes = Flight::run(&self.engine, &requests, &copies);
            for (r, &p) in outcomes.into_iter().zip(&req_owner) {
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
    unsafe fn read_shared(&self, target: SegmentHandle, piece: &Piece) -> bool {
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
