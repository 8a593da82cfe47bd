//! The polling loop both tier writers run (the SSD tier's offload loop and
//! the shared-filesystem writer): ask the master for work, do it, back off
//! while there is none, and mount again when the master says it does not
//! know this client's tier (it restarted, failed over, or expired us).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mooncake_common::{ErrorCode, Result};

const MIN_IDLE: Duration = Duration::from_millis(1);
/// The longest pause between polls, and between report retries.
pub(crate) const MAX_IDLE: Duration = Duration::from_millis(20);

/// Runs `round` until `stop`: a round answers whether it found work. A
/// round that found none backs off from 1 ms to [`MAX_IDLE`], so a busy
/// tier drains at disk speed and an idle one costs a few calls a second.
/// `SEGMENT_NOT_FOUND` from a round calls `remount`. `tier` names the tier
/// in the log.
pub(crate) fn poll_until_stopped(
    stop: &AtomicBool,
    tier: &str,
    mut round: impl FnMut() -> Result<bool>,
    mut remount: impl FnMut() -> Result<()>,
) {
    let mut idle = MIN_IDLE;
    while !stop.load(Ordering::Relaxed) {
        let worked = match round() {
            Ok(worked) => worked,
            Err(e) if e.code == ErrorCode::SEGMENT_NOT_FOUND => {
                tracing::warn!(tier, error = %e, "tier not known to the master: mounting again");
                if let Err(e) = remount() {
                    tracing::warn!(tier, error = %e, "tier remount failed");
                }
                false
            }
            Err(e) => {
                tracing::debug!(tier, error = %e, "fetching tier tasks failed");
                false
            }
        };
        if worked {
            idle = MIN_IDLE;
        } else {
            std::thread::sleep(idle);
            idle = (idle * 2).min(MAX_IDLE);
        }
    }
}
