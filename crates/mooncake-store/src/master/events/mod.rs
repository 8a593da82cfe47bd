//! The KV-event publisher: tells routers which blocks this master's pool
//! holds (`docs/kv-events.md`), in the reference's format (`encode`).
//!
//! The master's leader enqueues an event where it decides a put's end, a
//! removal or an eviction (`state::service::events`); a standby, replaying
//! mutations, never does. A thread sends the queue in batches of up to
//! [`MAX_BATCH`] on a ZMQ PUB socket, so a slow or absent subscriber never
//! slows a put: PUB drops what a subscriber cannot take, and a full queue
//! drops its oldest event, leaving a gap in the sequence numbers.

pub mod encode;
pub mod replay;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

pub use encode::{Format, Kind, Medium, Pending};

/// Events per message, as the reference sends them.
pub const MAX_BATCH: usize = 64;
/// The PUB socket's send high-water mark, as the reference's.
const SEND_HWM: i32 = 10_000;
/// How long the sending thread lets events gather before it sends a batch
/// that is not full. Waking it (and ZMQ's I/O thread) for every put would
/// cost each put two thread switches; on a loaded host that doubled the
/// put p99. A router learns of a block at most this much later.
const COALESCE: std::time::Duration = std::time::Duration::from_millis(1);

/// How the publisher is set up (the `kv_events_*` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub bind_endpoint: String,
    pub format: Format,
    /// Pending events kept at most (0: unbounded).
    pub queue_capacity: usize,
    /// Where the replay endpoint binds (`replay`), if anywhere.
    pub replay_endpoint: Option<String>,
    /// Sent batches the replay endpoint keeps.
    pub replay_buffer: usize,
}

/// What `GET /kv_events/status` reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub published_batches: u64,
    pub published_events: u64,
    pub dropped_events: u64,
    pub skipped_unparsed_keys: u64,
}

struct Inner {
    queue: Mutex<VecDeque<Pending>>,
    ready: Condvar,
    stop: AtomicBool,
    /// The next batch's sequence number; a dropped event skips one.
    next_seq: AtomicU64,
    published_batches: AtomicU64,
    published_events: AtomicU64,
    dropped_events: AtomicU64,
    skipped_unparsed_keys: AtomicU64,
}

impl Inner {
    fn new() -> Inner {
        Inner {
            queue: Mutex::default(),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            next_seq: AtomicU64::new(1),
            published_batches: AtomicU64::new(0),
            published_events: AtomicU64::new(0),
            dropped_events: AtomicU64::new(0),
            skipped_unparsed_keys: AtomicU64::new(0),
        }
    }

    /// Queues `event`, first dropping the oldest one if `capacity` (0:
    /// none) is reached; true when the queue was empty (the sending thread
    /// may be asleep).
    fn push(&self, capacity: usize, event: Pending) -> bool {
        let mut q = self.queue.lock();
        let was_empty = q.is_empty();
        if capacity > 0 && q.len() >= capacity {
            q.pop_front();
            self.dropped_events.fetch_add(1, Ordering::Relaxed);
            // The gap tells consumers that they missed something.
            self.next_seq.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(event);
        was_empty
    }
}

/// A bound publisher and its sending thread (stopped on drop, after
/// sending what is queued).
pub struct Publisher {
    inner: Arc<Inner>,
    capacity: usize,
    worker: Option<JoinHandle<()>>,
    /// Declared after `worker`: it stops after the last batch was recorded.
    replay: Option<replay::Server>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Publisher {
    /// Binds the PUB socket and starts the sending thread; an endpoint that
    /// cannot be bound (in use, malformed) is an error.
    pub fn bind(config: Config) -> Result<Publisher> {
        let fail = |what: &str, e: zmq::Error| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("kv_events: {what} {:?}: {e}", config.bind_endpoint),
            )
        };
        let ctx = zmq::Context::new();
        let socket = ctx
            .socket(zmq::PUB)
            .map_err(|e| fail("cannot open a PUB socket for", e))?;
        socket
            .set_sndhwm(SEND_HWM)
            .and_then(|()| socket.set_linger(0))
            .map_err(|e| fail("cannot set up the socket for", e))?;
        socket
            .bind(&config.bind_endpoint)
            .map_err(|e| fail("cannot bind", e))?;
        let inner = Arc::new(Inner::new());
        let (ring, replay) = match &config.replay_endpoint {
            Some(ep) => {
                let ring = Arc::new(Mutex::new(replay::Ring::new(config.replay_buffer)));
                (Some(ring.clone()), Some(replay::Server::bind(ep, ring)?))
            }
            None => (None, None),
        };
        let worker = {
            let inner = inner.clone();
            let format = config.format.clone();
            std::thread::Builder::new()
                .name("kv-events".into())
                .spawn(move || {
                    Sender {
                        socket,
                        _ctx: ctx,
                        format,
                        next_id: 1,
                        ring,
                    }
                    .run(&inner)
                })
                .map_err(|e| {
                    Error::new(ErrorCode::INTERNAL_ERROR, format!("kv_events thread: {e}"))
                })?
        };
        tracing::info!(
            endpoint = %config.bind_endpoint,
            backend_id = %config.format.backend_id,
            "kv_events publisher enabled"
        );
        Ok(Publisher {
            inner,
            capacity: config.queue_capacity,
            worker: Some(worker),
            replay,
        })
    }

