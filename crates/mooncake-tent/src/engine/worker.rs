//! The threads that carry slices on one path: each runs one slice at a
//! time through the path's classic engine (`transfer_sync`: its own batch,
//! its own timeout, which closes the path's connections when it expires),
//! so the dispatcher never blocks and a stalled path holds only its own
//! threads.

use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Sender};
use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{TransferEngine, TransferRequest};

pub(super) struct Job {
    pub(super) id: usize,
    pub(super) engine: TransferEngine,
    pub(super) request: TransferRequest,
    pub(super) reply: Sender<Done>,
}

pub(super) struct Done {
    pub(super) id: usize,
    pub(super) result: Result<(), ErrorCode>,
    pub(super) elapsed: Duration,
}

/// `threads` workers for the path to `endpoint`; they end when the
/// returned sender (the path) is dropped.
pub(super) fn spawn(threads: usize, endpoint: &str) -> Result<Sender<Job>> {
    let (tx, rx) = unbounded::<Job>();
    for i in 0..threads.max(1) {
        let rx = rx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("tent-path-{i}"))
            .spawn(move || {
                for job in rx {
                    let start = Instant::now();
                    let result = job.engine.transfer_sync(&[job.request]).map_err(|e| e.code);
                    let _ = job.reply.send(Done {
                        id: job.id,
                        result,
                        elapsed: start.elapsed(),
                    });
                }
            });
        if let Err(e) = spawned {
            // Dropping `tx` ends the workers already started.
            return Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("TENT: cannot start a worker for {endpoint}: {e}"),
            ));
        }
    }
    Ok(tx)
}
