//! Submission: every request validated before anything moves, then routed
//! to the first transport that serves it (own segment → memcpy; same host
//! with a shared buffer → mapped memcpy; otherwise TCP), grouped per route.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use mooncake_common::{Error, ErrorCode, Result};

use super::{BatchId, Inner, Opcode, SegmentHandle, TransferEngine, TransferRequest};
use crate::batch::IdleHook;
use crate::segment::SegmentDesc;
use crate::transport::{OpenSegment, Route, Transport, Work};

/// A segment named by a submission, with what the submission uses of it.
struct Target {
    seg: Arc<OpenSegment>,
    desc: Arc<SegmentDesc>,
    /// `(index in the transport list, route)`, in preference order.
    routes: Vec<(usize, Box<dyn Route>)>,
}

impl TransferEngine {
    /// Starts `requests`. All are validated first: on error nothing starts.
    pub fn submit(&self, batch: BatchId, requests: &[TransferRequest]) -> Result<()> {
        self.inner.submit(batch, requests, None)
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
            self.inner.metrics.routed(1, 1, len);
        }
        Ok(done)
    }
}

impl Inner {
    pub(super) fn submit(
        &self,
        batch_id: BatchId,
        requests: &[TransferRequest],
        on_idle: Option<IdleHook>,
    ) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::new(ErrorCode::INTERNAL_ERROR, "engine is shut down"));
        }
        let batch = self.batch(batch_id)?;
        self.metrics.submitted(batch_id);
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
            let bytes = work.iter().map(|w| w.len).sum();
            self.metrics.routed(*transport, work.len(), bytes);
            route.submit(work);
        }
        Ok(())
    }
}
