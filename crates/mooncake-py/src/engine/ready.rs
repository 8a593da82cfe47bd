//! An initialized engine and the bookkeeping the Python API needs: cached
//! peer segments, memory known to be valid, local ranges adopted for the
//! duration of a transfer, and async batches by the id Python holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode};
use mooncake_tent::TentEngine;
use mooncake_transfer::{
    BatchId, Notify, Opcode, SegmentHandle, TransferEngine, TransferRequest, TransferState,
};
use parking_lot::Mutex;

use super::tent;
use crate::codes;
use crate::mem::{self, Access};

/// An initialized engine plus the bookkeeping the Python API needs.
pub(super) struct Ready {
    /// The classic engine (under TENT, its first path's).
    pub(super) engine: TransferEngine,
    /// `MC_USE_TENT`: transfers and registrations go through TENT.
    tent: Option<TentEngine>,
    tent_batches: Mutex<HashMap<u64, Arc<tent::Batch>>>,
    /// Segment handles by target name, so each peer is resolved once.
    segments: Mutex<HashMap<String, SegmentHandle>>,
    /// Memory known to be valid: registered by the script (after a mapping
    /// check) or allocated by the engine. addr -> length.
    pub(super) regions: Mutex<mem::Regions>,
    /// Async batches by the id returned to Python (never 0, which means
    /// failure), with the local ranges adopted for them.
    batches: Mutex<HashMap<u64, (BatchId, Vec<usize>)>>,
    /// Unregistered local ranges adopted for running transfers: addr ->
    /// (length, users). See [`Ready::adopt`].
    adopted: Mutex<HashMap<usize, (usize, usize)>>,
    next_batch: AtomicU64,
}

impl Ready {
    pub(super) fn new(engine: TransferEngine) -> Ready {
        Ready::with(engine, None)
    }

    pub(super) fn new_tent(t: TentEngine) -> Ready {
        Ready::with(t.primary().clone(), Some(t))
    }

    fn with(engine: TransferEngine, tent: Option<TentEngine>) -> Ready {
        Ready {
            engine,
            tent,
            tent_batches: Mutex::new(HashMap::new()),
            segments: Mutex::new(HashMap::new()),
            regions: Mutex::new(mem::Regions::default()),
            batches: Mutex::new(HashMap::new()),
            adopted: Mutex::new(HashMap::new()),
            next_batch: AtomicU64::new(1),
        }
    }

    pub(super) fn segment(&self, name: &str) -> Result<SegmentHandle, Error> {
        if let Some(h) = self.segments.lock().get(name) {
            return Ok(*h);
        }
        let h = match &self.tent {
            Some(t) => t.open_segment(name)?,
            None => self.engine.open_segment(name)?,
        };
        self.segments.lock().insert(name.to_owned(), h);
        Ok(h)
    }

    /// Drops a cached handle after a failure, so a restarted peer is resolved again.
    fn forget(&self, name: &str) {
        if let Some(h) = self.segments.lock().remove(name) {
            if self.tent.is_none() {
                let _ = self.engine.close_segment(h);
            }
        }
    }

    /// True when `addr..addr+len` lies inside one known region.
    fn known(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.regions
            .lock()
            .containing(addr)
            .is_some_and(|(start, rlen)| end <= start + rlen)
    }

    pub(super) fn usable(&self, addr: usize, len: usize, access: Access) -> bool {
        self.known(addr, len) || mem::accessible(addr, len, access)
    }

