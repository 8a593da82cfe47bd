//! One ZMQ SUB socket per registered publisher, on a thread of its own:
//! batches are decoded and applied in sequence order; a gap in the
//! sequence numbers asks the publisher's replay endpoint (vLLM's ROUTER
//! protocol) for the missed batches, and when they cannot all be had, the
//! publisher's blocks indexed so far are marked stale (`Index::mark_stale`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::decode::decode_batch;
use crate::index::{Index, Kind, SubId};
use crate::metrics::{Metrics, PublisherLabels, ReplayLabels};

/// Payloads larger than this are refused by the socket.
const MAX_MESSAGE: i64 = 64 << 20;
/// How often a blocked receive wakes to see whether it should stop.
const POLL_MS: i32 = 100;
/// The replay protocol's end marker: -1 as a signed 64-bit big-endian integer.
const END_SEQ: [u8; 8] = [0xff; 8];

/// What the service's threads share.
pub struct Shared {
    pub index: RwLock<Index>,
    pub metrics: Metrics,
}

/// What a subscription's thread reports (`GET /instances`).
#[derive(Default)]
pub struct SubStatus {
    pub last_seq: Mutex<Option<u64>>,
    pub batches: AtomicU64,
    pub gaps: AtomicU64,
    pub replays_recovered: AtomicU64,
    pub replays_failed: AtomicU64,
    /// Set when blocks were marked stale, until the publisher clears.
    pub stale: AtomicBool,
}

/// Where a sequence number falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The first batch heard (what came before subscribing is unknown).
    First,
    Next,
    /// Batches `from..seq` were missed.
    Gap {
        from: u64,
    },
    /// The sequence went back: the publisher restarted.
    Restart,
}

/// The last sequence number applied.
#[derive(Clone, Copy, Debug, Default)]
pub struct SeqTracker {
    last: Option<u64>,
}

impl SeqTracker {
    pub fn step(&self, seq: u64) -> Step {
        match self.last {
            None => Step::First,
            Some(l) if seq == l.wrapping_add(1) => Step::Next,
            Some(l) if seq > l => Step::Gap { from: l + 1 },
            Some(_) => Step::Restart,
        }
    }

    pub fn advance(&mut self, seq: u64) {
        self.last = Some(seq);
    }

    pub fn last(&self) -> Option<u64> {
        self.last
    }
}

/// One subscription's settings, as its thread needs them.
pub struct Subscription {
    pub id: SubId,
    pub kind: Kind,
    /// The metrics' `publisher` label.
    pub name: String,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub replay_timeout: Duration,
}

