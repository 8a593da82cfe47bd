//! The real client's background threads: the heartbeat, and the executor of
//! copy and move tasks (`tasks.rs`).

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use mooncake_common::ErrorCode;

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
    pub fn spawn(
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
    pub fn stop(self) {
        let _ = self.stop.send(());
        if self.join.thread().id() != std::thread::current().id() {
            let _ = self.join.join();
        }
    }
}

/// Pings the master every [`HEARTBEAT_INTERVAL`]; when the master no longer
/// knows this client (it restarted, or declared us dead after a long pause)
/// `segments` are mounted again.
pub(super) fn heartbeat(master: MasterClient, id: ClientId, segments: Vec<SegmentInfo>) -> Worker {
    Worker::spawn("mooncake-heartbeat", HEARTBEAT_INTERVAL, move || {
        match master.ping(id) {
            Ok(()) => {}
            Err(e) if e.code == ErrorCode::CLIENT_NOT_FOUND => {
                for seg in &segments {
                    if let Err(e) = master.mount_segment(id, seg) {
                        if e.code != ErrorCode::SEGMENT_ALREADY_EXISTS {
                            tracing::warn!(segment = %seg.name, error = %e, "remount failed");
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "heartbeat failed"),
        }
        true
    })
}
