//! `MC_USE_TENT=1` (or `MC_USE_TEV1`): the same `TransferEngine` class
//! over [`mooncake_tent::TentEngine`], configured by `MC_TENT_CONF` and the
//! `TENT_METRICS_*` variables. Registration goes to every path; transfers
//! are sprayed over the peer's paths; memory the script did not register
//! is staged; async batches run on a thread each. Notifies, managed
//! buffers and `get_engine()` use the first path's classic engine.

use std::sync::Arc;

use mooncake_common::{Error, ErrorCode};
use mooncake_tent::{TentConfig, TentEngine};
use mooncake_transfer::{Opcode, TransferRequest};
use parking_lot::{Condvar, Mutex};

use crate::mem::Access;

/// Whether the environment selects TENT, as the reference reads it (set to anything).
pub(super) fn selected() -> bool {
    ["MC_USE_TENT", "MC_USE_TEV1"]
        .iter()
        .any(|k| std::env::var_os(k).is_some())
}

pub(super) fn start(metadata_server: &str, local_hostname: &str) -> Result<TentEngine, Error> {
    let config = TentConfig::from_env(metadata_server, local_hostname, |k| std::env::var(k).ok())?;
    TentEngine::new(config)
}

/// The access a request needs to its local range.
pub(super) fn access(op: Opcode) -> Access {
    match op {
        Opcode::Write => Access::Read,
        Opcode::Read => Access::Write,
    }
}

/// Runs `requests` once `usable` vouched for every local range.
pub(super) fn transfer(
    tent: &TentEngine,
    requests: &[TransferRequest],
    usable: impl Fn(usize, usize, Access) -> bool,
) -> Result<(), Error> {
    for (i, r) in requests.iter().enumerate() {
        if r.length > 0 && !usable(r.source, r.length, access(r.opcode)) {
            return Err(Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                format!(
                    "request {i}: {:#x}+{} is not valid memory of this process",
                    r.source, r.length
                ),
            ));
        }
    }
    // SAFETY: every local range was just found mapped with the access its
    // request needs; the script keeps it alive for the call, as with the
    // classic engine.
    unsafe { tent.transfer_sync_staged(requests) }
}

/// An async batch: `None` while running, then whether it completed.
#[derive(Default)]
pub(super) struct Batch {
    done: Mutex<Option<bool>>,
    cv: Condvar,
}

impl Batch {
    /// Starts `requests` (already checked) on a thread.
    pub(super) fn spawn(tent: TentEngine, requests: Vec<TransferRequest>) -> Arc<Batch> {
        let batch = Arc::new(Batch::default());
        let b = batch.clone();
        std::thread::spawn(move || {
            // SAFETY: the ranges were checked by `transfer`'s caller; the
            // script keeps async buffers alive until the batch is done, as
            // the reference requires.
            let ok = unsafe { tent.transfer_sync_staged(&requests) }
                .map_err(|e| tracing::warn!("TENT batch: {e}"))
                .is_ok();
            *b.done.lock() = Some(ok);
            b.cv.notify_all();
        });
        batch
    }

    pub(super) fn poll(&self) -> Option<bool> {
        *self.done.lock()
    }

    pub(super) fn wait(&self) -> bool {
        let mut done = self.done.lock();
        loop {
            if let Some(ok) = *done {
                return ok;
            }
            self.cv.wait(&mut done);
        }
    }
}
