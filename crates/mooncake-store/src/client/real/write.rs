//! The write executor: between the master's PutStart and PutEnd, carries out
//! each value's [`WritePlan`]: shared-memory copies at once, a staged copy
//! for the engine when one is needed, engine requests submitted value by
//! value into one batch, own-segment memcpys while that batch is in flight.

use std::borrow::Cow;

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{Opcode, SegmentHandle, TransferRequest};
use smallvec::SmallVec;

use super::super::metrics::Route;
use super::super::staging::StagingBuf;
use super::super::validate::{validate_key, validate_value_len};
use super::flight::Flight;
use super::plan::{plan_write, EngineWrite, Piece, WritePlan};
use super::{batch_answer, RealClient};
use crate::client::Payload;
use crate::types::{ReplicaDesc, WriteOptions};

/// How far one value's write got.
pub(super) enum Sent {
    /// The master allocated nothing (PutStart failed).
    NotStarted(Error),
    /// Started, but its bytes did not all arrive: to be revoked.
    Failed(Error),
    /// Every replica written: to be published.
    Written,
}

impl Payload<'_> {
    /// The value as `(address, length)` parts, in order (most values have
    /// one or two: no allocation for them).
    fn parts(&self) -> SmallVec<[(usize, usize); 2]> {
        match self {
            Payload::Bytes(slices) => slices
                .iter()
                .map(|s| (s.as_ptr() as usize, s.len()))
                .collect(),
            Payload::Mem(parts) => parts.iter().copied().collect(),
        }
    }
}

pub(super) fn write_request(
    target_id: SegmentHandle,
    source: usize,
    remote: u64,
    len: usize,
) -> TransferRequest {
    TransferRequest {
        opcode: Opcode::Write,
        source,
        target_id,
        target_offset: remote,
        length: len,
    }
}

impl RealClient {
    /// What can be checked before bothering the master: the key, the length,
    /// room in the staging pool for plain bytes, registration of memory.
    pub(super) fn check_write(&self, key: &str, p: &Payload<'_>) -> Result<()> {
        validate_key(key)?;
        validate_value_len(p.len())?;
        match p {
            Payload::Bytes(_) => {
                let pool = self.staging_pool()?;
                // A value the staging pool can never hold is refused up front.
                if p.len() > pool.capacity() {
                    return Err(Error::new(
                        ErrorCode::INVALID_PARAMS,
                        format!(
                            "value of {} bytes exceeds the {} byte local buffer",
                            p.len(),
                            pool.capacity()
                        ),
                    ));
                }
                Ok(())
            }
            Payload::Mem(parts) => parts.iter().try_for_each(|&(a, l)| self.check_local(a, l)),
        }
    }