    /// One request per range, to `target`'s segment.
    pub(super) fn requests(
        &self,
        target: &str,
        op: Opcode,
        ranges: &Ranges,
    ) -> Result<Vec<TransferRequest>, Error> {
        let Ranges {
            locals,
            remotes,
            lens,
        } = ranges;
        if locals.len() != remotes.len() || locals.len() != lens.len() {
            return Err(Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                "buffers, peer_buffer_addresses and lengths have different sizes",
            ));
        }
        let target_id = self.segment(target)?;
        Ok((0..locals.len())
            .map(|i| TransferRequest {
                opcode: op,
                source: locals[i],
                target_id,
                target_offset: remotes[i],
                length: lens[i],
            })
            .collect())
    }

    /// Registers, for the duration of a transfer, local ranges the script never
    /// registered: the reference's tcp transport reads and writes any valid
    /// local address, so scripts pass plain numpy or ctypes buffers. Ranges
    /// that are not valid memory are left alone (the engine rejects them).
    /// Returns the adopted addresses, to hand back to [`Ready::release`].
    fn adopt(&self, requests: &[TransferRequest]) -> Vec<usize> {
        let mut taken = Vec::new();
        for r in requests {
            if r.length == 0 || self.known(r.source, r.length) {
                continue;
            }
            {
                let mut adopted = self.adopted.lock();
                if let Some((len, users)) = adopted.get_mut(&r.source) {
                    if *len == r.length {
                        *users += 1;
                        taken.push(r.source);
                    }
                    continue;
                }
            }
            // Reading local memory for a write, filling it for a read.
            let need = match r.opcode {
                Opcode::Write => Access::Read,
                Opcode::Read => Access::Write,
            };
            if !mem::accessible(r.source, r.length, need) {
                continue;
            }
            if self
                .engine
                .register_local_memory(r.source, r.length, "*", false)
                .is_ok()
            {
                self.adopted.lock().insert(r.source, (r.length, 1));
                taken.push(r.source);
            }
        }
        taken
    }

    fn release(&self, taken: Vec<usize>) {
        let mut done = Vec::new();
        {
            let mut adopted = self.adopted.lock();
            for a in taken {
                if let Some((_, users)) = adopted.get_mut(&a) {
                    *users -= 1;
                    if *users == 0 {
                        adopted.remove(&a);
                        done.push(a);
                    }
                }
            }
        }
        if !done.is_empty() {
            let _ = self.engine.unregister_local_memory_batch(&done);
        }
    }

    /// Runs `requests` to completion; a failure drops the cached handle of
    /// `target`.
    pub(super) fn transfer_sync(
        &self,
        target: &str,
        requests: &[TransferRequest],
        notify: Option<Notify>,
    ) -> Result<(), Error> {
        if requests.is_empty() {
            return Ok(());
        }
        let res =
            match &self.tent {
                Some(t) => tent::transfer(t, requests, |a, l, acc| self.usable(a, l, acc))
                    .and_then(|()| match notify {
                        Some(n) => self
                            .engine
                            .send_notify(self.engine.open_segment(target)?, n),
                        None => Ok(()),
                    }),
                None => {
                    let taken = self.adopt(requests);
                    let res = self.transfer_registered(requests, notify);
                    self.release(taken);
                    res
                }
            };
        if res.is_err() {
            self.forget(target);
        }
        res
    }

    /// Moves the bytes, then delivers `notify` (acknowledged by the peer, so
    /// it is in the peer's `get_notifies` when this returns, as in the reference).
    fn transfer_registered(
        &self,
        requests: &[TransferRequest],
        notify: Option<Notify>,
    ) -> Result<(), Error> {
        self.engine.transfer_sync(requests)?;
        match notify {
            Some(n) => self.engine.send_notify(requests[0].target_id, n),
            None => Ok(()),
        }
    }

    /// Starts `requests` as a batch and returns its id; a failure drops the
    /// cached handle of `target`.
    pub(super) fn submit(&self, target: &str, requests: &[TransferRequest]) -> Result<u64, Error> {
        if let Some(t) = &self.tent {
            for r in requests {
                if r.length > 0 && !self.usable(r.source, r.length, tent::access(r.opcode)) {
                    return Err(Error::new(
                        ErrorCode::ERR_INVALID_ARGUMENT,
                        format!(
                            "{:#x}+{} is not valid memory of this process",
                            r.source, r.length
                        ),
                    ));
                }
            }
            let id = self.next_batch.fetch_add(1, Ordering::Relaxed);
            let batch = tent::Batch::spawn(t.clone(), requests.to_vec());
            self.tent_batches.lock().insert(id, batch);
            return Ok(id);
        }
        let batch = match self.engine.allocate_batch(requests.len().max(1)) {
            Ok(b) => b,
            Err(e) => {
                self.forget(target);
                return Err(e);
            }
        };
        let taken = self.adopt(requests);
        if let Err(e) = self.engine.submit(batch, requests) {
            let _ = self.engine.free_batch(batch);
            self.release(taken);
            self.forget(target);
            return Err(e);
        }
        let id = self.next_batch.fetch_add(1, Ordering::Relaxed);
        self.batches.lock().insert(id, (batch, taken));
        Ok(id)
    }

    /// 1 done, 0 running, -1 failed (or unknown id), -2 timed out. A finished
    /// batch is freed, as in the reference.
    pub(super) fn check(&self, id: u64) -> i32 {
        if let Some(b) = self.tent_batch(id) {
            return match b.poll() {
                None => 0,
                Some(ok) => {
                    self.tent_batches.lock().remove(&id);
                    if ok {
                        1
                    } else {
                        -1
                    }
                }
            };
        }
        let Some(batch) = self.batches.lock().get(&id).map(|b| b.0) else {
            return -1;
        };
        let code = match self.engine.batch_status(batch) {
            Ok(s) => match codes::batch_state(s.state) {
                Some(c) => c,
                None => return 0,
            },
            Err(_) => -1,
        };
        self.finish(id, batch);
        code
    }

    /// Blocks until batch `id` finishes; true when every request completed.
    pub(super) fn wait(&self, id: u64) -> bool {
        if let Some(b) = self.tent_batch(id) {
            let ok = b.wait();
            self.tent_batches.lock().remove(&id);
            return ok;
        }
        let Some(batch) = self.batches.lock().get(&id).map(|b| b.0) else {
            return false;
        };
        let ok =
            matches!(self.engine.wait_batch(batch), Ok(s) if s.state == TransferState::Completed);
        self.finish(id, batch);
        ok
    }

    fn tent_batch(&self, id: u64) -> Option<Arc<tent::Batch>> {
        self.tent_batches.lock().get(&id).cloned()
    }

    /// Registers with every path under TENT, else with the engine.
    pub(super) fn register_batch(
        &self,
        pairs: &[(usize, usize)],
        location: &str,
    ) -> Result<(), Error> {
        let Some(t) = &self.tent else {
            return self.engine.register_local_memory_batch(pairs, location);
        };
        for (i, &(a, l)) in pairs.iter().enumerate() {
            if let Err(e) = t.register_local_memory(a, l, location, true) {
                for &(undo, _) in &pairs[..i] {
                    let _ = t.unregister_local_memory(undo);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    pub(super) fn allocate_managed(&self, len: usize) -> Result<usize, Error> {
        match &self.tent {
            Some(t) => t.allocate_managed_buffer(len),
            None => self.engine.allocate_managed_buffer(len),
        }
    }

    pub(super) fn free_managed(&self, addr: usize, len: usize) -> Result<(), Error> {
        match &self.tent {
            Some(t) => t.free_managed_buffer(addr, len),
            None => self.engine.free_managed_buffer(addr, len),
        }
    }

    pub(super) fn unregister(&self, addrs: &[usize]) -> Result<(), Error> {
        match &self.tent {
            Some(t) => addrs
                .iter()
                .map(|&a| t.unregister_local_memory(a))
                .fold(Ok(()), Result::and),
            None => self.engine.unregister_local_memory_batch(addrs),
        }
    }

    fn finish(&self, id: u64, batch: BatchId) {
        let entry = self.batches.lock().remove(&id);
        let _ = self.engine.free_batch(batch);
        if let Some((_, taken)) = entry {
            self.release(taken);
        }
    }

    pub(super) fn register(&self, addr: usize, len: usize, location: &str) -> Result<(), Error> {
        if len == 0 {
            return Err(Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                "zero-length memory region",
            ));
        }
        if !mem::accessible(addr, len, Access::Write) {
            return Err(Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                format!("{addr:#x}+{len} is not writable memory of this process"),
            ));
        }
        self.register_batch(&[(addr, len)], location)?;
        self.regions.lock().insert(addr, len);
        Ok(())
    }
}

/// Local buffers, peer addresses and lengths of one transfer call, pairwise.
pub(super) struct Ranges {
    pub(super) locals: Vec<usize>,
    pub(super) remotes: Vec<u64>,
    pub(super) lens: Vec<usize>,
}
