//! The engine batch lifecycle: allocate, submit as requests are ready, do
//! this process's own copies while the engine works, wait, report, free.

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{BatchId, TransferEngine, TransferRequest, TransferState};

use super::plan::Memcpy;

/// An engine batch that requests join as they are planned, so the engine
/// moves early requests while later ones are still being prepared (a put of
/// many `bytes` values stages value i+1 while value i is on the wire).
/// [`Flight::finish`] does the local copies, waits, and reports one outcome
/// per submitted request, in submission order.
pub(super) struct Flight<'e> {
    engine: &'e TransferEngine,
    /// `Err`: the batch could not be allocated; every request fails with it.
    batch: Result<Option<BatchId>>,
    /// Per request: its index in the batch, or why it never joined.
    joined: Vec<Result<usize>>,
    in_batch: usize,
    /// A request was canceled: its batch is released without waiting for
    /// it to drain (only reads are canceled; their late bytes are dropped).
    canceled: std::cell::Cell<bool>,
}

impl<'e> Flight<'e> {
    /// Room for `capacity` requests (an upper bound; 0 allocates nothing).
    pub(super) fn new(engine: &'e TransferEngine, capacity: usize) -> Self {
        Self::with_timeout(engine, capacity, None)
    }

    /// [`Flight::new`] whose requests time out after `timeout` (`None`:
    /// the engine's transfer timeout).
    pub(super) fn with_timeout(
        engine: &'e TransferEngine,
        capacity: usize,
        timeout: Option<std::time::Duration>,
    ) -> Self {
        let batch = match (capacity, timeout) {
            (0, _) => Ok(None),
            (n, None) => engine.allocate_batch(n).map(Some),
            (n, Some(t)) => engine.allocate_batch_with_timeout(n, t).map(Some),
        };
        Flight {
            engine,
            batch,
            joined: Vec::new(),
            in_batch: 0,
            canceled: std::cell::Cell::new(false),
        }
    }

    /// Runs `requests` as one batch and `copies` while it is in flight.
    /// Returns one outcome per request.
    pub(super) fn run(
        engine: &TransferEngine,
        requests: &[TransferRequest],
        copies: &[Memcpy],
    ) -> Vec<Result<()>> {
        let mut flight = Flight::new(engine, requests.len());
        flight.submit(requests);
        flight.finish(copies)
    }

    /// Starts `requests` now; a refused submission fails only them.
    pub(super) fn submit(&mut self, requests: &[TransferRequest]) {
        if requests.is_empty() {
            return;
        }
        let outcome = match &self.batch {
            Ok(Some(batch)) => self.engine.submit(*batch, requests),
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
    pub(super) fn finish(self, copies: &[Memcpy]) -> Vec<Result<()>> {
        self.finish_with(copies, false)
    }

    /// [`Self::finish`] for copies into this process's own segment: they
    /// are read later, so they bypass the cache (`copy_to_segment`).
    pub(super) fn finish_into_segment(self, copies: &[Memcpy]) -> Vec<Result<()>> {
        self.finish_with(copies, true)
    }

    /// Runs this process's own `copies` now (the batch goes on meanwhile).
    pub(super) fn copy(&self, copies: &[Memcpy]) {
        run_copies(copies, false);
    }

    /// Waits until every request settled or `deadline`: whether all did.
    pub(super) fn wait_until(&self, deadline: std::time::Instant) -> bool {
        let Ok(Some(batch)) = self.batch else {
            return true;
        };
        if self.in_batch == 0 {
            return true;
        }
        poll_batch(self.engine, batch);
        self.engine
            .wait_batch_until(batch, deadline)
            .unwrap_or(true)
    }

    /// Request `i`'s outcome once it settled; `None` while it runs.
    pub(super) fn outcome(&self, i: usize) -> Option<Result<()>> {
        let at = match &self.joined[i] {
            Ok(at) => *at,
            Err(e) => return Some(Err(e.clone())),
        };
        let Ok(Some(batch)) = self.batch else {
            return Some(Err(Error::new(ErrorCode::INTERNAL_ERROR, "no batch")));
        };
        match self.engine.transfer_status(batch, at) {
            Ok(s) if s.state == TransferState::Waiting => None,
            Ok(s) => Some(settled(s)),
            Err(e) => Some(Err(e)),
        }
    }

    /// Cancels request `i` if it runs: on return it writes no more local
    /// memory (see `TransferEngine::cancel_transfer`).
    pub(super) fn cancel(&self, i: usize) {
        if let (Ok(Some(batch)), Ok(at)) = (&self.batch, &self.joined[i]) {
            self.canceled.set(true);
            if let Err(e) = self.engine.cancel_transfer(*batch, *at) {
                tracing::warn!("canceling a read: {e}");
            }
        }
    }

    fn finish_with(self, copies: &[Memcpy], into_segment: bool) -> Vec<Result<()>> {
        run_copies(copies, into_segment);
        let Ok(Some(batch)) = self.batch else {
            return self.joined.into_iter().map(|r| r.map(|_| ())).collect();
        };
        let engine = self.engine;
        if self.in_batch > 0 {
            poll_batch(engine, batch);
            let _ = engine.wait_batch(batch);
        }
        let out = self
            .joined
            .into_iter()
            .map(|slot| {
                let i = slot?;
                engine.transfer_status(batch, i).and_then(settled)
            })
            .collect();
        // Requests that timed out may still be draining: freed later then.
        if self.canceled.get() {
            engine.release_read_batch(batch);
        } else {
            engine.release_batch(batch);
        }
        out
    }
}

/// A settled request's outcome.
fn settled(s: mooncake_transfer::TransferStatus) -> Result<()> {
    match s.state {
        TransferState::Completed => Ok(()),
        state => Err(Error::new(
            ErrorCode::TRANSFER_FAIL,
            format!(
                "transfer {:?}{}",
                state,
                s.error.map(|c| format!(" ({c})")).unwrap_or_default()
            ),
        )),
    }
}

/// Copies within this process (`copy_to_segment` when `into_segment`).
pub(super) fn run_copies(copies: &[Memcpy], into_segment: bool) {
    for c in copies {
        let (dst, src) = (c.dst as *mut u8, c.src as *const u8);
        // SAFETY: every copy's source was checked with `check_local` (or is
        // a live slice, a staging buffer or a leased replica in our own
        // segment) and its destination lies inside this process's own
        // segment or a checked caller buffer; ranges of distinct copies
        // never overlap because each belongs to a distinct allocation.
        unsafe {
            if into_segment {
                mooncake_transfer::memcopy::copy_to_segment(dst, src, c.len)
            } else {
                std::ptr::copy_nonoverlapping(src, dst, c.len)
            }
        };
    }
}

/// Polls a submitted batch for a short window before `wait_batch` puts
/// this thread to sleep: small transfers finish within microseconds, and
/// being woken costs more than that on a VM (see `rpc::poll`).
fn poll_batch(engine: &TransferEngine, batch: BatchId) {
    // Not while the cores are contended (see `rpc::poll`).
    let Some(watch) = crate::rpc::poll::SpinWatch::start() else {
        return;
    };
    let window = crate::rpc::poll::client_window();
    let start = std::time::Instant::now();
    let mut spins = 0u32;
    while start.elapsed() < window {
        match engine.batch_status(batch) {
            Ok(s) if s.state == TransferState::Waiting => {}
            _ => break,
        }
        spins += 1;
        if spins.is_multiple_of(16) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    watch.end();
}