    /// Queues an event; drops the oldest one if the queue is full.
    pub fn publish(&self, kind: Kind, key: &str, medium: Medium) {
        let event = Pending {
            kind,
            key: key.to_owned(),
            medium,
        };
        // A non-empty queue has a wake-up pending or a sender at work.
        if self.inner.push(self.capacity, event) {
            self.inner.ready.notify_one();
        }
    }

    /// This master starts leading, at wall-clock `epoch_ms`: the next batch
    /// is numbered `epoch_ms * 1000` (or on from the current number, if
    /// higher). A leader sends at most one batch per millisecond that is
    /// not full (`COALESCE`) and far fewer than 1000 full ones, so its
    /// numbers stay below its successor's base, which is taken at least a
    /// lease later: after a failover a consumer sees the numbers go on
    /// (with a gap, since the predecessor's buffer went with it), not start
    /// again at 1. A master that never leads (no HA) numbers from 1, as the
    /// reference.
    pub fn lead(&self, epoch_ms: u64) {
        let base = epoch_ms.saturating_mul(1000);
        self.inner.next_seq.fetch_max(base, Ordering::Relaxed);
    }

    /// Replay requests answered so far (0 without a replay endpoint).
    pub fn replay_requests(&self) -> u64 {
        self.replay.as_ref().map_or(0, replay::Server::requests)
    }

    pub fn stats(&self) -> Stats {
        let i = &self.inner;
        Stats {
            published_batches: i.published_batches.load(Ordering::Relaxed),
            published_events: i.published_events.load(Ordering::Relaxed),
            dropped_events: i.dropped_events.load(Ordering::Relaxed),
            skipped_unparsed_keys: i.skipped_unparsed_keys.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
impl Publisher {
    /// A publisher that sends nothing: its events stay queued, for tests
    /// of what the master publishes.
    pub(crate) fn unsent() -> Publisher {
        Publisher {
            inner: Arc::new(Inner::new()),
            capacity: 0,
            worker: None,
            replay: None,
        }
    }

    /// The events queued (all of them, for an `unsent` one).
    pub(crate) fn queued(&self) -> Vec<(Kind, String, Medium)> {
        let q = self.inner.queue.lock();
        q.iter()
            .map(|e| (e.kind, e.key.clone(), e.medium))
            .collect()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        {
            // Under the lock, so the worker cannot miss the wake-up.
            let _q = self.inner.queue.lock();
            self.inner.ready.notify_all();
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// The sending thread's side: it alone touches the socket.
struct Sender {
    socket: zmq::Socket,
    /// Kept alive as long as the socket.
    _ctx: zmq::Context,
    format: Format,
    next_id: u64,
    /// Where sent batches are kept for the replay endpoint.
    ring: Option<Arc<Mutex<replay::Ring>>>,
}

impl Sender {
    fn run(mut self, inner: &Inner) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            {
                let mut q = inner.queue.lock();
                while q.is_empty() && !inner.stop.load(Ordering::Relaxed) {
                    inner.ready.wait(&mut q);
                }
                if q.is_empty() {
                    return;
                }
                if q.len() < MAX_BATCH && !inner.stop.load(Ordering::Relaxed) {
                    // Let a batch gather (puts arriving now do not wake us).
                    parking_lot::MutexGuard::unlocked(&mut q, || std::thread::sleep(COALESCE));
                }
                let n = q.len().min(MAX_BATCH);
                batch.extend(q.drain(..n));
            }
            self.send(inner, &batch);
            batch.clear();
        }
    }

    fn send(&mut self, inner: &Inner, batch: &[Pending]) {
        let mut numbered = Vec::with_capacity(batch.len());
        for event in batch {
            let hash = encode::seq_hash(crate::tenant::split(&event.key).1);
            if hash.is_none() {
                inner.skipped_unparsed_keys.fetch_add(1, Ordering::Relaxed);
                if !self.format.object_key || event.key.is_empty() {
                    continue;
                }
            }
            numbered.push(encode::Numbered {
                event,
                id: self.next_id,
                hash,
            });
            self.next_id += 1;
        }
        if numbered.is_empty() {
            return;
        }
        let payload = Arc::new(encode::batch(&self.format, now_ms(), &numbered));
        let seq = inner.next_seq.fetch_add(1, Ordering::Relaxed);
        if let Some(ring) = &self.ring {
            // Kept before it is sent: a consumer that sees this batch and
            // asks the replay endpoint for it at once must find it there.
            // Kept even if the send fails: a consumer asking gets what it
            // missed.
            ring.lock().record(seq, payload.clone());
        }
        let sent = self
            .socket
            .send(&b""[..], zmq::SNDMORE)
            .and_then(|()| self.socket.send(&seq.to_be_bytes()[..], zmq::SNDMORE))
            .and_then(|()| self.socket.send(&payload[..], 0));
        let n = numbered.len() as u64;
        match sent {
            Ok(()) => {
                inner.published_batches.fetch_add(1, Ordering::Relaxed);
                inner.published_events.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                inner.dropped_events.fetch_add(n, Ordering::Relaxed);
                tracing::warn!(error = %e, "kv_events: a batch could not be sent");
            }
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests;
