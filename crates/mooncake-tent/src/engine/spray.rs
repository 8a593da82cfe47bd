//! `transfer_sync`: each request is checked and given its transports
//! (selector), a shared-memory one is copied in place, the rest are cut
//! into slices which the dispatch loop sprays over the peer's usable paths
//! (scheduler). A failed slice goes back to the queue and its path out of
//! rotation (health); a slice far past its predicted time takes its path
//! out while it finishes; paths out of rotation are probed back. The call
//! fails only on a permanent error, when a slice has failed over too often,
//! or when a peer has had no usable path for the transfer timeout.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, RecvTimeoutError};
use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{Opcode, TransferRequest};

use super::peer::{PathsState, Peer};
use super::worker::{Done, Job};
use super::{Inner, TentEngine};
use crate::scheduler::Ticket;
use crate::selector::{select, Offer, TransportKind};

/// How often the loop looks at stalls and probes while waiting.
const TICK: Duration = Duration::from_millis(20);

struct Slice {
    peer: Arc<Peer>,
    request: TransferRequest,
    attempts: u32,
    /// The path it last failed on (for the failover metric).
    failed_on: Option<usize>,
}

struct Flight {
    slice: Slice,
    ticket: Ticket,
    stall_at: Instant,
    flagged: bool,
}

/// Errors a retry on another path cannot fix.
fn permanent(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED | ErrorCode::ERR_INVALID_ARGUMENT
    )
}

impl TentEngine {
    /// Moves `requests` (local memory registered with this engine,
    /// `target_id` from [`TentEngine::open_segment`]) and returns once all
    /// are done. Every request is checked before anything moves.
    pub fn transfer_sync(&self, requests: &[TransferRequest]) -> Result<()> {
        for (i, r) in requests.iter().enumerate() {
            if r.length > 0 && !self.inner.is_registered(r.source, r.length) {
                return Err(Error::new(
                    ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                    format!(
                        "request {i}: local range {:#x}+{} is not registered",
                        r.source, r.length
                    ),
                ));
            }
        }
        self.inner.run(requests)
    }

    /// Like [`Self::transfer_sync`], but local memory need not be
    /// registered: such a request is staged through a registered host
    /// buffer (copied in before a write, out after a read).
    ///
    /// # Safety
    /// Each request's local range must be valid for reads (`Write`) or
    /// writes (`Read`) for the duration of the call.
    pub unsafe fn transfer_sync_staged(&self, requests: &[TransferRequest]) -> Result<()> {
        let mut staged: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut reqs = requests.to_vec();
        for (i, r) in reqs.iter_mut().enumerate() {
            if r.length == 0 || self.inner.is_registered(r.source, r.length) {
                continue;
            }
            let mut buf = vec![0u8; r.length];
            if r.opcode == Opcode::Write {
                // SAFETY: the caller promises the range is readable.
                unsafe {
                    std::ptr::copy_nonoverlapping(r.source as *const u8, buf.as_mut_ptr(), r.length)
                };
            }
            r.source = buf.as_mut_ptr() as usize;
            staged.push((i, buf));
        }
        for (_, buf) in &staged {
            if let Err(e) =
                self.register_local_memory(buf.as_ptr() as usize, buf.len(), "cpu:0", false)
            {
                for (_, b) in &staged {
                    let _ = self.unregister_local_memory(b.as_ptr() as usize);
                }
                return Err(e);
            }
        }
        let result = self.inner.run(&reqs);
        for (i, buf) in &staged {
            let _ = self.unregister_local_memory(buf.as_ptr() as usize);
            let r = &requests[*i];
            if result.is_ok() && r.opcode == Opcode::Read {
                // SAFETY: the caller promises the range is writable.
                unsafe {
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), r.source as *mut u8, r.length)
                };
            }
        }
        result
    }
}

