//! Notifies: small messages to a segment's owner, sent on their own or once
//! a batch completes, and drained by `get_notifies`.

use mooncake_common::{Error, Result};

use super::{invalid, BatchId, Notify, SegmentHandle, TransferEngine, TransferRequest};
use crate::rpc;

impl TransferEngine {
    /// Like [`Self::submit`]; once every request of the batch has completed,
    /// `notify` is delivered to the first request's target.
    pub fn submit_with_notify(
        &self,
        batch: BatchId,
        requests: &[TransferRequest],
        notify: Notify,
    ) -> Result<()> {
        let first = requests
            .first()
            .ok_or_else(|| invalid("submit_with_notify without requests"))?;
        let target = self.inner.segment(first.target_id)?;
        let (local, rpc_addr) = (self.inner.local.clone(), target.rpc_addr);
        let timeout = self.inner.config.transfer_timeout;
        let hook = Box::new(move |all_ok: bool| {
            if !all_ok {
                return;
            }
            match rpc_addr {
                None => {
                    if let Err(code) = local.notifies.lock().push(notify) {
                        tracing::warn!("notify after transfer dropped: {code:?}");
                    }
                }
                Some(addr) => {
                    // Off the transport's thread: this makes a connection.
                    let _ = std::thread::Builder::new()
                        .name("mc-notify".into())
                        .spawn(move || {
                            if let Err(e) = rpc::send_notify(addr, &notify, timeout, &local) {
                                tracing::warn!("notify after transfer: {e}");
                            }
                        });
                }
            }
        });
        self.inner.submit(batch, requests, Some(hook))
    }

    /// Delivers `notify` to the owner of segment `target`.
    pub fn send_notify(&self, target: SegmentHandle, notify: Notify) -> Result<()> {
        let seg = self.inner.segment(target)?;
        match seg.rpc_addr {
            None => self
                .inner
                .local
                .notifies
                .lock()
                .push(notify)
                .map_err(|code| Error::new(code, "too many notifies waiting for get_notifies")),
            Some(addr) => rpc::send_notify(
                addr,
                &notify,
                self.inner.config.transfer_timeout,
                &self.inner.local,
            ),
        }
    }

    /// Drains the notifies received so far. At most 64 Ki notifies (64 MiB)
    /// wait here; past that, new ones are refused with `ERR_TOO_MANY_REQUESTS`.
    pub fn get_notifies(&self) -> Vec<Notify> {
        self.inner.local.notifies.lock().drain()
    }
}
