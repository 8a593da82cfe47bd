//! The real client's background threads: the heartbeat, and the executor of
//! copy and move tasks (`tasks.rs`).

use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use mooncake_common::ErrorCode;

use mooncake_transfer::TransferEngine;
use parking_lot::Mutex;

use crate::master_client::MasterClient;
use crate::types::{ClientId, SegmentInfo};

/// How often the client tells the master it is alive (well under any sane
/// `client_ttl`).
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);

/// A background thread running `tick` every `interval` until it returns
/// false or the worker is stopped.
pub(super) struct Worker {
    stop: mpsc::Sender<()>,
    join: JoinHandle<()>,
}

impl Worker {
    pub(super) fn spawn(
        name: &str,
        interval: Duration,
        mut tick: impl FnMut() -> bool + Send + 'static,
    ) -> Worker {
        let (stop, rx) = mpsc::channel::<()>();
        let join = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                match rx.recv_timeout(interval) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                if !tick() {
                    return;
                }
            })
            .unwrap_or_else(|e| panic!("spawn thread {name}: {e}"));
        Worker { stop, join }
    }

    /// Stops the thread and waits for it, unless called from the thread
    /// itself (the executor may drop the client's last reference).
    pub(super) fn stop(self) {
        let _ = self.stop.send(());
        if self.join.thread().id() != std::thread::current().id() {
            let _ = self.join.join();
        }
    }
}

/// Every this many heartbeats the engine's metadata keys are checked even
/// when the master answered throughout (a metadata server may restart
/// between two beats).
const REPUBLISH_CHECK_EVERY: u32 = 10;

/// Pings the master every [`HEARTBEAT_INTERVAL`]; when the master no longer
/// knows this client (it restarted, or declared us dead after a long pause)
/// `segments` are mounted again.
///
/// The transfer-engine descriptor of this client's segments must survive
/// too: a metadata server embedded in the master (or a standalone one)
/// forgets it when restarted or replaced, and new clients could then not
/// open these segments. So after the master was unreachable or forgot this
/// client, and every [`REPUBLISH_CHECK_EVERY`] beats, the engine publishes
/// its keys again if they are gone.
pub(super) fn heartbeat(
    master: MasterClient,
    engine: TransferEngine,
    id: ClientId,
    segments: Arc<Mutex<Vec<SegmentInfo>>>,
) -> Worker {
    let mut beats = 0u32;
    let mut check_now = false;
    Worker::spawn("mooncake-heartbeat", HEARTBEAT_INTERVAL, move || {
        beats = beats.wrapping_add(1);
        match master.ping(id) {
            Ok(()) => {}
            Err(e) if e.code == ErrorCode::CLIENT_NOT_FOUND => {
                check_now = true;
                // Held while mounting: a run-time unmount waits, so no
                // segment is mounted again after its memory went.
                let segments = segments.lock();
                for seg in segments.iter() {
                    if let Err(e) = master.mount_segment(id, seg) {
                        if e.code != ErrorCode::SEGMENT_ALREADY_EXISTS {
                            tracing::warn!(segment = %seg.name, error = %e, "remount failed");
                        }
                    }
                }
            }
            Err(e) => {
                check_now = true;
                tracing::debug!(error = %e, "heartbeat failed");
                return true;
            }
        }
        if check_now || beats.is_multiple_of(REPUBLISH_CHECK_EVERY) {
            match engine.republish_if_lost() {
                Ok(true) => {
                    check_now = false;
                    tracing::info!("transfer-engine metadata was lost; published it again");
                }
                Ok(false) => check_now = false,
                // The metadata server may be down too: next beat.
                Err(e) => tracing::debug!(error = %e, "metadata check failed"),
            }
        }
        true
    })
}