impl Inner {
    fn run(&self, requests: &[TransferRequest]) -> Result<()> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::new(ErrorCode::INTERNAL_ERROR, "engine is shut down"));
        }
        // Check and plan everything before anything moves.
        let mut plans = Vec::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            if r.length == 0 {
                continue;
            }
            let peer = self.peer(r.target_id)?;
            let shared = peer
                .find_buffer(self, r.target_offset, r.length as u64)
                .map_err(|e| e.with_context(format!("request {i}")))?;
            let offer = Offer {
                same_host: peer.same_host,
                target_shared: shared,
                tcp_paths: peer.paths.len(),
                local_registered: true,
            };
            let choices = select(&self.config.transports, &offer);
            if choices.is_empty() {
                return Err(Error::new(
                    ErrorCode::ERR_INVALID_ARGUMENT,
                    format!("request {i}: no transport reaches segment {}", peer.name),
                ));
            }
            plans.push((peer, *r, choices));
        }
        let mut slices = VecDeque::new();
        for (peer, r, choices) in plans {
            let write = r.opcode == Opcode::Write;
            let mut done = false;
            for c in &choices {
                match c.transport {
                    TransportKind::Shm => {
                        let start = Instant::now();
                        // SAFETY: the local range is registered memory,
                        // which its owner keeps valid (checked above).
                        let copied = unsafe {
                            self.locals[0].copy_shared(
                                peer.primary,
                                r.opcode,
                                r.source,
                                r.target_offset,
                                r.length,
                            )
                        };
                        match copied {
                            Ok(true) => {
                                let us = start.elapsed().as_micros() as u64;
                                self.metrics.completed(
                                    TransportKind::Shm,
                                    write,
                                    r.length as u64,
                                    us,
                                );
                                done = true;
                                break;
                            }
                            Ok(false) => {}
                            Err(e) => {
                                self.metrics.failed(TransportKind::Shm, write);
                                tracing::debug!("TENT: shm copy failed, next transport: {e}");
                            }
                        }
                    }
                    TransportKind::Tcp => {
                        let size = self.config.slice_size;
                        let mut off = 0;
                        while off < r.length {
                            let len = size.min(r.length - off);
                            slices.push_back(Slice {
                                peer: peer.clone(),
                                request: TransferRequest {
                                    source: r.source + off,
                                    target_offset: r.target_offset + off as u64,
                                    length: len,
                                    ..r
                                },
                                attempts: 0,
                                failed_on: None,
                            });
                            off += len;
                        }
                        done = true;
                        break;
                    }
                }
            }
            if !done {
                return Err(Error::new(
                    ErrorCode::TRANSFER_FAIL,
                    format!("no transport carried a request to {}", peer.name),
                ));
            }
        }
        if slices.is_empty() {
            return Ok(());
        }
        self.spray(slices)
    }

    fn spray(&self, mut pending: VecDeque<Slice>) -> Result<()> {
        let (tx, rx) = unbounded::<Done>();
        let mut inflight: HashMap<usize, Flight> = HashMap::new();
        let mut next_id = 0usize;
        let mut failure: Option<Error> = None;
        let mut stuck_since: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if failure.is_none() {
                let mut k = 0;
                // Peers with no room this round: their other slices wait too.
                let mut full: Vec<*const Peer> = Vec::new();
                while k < pending.len() {
                    let peer = Arc::as_ptr(&pending[k].peer);
                    if full.contains(&peer) {
                        k += 1;
                        continue;
                    }
                    match self.dispatch(&pending[k], next_id, &tx) {
                        Some((ticket, stall_after)) => {
                            let slice = pending.remove(k).expect("index in range");
                            if let Some(from) = slice.failed_on {
                                let peer = &slice.peer;
                                self.metrics.failover(
                                    &peer.paths[from].endpoint,
                                    &peer.paths[ticket.path].endpoint,
                                );
                            }
                            inflight.insert(
                                next_id,
                                Flight {
                                    slice,
                                    ticket,
                                    stall_at: now + stall_after,
                                    flagged: false,
                                },
                            );
                            next_id += 1;
                        }
                        None => {
                            full.push(peer);
                            k += 1;
                        }
                    }
                }
            }
            if inflight.is_empty() {
                if pending.is_empty() || failure.is_some() {
                    break;
                }
                // Every path of some peer is out of rotation.
                let since = *stuck_since.get_or_insert(now);
                if now.duration_since(since) >= self.config.transfer_timeout {
                    let peer = &pending[0].peer.name;
                    failure = Some(Error::new(
                        ErrorCode::TRANSFER_FAIL,
                        format!(
                            "no path to {peer} for {:?}: every path failed",
                            self.config.transfer_timeout
                        ),
                    ));
                    break;
                }
            } else {
                stuck_since = None;
            }
            self.probe_peers(&pending, &inflight, now);
            match rx.recv_timeout(TICK) {
                Ok(done) => {
                    self.finish(done, &mut inflight, &mut pending, &mut failure);
                    while let Ok(more) = rx.try_recv() {
                        self.finish(more, &mut inflight, &mut pending, &mut failure);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => unreachable!("the loop holds a sender"),
            }
            self.flag_stalls(&mut inflight, Instant::now());
        }
        failure.map_or(Ok(()), Err)
    }

    /// Sends `slice` to the best usable path of its peer, if any has room.
    fn dispatch(
        &self,
        slice: &Slice,
        id: usize,
        tx: &crossbeam_channel::Sender<Done>,
    ) -> Option<(Ticket, Duration)> {
        let peer = &slice.peer;
        let mut st = peer.state.lock();
        let PathsState { sched, health } = &mut *st;
        let ticket = sched.pick(slice.request.length as u64, |p| health[p].usable())?;
        let path = &peer.paths[ticket.path];
        let Some(handle) = *path.handle.lock() else {
            sched.failed(ticket);
            return None;
        };
        let stall_after = sched
            .stall_after(
                ticket.path,
                ticket.ahead,
                self.config.stall_factor,
                self.config.stall_floor,
            )
            .min(self.config.stall_timeout);
        drop(st);
        let job = Job {
            id,
            engine: path.engine.clone(),
            request: TransferRequest {
                target_id: handle,
                ..slice.request
            },
            reply: tx.clone(),
        };
        if path.queue.send(job).is_err() {
            // The path's workers are gone; never expected while it exists.
            let mut st = peer.state.lock();
            st.sched.failed(ticket);
            st.health[ticket.path].stalled(Instant::now());
            return None;
        }
        Some((ticket, stall_after))
    }

    fn finish(
        &self,
        done: Done,
        inflight: &mut HashMap<usize, Flight>,
        pending: &mut VecDeque<Slice>,
        failure: &mut Option<Error>,
    ) {
        let Some(mut f) = inflight.remove(&done.id) else {
            return;
        };
        let peer = f.slice.peer.clone();
        let path = f.ticket.path;
        let write = f.slice.request.opcode == Opcode::Write;
        let mut st = peer.state.lock();
        let was_up = st.health[path].usable();
        match done.result {
            Ok(()) => {
                st.sched.completed(f.ticket, done.elapsed);
                st.health[path].success();
                drop(st);
                if !was_up {
                    tracing::info!(
                        "TENT: path {} of {} back",
                        peer.paths[path].endpoint,
                        peer.name
                    );
                    peer.report(path, true);
                }
                let us = done.elapsed.as_micros() as u64;
                self.metrics.completed(
                    TransportKind::Tcp,
                    write,
                    f.slice.request.length as u64,
                    us,
                );
            }
            Err(code) => {
                st.sched.failed(f.ticket);
                let tripped = st.health[path].failure(Instant::now());
                drop(st);
                self.metrics.failed(TransportKind::Tcp, write);
                if tripped {
                    tracing::warn!(
                        "TENT: path {} of {} out of rotation ({code:?})",
                        peer.paths[path].endpoint,
                        peer.name
                    );
                    peer.report(path, false);
                }
                f.slice.attempts += 1;
                if permanent(code) {
                    failure.get_or_insert(Error::new(code, format!("slice to {}", peer.name)));
                } else if f.slice.attempts > self.config.max_failover_attempts {
                    failure.get_or_insert(Error::new(
                        code,
                        format!(
                            "slice to {} failed {} times (max_failover_attempts)",
                            peer.name, f.slice.attempts
                        ),
                    ));
                } else {
                    self.metrics.slice_retried();
                    f.slice.failed_on = Some(path);
                    pending.push_front(f.slice);
                }
            }
        }
    }

    /// A slice far past its predicted time takes its path out of rotation
    /// (new slices go elsewhere) while it finishes or times out.
    fn flag_stalls(&self, inflight: &mut HashMap<usize, Flight>, now: Instant) {
        for f in inflight.values_mut() {
            if f.flagged || now < f.stall_at {
                continue;
            }
            f.flagged = true;
            let peer = &f.slice.peer;
            let out = peer.state.lock().health[f.ticket.path].stalled(now);
            if out {
                tracing::warn!(
                    "TENT: path {} of {} stalled, out of rotation",
                    peer.paths[f.ticket.path].endpoint,
                    peer.name
                );
                peer.report(f.ticket.path, false);
            }
        }
    }

    fn probe_peers(
        &self,
        pending: &VecDeque<Slice>,
        inflight: &HashMap<usize, Flight>,
        now: Instant,
    ) {
        let mut seen: Vec<*const Peer> = Vec::new();
        let peers = pending
            .iter()
            .map(|s| &s.peer)
            .chain(inflight.values().map(|f| &f.slice.peer));
        for p in peers {
            if !seen.contains(&Arc::as_ptr(p)) {
                seen.push(Arc::as_ptr(p));
                p.probe_due(self, now);
            }
        }
    }
}