    /// Asks the master for space: the replicas to write, per key.
    pub(super) fn start_writes(
        &self,
        keys: &[String],
        payloads: &[&Payload<'_>],
        opts: &WriteOptions,
    ) -> Vec<Result<Vec<ReplicaDesc>>> {
        if let ([key], [p]) = (keys, payloads) {
            return vec![self.master.put_start(self.id, key, p.len(), opts)];
        }
        let lens: Vec<u64> = payloads.iter().map(|p| p.len()).collect();
        let answer = self.master.batch_put_start(self.id, keys, &lens, opts);
        batch_answer(answer, keys.len())
    }

    /// Plans every started value, then moves them: each value's engine
    /// requests join the batch as soon as they are ready (its value staged),
    /// so staging value i+1 overlaps sending value i.
    pub(super) fn send_values(
        &self,
        keys: &[String],
        payloads: &[&Payload<'_>],
        started: &[Result<Vec<ReplicaDesc>>],
    ) -> Vec<Sent> {
        let parts: Vec<SmallVec<[(usize, usize); 2]>> =
            payloads.iter().map(|p| p.parts()).collect();
        let mut sent = Vec::with_capacity(keys.len());
        let mut plans: Vec<Option<WritePlan<'_>>> = Vec::with_capacity(keys.len());
        for ((start, parts), p) in started.iter().zip(&parts).zip(payloads) {
            let caller_bytes = matches!(p, Payload::Bytes(_));
            match start {
                Err(e) => {
                    sent.push(Sent::NotStarted(e.clone()));
                    plans.push(None);
                }
                Ok(replicas) => match plan_write(parts, caller_bytes, replicas, &self.site) {
                    Ok(plan) => {
                        // Until a copy or a transfer fails.
                        sent.push(Sent::Written);
                        plans.push(Some(plan));
                    }
                    Err(e) => {
                        sent.push(Sent::Failed(e));
                        plans.push(None);
                    }
                },
            }
        }
        let capacity = plans.iter().flatten().map(WritePlan::max_requests).sum();
        let mut flight = Flight::new(&self.engine, capacity);
        let mut copies = Vec::new();
        let mut staged: Vec<StagingBuf> = Vec::new(); // held until the batch is done
        let mut owner: Vec<usize> = Vec::new(); // per submitted request: its value
        let (mut lens, mut sent_bytes) = (Vec::new(), 0);
        for (i, plan) in plans.iter().enumerate() {
            let Some(plan) = plan else { continue };
            match self.dispatch(plan, payloads[i], &mut staged) {
                Ok(requests) => {
                    let local = plan.memcpy.iter().map(|c| c.len).sum();
                    self.count_route(Route::Local, true, local);
                    copies.extend_from_slice(&plan.memcpy);
                    owner.extend(std::iter::repeat_n(i, requests.len()));
                    lens.extend(requests.iter().map(|r| r.length));
                    flight.submit(&requests);
                }
                Err(e) => sent[i] = Sent::Failed(e),
            }
        }
        for ((r, &i), len) in flight
            .finish_into_segment(&copies)
            .into_iter()
            .zip(&owner)
            .zip(&lens)
        {
            match (r, &sent[i]) {
                (Err(e), Sent::Written) => {
                    sent[i] = Sent::Failed(e.with_context(format!("writing {}", keys[i])));
                }
                (Err(_), _) => {}
                (Ok(_), _) => sent_bytes += len,
            }
        }
        self.count_route(Route::Engine, true, sent_bytes);
        drop(staged);
        sent
    }

    /// Sends one value's bytes to its peers: the shared-memory copies now,
    /// in this thread; returns the engine requests for the peers they did
    /// not serve (reading a staged copy of caller bytes, kept in `staged`).
    fn dispatch(
        &self,
        plan: &WritePlan<'_>,
        payload: &Payload<'_>,
        staged: &mut Vec<StagingBuf>,
    ) -> Result<Vec<TransferRequest>> {
        // Every peer's segment first: a value with an unknown peer fails
        // before any byte of it moves.
        let targets = plan
            .peers
            .iter()
            .map(|p| self.handle(p.endpoint))
            .collect::<Result<SmallVec<[SegmentHandle; 4]>>>()?;
        let mut staged_copy: Option<usize> = None;
        let mut requests = Vec::new();
        for (peer, &target) in plan.peers.iter().zip(&targets) {
            // Plain bytes go straight into a same-host peer's shared memory
            // when it serves the replica; only the rest need the engine.
            if let Some(shared) = &peer.shared {
                if self.write_shared(target, shared) {
                    let len = shared.iter().map(|p| p.len).sum();
                    self.count_route(Route::Shm, true, len);
                    continue;
                }
            }
            if requests.capacity() == 0 {
                requests.reserve(plan.max_requests());
            }
            match peer.engine {
                EngineWrite::Parts(ref pieces) => requests.extend(
                    pieces
                        .iter()
                        .map(|p| write_request(target, p.local, p.remote, p.len)),
                ),
                EngineWrite::Staged { len: 0, .. } => {}
                EngineWrite::Staged { remote, len } => {
                    // One staged copy serves every peer the engine writes.
                    let src = match staged_copy {
                        Some(addr) => addr,
                        None => {
                            let buf = self.stage_value(payload)?;
                            let addr = buf.addr();
                            staged.push(buf);
                            *staged_copy.insert(addr)
                        }
                    };
                    requests.push(write_request(target, src, remote, len));
                }
            }
        }
        Ok(requests)
    }

    /// Copies caller bytes into the staging pool, where the engine reads them.
    fn stage_value(&self, payload: &Payload<'_>) -> Result<StagingBuf> {
        let Payload::Bytes(slices) = payload else {
            return Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                "registered memory is sent as it is",
            ));
        };
        let mut buf = self.stage(payload.len())?;
        let dst = buf.as_mut_slice();
        let mut off = 0;
        for s in slices {
            dst[off..off + s.len()].copy_from_slice(s);
            off += s.len();
        }
        Ok(buf)
    }

    /// Writes `pieces` of caller bytes into a same-host peer's shared memory,
    /// in this thread. `false` when shared memory does not serve them all
    /// (the engine then writes the whole value).
    fn write_shared(&self, target: SegmentHandle, pieces: &[Piece]) -> bool {
        pieces.iter().all(|p| {
            // SAFETY: a shared piece's source is one of the caller's live
            // slices, `p.len` readable bytes (see `plan_write`).
            let copied = unsafe {
                self.engine
                    .copy_shared(target, Opcode::Write, p.local, p.remote, p.len)
            };
            copied.unwrap_or(false)
        })
    }

    /// Publishes the values that were written and revokes the rest; the
    /// outcome per key.
    pub(super) fn end_writes(&self, keys: &[String], sent: Vec<Sent>) -> Vec<Result<()>> {
        let mut results = Vec::with_capacity(keys.len());
        let (mut to_end, mut to_revoke) = (Vec::new(), Vec::new());
        for (i, s) in sent.into_iter().enumerate() {
            match s {
                Sent::NotStarted(e) => results.push(Err(e)),
                Sent::Failed(e) => {
                    results.push(Err(e));
                    to_revoke.push(i);
                }
                Sent::Written => {
                    results.push(Ok(()));
                    to_end.push(i);
                }
            }
        }
        if !to_end.is_empty() {
            // Every key written (the usual case): no copies of the keys.
            let end_keys: Cow<'_, [String]> = if to_end.len() == keys.len() {
                Cow::Borrowed(keys)
            } else {
                Cow::Owned(to_end.iter().map(|&i| keys[i].clone()).collect())
            };
            let ended = match &*end_keys {
                [key] => vec![self.master.put_end(self.id, key)],
                _ => batch_answer(
                    self.master.batch_put_end(self.id, &end_keys),
                    end_keys.len(),
                ),
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
            let outcome = match revoke_keys.as_slice() {
                [key] => self.master.put_revoke(self.id, key),
                _ => self
                    .master
                    .batch_put_revoke(self.id, &revoke_keys)
                    .map(|_| ()),
            };
            if let Err(e) = outcome {
                // The master drops puts that never finish on its own.
                tracing::warn!(error = %e, "put_revoke failed");
            }
        }
        results
    }
}