/// Connects the SUB socket (so that a bad endpoint is the caller's error)
/// and starts the thread; it runs until `stop` is set or the subscription
/// leaves the index.
pub fn spawn(
    ctx: &zmq::Context,
    shared: Arc<Shared>,
    sub: Subscription,
    stop: Arc<AtomicBool>,
    status: Arc<SubStatus>,
) -> Result<(), String> {
    let sock = ctx.socket(zmq::SUB).map_err(|e| e.to_string())?;
    let setup = || -> Result<(), zmq::Error> {
        sock.set_rcvtimeo(POLL_MS)?;
        sock.set_maxmsgsize(MAX_MESSAGE)?;
        sock.set_rcvhwm(100_000)?;
        sock.set_linger(0)?;
        sock.connect(&sub.endpoint)?;
        sock.set_subscribe(b"")
    };
    setup().map_err(|e| format!("endpoint {:?}: {e}", sub.endpoint))?;
    let ctx = ctx.clone();
    std::thread::Builder::new()
        .name(format!("conductor-sub-{}", sub.id))
        .spawn(move || {
            Worker {
                ctx,
                shared,
                sub,
                status,
                tracker: SeqTracker::default(),
            }
            .run(&sock, &stop)
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

struct Worker {
    ctx: zmq::Context,
    shared: Arc<Shared>,
    sub: Subscription,
    status: Arc<SubStatus>,
    tracker: SeqTracker,
}

impl Worker {
    fn label(&self) -> PublisherLabels {
        PublisherLabels {
            publisher: self.sub.name.clone(),
        }
    }

    fn run(mut self, sock: &zmq::Socket, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let msg = match sock.recv_multipart(0) {
                Ok(m) => m,
                Err(zmq::Error::EAGAIN) => continue,
                Err(e) => {
                    tracing::warn!(publisher = %self.sub.name, "receive failed: {e}");
                    std::thread::sleep(Duration::from_millis(POLL_MS as u64));
                    continue;
                }
            };
            let seq = match msg.as_slice() {
                [_topic, seq, _payload] if seq.len() == 8 => {
                    u64::from_be_bytes(seq[..].try_into().expect("8 bytes"))
                }
                _ => {
                    self.shared
                        .metrics
                        .bad_batches
                        .get_or_create(&self.label())
                        .inc();
                    tracing::debug!(publisher = %self.sub.name, "a message of {} frames is not a batch", msg.len());
                    continue;
                }
            };
            match self.tracker.step(seq) {
                Step::First | Step::Next => {}
                Step::Gap { from } => {
                    self.note_gap();
                    tracing::info!(publisher = %self.sub.name, "missed batches {from}..{seq}");
                    let recovered = self.replay(from, seq);
                    if !recovered && self.mark_stale() {
                        return;
                    }
                }
                Step::Restart => {
                    self.note_gap();
                    tracing::info!(publisher = %self.sub.name, "sequence went back to {seq}: publisher restarted");
                    if self.mark_stale() {
                        return;
                    }
                }
            }
            if !self.apply(seq, &msg[2]) {
                return;
            }
        }
    }

    fn note_gap(&self) {
        self.status.gaps.fetch_add(1, Ordering::Relaxed);
        self.shared.metrics.gaps.get_or_create(&self.label()).inc();
    }

    /// Marks the subscription's blocks stale; `true` when it is gone.
    fn mark_stale(&self) -> bool {
        let mut index = self.shared.index.write();
        if index.sub_info(self.sub.id).is_none() {
            return true;
        }
        let n = index.mark_stale(self.sub.id);
        drop(index);
        self.status.stale.store(true, Ordering::Relaxed);
        tracing::warn!(publisher = %self.sub.name, "{n} entries marked stale after an unrecovered gap");
        false
    }

    /// Decodes and applies one batch; `false` when the subscription is gone.
    fn apply(&mut self, seq: u64, payload: &[u8]) -> bool {
        self.tracker.advance(seq);
        *self.status.last_seq.lock() = Some(seq);
        self.status.batches.fetch_add(1, Ordering::Relaxed);
        let m = &self.shared.metrics;
        m.batches.get_or_create(&self.label()).inc();
        let batch = match decode_batch(self.sub.kind, payload) {
            Ok(b) => b,
            Err(e) => {
                m.bad_batches.get_or_create(&self.label()).inc();
                tracing::debug!(publisher = %self.sub.name, "batch {seq}: {e}");
                return true;
            }
        };
        let Some(applied) = self.shared.index.write().apply(self.sub.id, &batch) else {
            return false;
        };
        let count = |k: &str| batch.events.iter().filter(|e| e.kind() == k).count() as u64;
        for kind in ["stored", "removed", "cleared"] {
            m.event(&self.sub.name, kind, count(kind));
        }
        m.event(&self.sub.name, "malformed", u64::from(batch.malformed));
        m.event(&self.sub.name, "rejected", applied.rejected);
        if applied.cleared > 0 {
            self.status.stale.store(false, Ordering::Relaxed);
        }
        true
    }

    /// Asks for batches `from..to` and applies them; `true` when all came.
    fn replay(&mut self, from: u64, to: u64) -> bool {
        let outcome = match self.sub.replay_endpoint.clone() {
            None => false,
            Some(ep) => match self.fetch(&ep, from, to) {
                Ok(ok) => ok,
                Err(e) => {
                    tracing::warn!(publisher = %self.sub.name, "replay from {ep}: {e}");
                    false
                }
            },
        };
        let (counter, name) = if outcome {
            (&self.status.replays_recovered, "recovered")
        } else {
            (&self.status.replays_failed, "failed")
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.shared
            .metrics
            .replays
            .get_or_create(&ReplayLabels {
                publisher: self.sub.name.clone(),
                outcome: name.into(),
            })
            .inc();
        outcome
    }

    fn fetch(&mut self, endpoint: &str, from: u64, to: u64) -> Result<bool, String> {
        let sock = self.ctx.socket(zmq::DEALER).map_err(|e| e.to_string())?;
        let ms = i32::try_from(self.sub.replay_timeout.as_millis()).unwrap_or(i32::MAX);
        let setup = || -> Result<(), zmq::Error> {
            sock.set_linger(0)?;
            sock.set_rcvtimeo(ms)?;
            sock.set_sndtimeo(ms)?;
            sock.set_maxmsgsize(MAX_MESSAGE)?;
            sock.connect(endpoint)?;
            sock.send_multipart([&b""[..], &from.to_be_bytes()[..]], 0)
        };
        setup().map_err(|e| e.to_string())?;
        let mut expected = from;
        loop {
            let msg = sock
                .recv_multipart(0)
                .map_err(|e| format!("no answer: {e}"))?;
            let (seq, payload) = match msg.as_slice() {
                [empty, seq, payload] if empty.is_empty() && seq.len() == 8 => {
                    (seq.as_slice(), payload.as_slice())
                }
                _ => return Err(format!("an answer of {} frames", msg.len())),
            };
            if seq == END_SEQ {
                return Ok(expected == to);
            }
            let seq = u64::from_be_bytes(seq.try_into().expect("8 bytes"));
            if seq < expected || seq >= to {
                continue;
            }
            if seq > expected {
                // The publisher's buffer no longer holds some of them.
                return Ok(false);
            }
            if !self.apply(seq, payload) {
                return Ok(false);
            }
            expected += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_steps() {
        let mut t = SeqTracker::default();
        assert_eq!(t.step(5), Step::First);
        t.advance(5);
        assert_eq!(t.step(6), Step::Next);
        assert_eq!(t.step(9), Step::Gap { from: 6 });
        assert_eq!(t.step(5), Step::Restart);
        assert_eq!(t.step(0), Step::Restart);
        t.advance(u64::MAX);
        assert_eq!(t.step(0), Step::Next, "wraps");
        assert_eq!(t.last(), Some(u64::MAX));
    }
}
