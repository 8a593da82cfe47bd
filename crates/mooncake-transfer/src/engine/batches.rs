//! Batches: allocation, status, waiting, freeing, and `transfer_sync`,
//! whose batches still draining after a timeout are parked and reaped later.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use mooncake_common::{Error, ErrorCode, Result};

use super::{invalid, BatchId, Inner, TransferEngine, TransferRequest};
use crate::batch::{Batch, TransferState, TransferStatus};

/// How long [`TransferEngine::cancel_transfer`] lets a response that is
/// landing finish before shutting its connections: ample for a live peer,
/// and a stalled one never finishes.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

#[derive(Default)]
pub(super) struct Batches {
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

impl TransferEngine {
    /// A batch that accepts up to `batch_size` requests in total.
    pub fn allocate_batch(&self, batch_size: usize) -> Result<BatchId> {
        self.allocate_batch_with_timeout(batch_size, self.inner.config.transfer_timeout)
    }

    /// [`allocate_batch`](Self::allocate_batch) whose requests time out
    /// after `timeout` (at most the engine's transfer timeout) rather than
    /// the transfer timeout: for reads from a peer believed stalled.
    pub fn allocate_batch_with_timeout(
        &self,
        batch_size: usize,
        timeout: std::time::Duration,
    ) -> Result<BatchId> {
        if batch_size == 0 {
            return Err(invalid("batch size 0"));
        }
        let id = self.inner.next_batch.fetch_add(1, Ordering::Relaxed);
        let timeout = timeout.min(self.inner.config.transfer_timeout);
        let batch = Batch::new(batch_size, timeout);
        self.inner.add_batch(id, batch);
        Ok(id)
    }

    /// Status of request `task_id` (index in submission order) of `batch`.
    pub fn transfer_status(&self, batch: BatchId, task_id: usize) -> Result<TransferStatus> {
        self.inner
            .batch(batch)?
            .task_status(task_id, Instant::now())
    }

    /// Aggregate status of the batch.
    pub fn batch_status(&self, batch: BatchId) -> Result<TransferStatus> {
        let status = self.inner.batch(batch)?.status(Instant::now());
        self.inner.seen(batch, &status);
        Ok(status)
    }

    /// Blocks (no spinning) until every request of the batch is finished or timed out.
    ///
    /// A request reported `Timeout` (here or by a status call) no longer
    /// touches local memory: the report waits for a response being written
    /// into it to end. A timeout does not undo a request, though: bytes of a
    /// write already sent may still land at the target.
    pub fn wait_batch(&self, batch: BatchId) -> Result<TransferStatus> {
        let status = self.inner.batch(batch)?.wait();
        self.inner.seen(batch, &status);
        Ok(status)
    }

    /// [`wait_batch`](Self::wait_batch) until `deadline` at the latest:
    /// whether every request has settled (completed, failed, timed out or
    /// canceled) by then.
    pub fn wait_batch_until(&self, batch: BatchId, deadline: Instant) -> Result<bool> {
        let b = self.inner.batch(batch)?;
        let status = b.wait_until(Some(deadline));
        let settled = b.all_settled();
        if settled {
            self.inner.seen(batch, &status);
        }
        Ok(settled)
    }

    /// Cancels request `task_id` of `batch` if it still runs (its status
    /// becomes `Canceled`): on return it writes no more local memory, so a
    /// reader that got the bytes elsewhere may reuse or free its buffer. A
    /// response still arriving is discarded; one stuck halfway through
    /// landing for 200 ms has its connections shut. Bytes of a
    /// write already sent may still land at the target.
    pub fn cancel_transfer(&self, batch: BatchId, task_id: usize) -> Result<TransferStatus> {
        self.inner.batch(batch)?.cancel_task(task_id, CANCEL_GRACE)
    }

    /// Frees a batch; refused (`ERR_BATCH_BUSY`) while requests run.
    pub fn free_batch(&self, batch: BatchId) -> Result<()> {
        let b = self.inner.batch(batch)?;
        b.prepare_free()?;
        self.inner.metrics.forget(batch);
        self.inner.batches.lock().live.remove(&batch);
        Ok(())
    }

    /// Frees a batch now or, while requests that timed out still drain,
    /// once they end (a later allocation reaps it).
    pub fn release_batch(&self, batch: BatchId) {
        if let Err(e) = self.free_batch(batch) {
            tracing::debug!("batch {batch} freed later: {e}");
            self.inner.batches.lock().parked.push(batch);
        }
    }

    /// [`release_batch`](Self::release_batch) without waiting for requests
    /// still draining (a later allocation frees it): for a batch of reads
    /// that were canceled or timed out, whose late responses are discarded
    /// rather than written, so nothing of the caller's memory is touched.
    pub fn release_read_batch(&self, batch: BatchId) {
        match self.inner.batch(batch) {
            Ok(b) if !b.is_idle() => self.inner.batches.lock().parked.push(batch),
            _ => self.release_batch(batch),
        }
    }

    /// allocate + submit + wait + free. The error carries the first failed
    /// request's code. After a timeout, a batch whose aborted requests are
    /// still draining is freed later (by a later allocation) rather than
    /// turning the result into `ERR_BATCH_BUSY`.
    pub fn transfer_sync(&self, requests: &[TransferRequest]) -> Result<()> {
        let batch = self.allocate_batch(requests.len().max(1))?;
        let result = self
            .submit(batch, requests)
            .map(|()| self.wait_batch(batch));
        self.release_batch(batch);
        let status = result??;
        match status.state {
            crate::TransferState::Completed => Ok(()),
            state => Err(Error::new(
                status.error.unwrap_or(ErrorCode::TRANSFER_FAIL),
                format!("transfer ended {state:?}"),
            )),
        }
    }
}

impl Inner {
    /// A finished batch's completion latency counts (once).
    fn seen(&self, batch: BatchId, status: &TransferStatus) {
        if !matches!(
            status.state,
            TransferState::Waiting | TransferState::Pending
        ) {
            self.metrics.finished(batch);
        }
    }

    fn add_batch(&self, id: BatchId, batch: Batch) {
        let mut batches = self.batches.lock();
        if !batches.parked.is_empty() {
            batches.reap_parked();
        }
        batches.live.insert(id, Arc::new(batch));
    }

    pub(super) fn batch(&self, id: BatchId) -> Result<Arc<Batch>> {
        self.batches
            .lock()
            .live
            .get(&id)
            .cloned()
            .ok_or_else(|| invalid(format!("no batch {id}")))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::EngineConfig;

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
}
