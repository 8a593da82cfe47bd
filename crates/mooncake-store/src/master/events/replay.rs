//! The replay endpoint: a ZMQ ROUTER socket that resends recent batches to a
//! consumer that saw a gap in the sequence numbers, in vLLM's protocol (the
//! one its publisher and the Conductor speak):
//!
//! - request: `[identity, "", start_seq]` (8 bytes, big-endian);
//! - answer: `[identity, "", seq, payload]` for every kept batch from
//!   `start_seq` on, in order, then `[identity, "", -1, ""]`.
//!
//! The sending thread records each batch it sent in a [`Ring`] of the last
//! `capacity` batches; a thread of its own answers requests, so a consumer
//! catching up never holds up publishing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

/// The end marker: -1 as a signed 64-bit big-endian integer.
pub const END: [u8; 8] = (-1i64).to_be_bytes();
/// How often the serving thread looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);

/// The last `capacity` batches sent, oldest first.
#[derive(Debug, Default)]
pub struct Ring {
    capacity: usize,
    batches: VecDeque<(u64, Arc<Vec<u8>>)>,
}

impl Ring {
    pub fn new(capacity: usize) -> Ring {
        Ring {
            capacity,
            batches: VecDeque::with_capacity(capacity.min(1024)),
        }
    }

    /// Keeps batch `seq`, forgetting the oldest one when full.
    pub fn record(&mut self, seq: u64, payload: Arc<Vec<u8>>) {
        if self.capacity == 0 {
            return;
        }
        if self.batches.len() == self.capacity {
            self.batches.pop_front();
        }
        self.batches.push_back((seq, payload));
    }

    /// The kept batches numbered `start` or later, in order.
    pub fn since(&self, start: u64) -> Vec<(u64, Arc<Vec<u8>>)> {
        // Sequence numbers grow (with gaps where events were dropped), so
        // the first match is found by binary search.
        let from = self.batches.partition_point(|(seq, _)| *seq < start);
        self.batches.range(from..).cloned().collect()
    }
}

/// A running replay endpoint; stopped and joined on drop.
pub struct Server {
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    worker: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds the ROUTER socket on `endpoint` and answers from `ring`.
    pub fn bind(endpoint: &str, ring: Arc<Mutex<Ring>>) -> Result<Server> {
        let fail = |what: &str, e: zmq::Error| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("kv_events: {what} replay endpoint {endpoint:?}: {e}"),
            )
        };
        let ctx = zmq::Context::new();
        let socket = ctx
            .socket(zmq::ROUTER)
            .map_err(|e| fail("cannot open a ROUTER socket for the", e))?;
        socket
            .set_linger(0)
            .and_then(|()| socket.set_rcvtimeo(POLL.as_millis() as i32))
            // Requests are 2 frames of at most 8 bytes; anything bigger is
            // not one.
            .and_then(|()| socket.set_maxmsgsize(4096))
            .map_err(|e| fail("cannot set up the", e))?;
        socket
            .bind(endpoint)
            .map_err(|e| fail("cannot bind the", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicU64::new(0));
        let worker = {
            let (stop, requests) = (stop.clone(), requests.clone());
            std::thread::Builder::new()
                .name("kv-events-replay".into())
                .spawn(move || serve(&ctx, socket, &ring, &stop, &requests))
                .map_err(|e| {
                    Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        format!("kv_events replay thread: {e}"),
                    )
                })?
        };
        Ok(Server {
            stop,
            requests,
            worker: Some(worker),
        })
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// The start sequence number of a well-formed request
/// (`[identity, "", start_seq]`).
pub fn parse_request(frames: &[Vec<u8>]) -> Option<u64> {
    match frames {
        [id, empty, seq] if !id.is_empty() && empty.is_empty() => {
            Some(u64::from_be_bytes(seq.as_slice().try_into().ok()?))
        }
        _ => None,
    }
}

fn serve(
    _ctx: &zmq::Context,
    socket: zmq::Socket,
    ring: &Mutex<Ring>,
    stop: &AtomicBool,
    requests: &AtomicU64,
) {
    while !stop.load(Ordering::Relaxed) {
        let frames = match socket.recv_multipart(0) {
            Ok(f) => f,
            Err(zmq::Error::EAGAIN) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "kv_events replay: receive failed");
                continue;
            }
        };
        let Some(start) = parse_request(&frames) else {
            tracing::debug!(frames = frames.len(), "kv_events replay: not a request");
            continue;
        };
        let id = &frames[0];
        let batches = ring.lock().since(start);
        let mut sent = batches.iter().try_for_each(|(seq, payload)| {
            socket.send_multipart([&id[..], b"", &seq.to_be_bytes()[..], &payload[..]], 0)
        });
        if sent.is_ok() {
            sent = socket.send_multipart([&id[..], b"", &END[..], b""], 0);
        }
        match sent {
            Ok(()) => {
                requests.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "kv_events replay: answer failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(b: u8) -> Arc<Vec<u8>> {
        Arc::new(vec![b])
    }

    #[test]
    fn the_ring_keeps_the_last_batches_in_order() {
        let mut r = Ring::new(3);
        for seq in [1, 2, 4, 5] {
            r.record(seq, p(seq as u8));
        }
        let seqs = |v: Vec<(u64, Arc<Vec<u8>>)>| v.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(seqs(r.since(0)), [2, 4, 5], "1 fell out");
        assert_eq!(seqs(r.since(3)), [4, 5], "3 was never sent (a drop)");
        assert_eq!(seqs(r.since(5)), [5]);
        assert!(r.since(6).is_empty());
        assert_eq!(*r.since(4)[0].1, vec![4]);
    }

    #[test]
    fn a_ring_of_zero_keeps_nothing() {
        let mut r = Ring::new(0);
        r.record(1, p(1));
        assert!(r.since(0).is_empty());
    }

    #[test]
    fn only_well_formed_requests_parse() {
        let f = |v: &[&[u8]]| v.iter().map(|x| x.to_vec()).collect::<Vec<_>>();
        assert_eq!(
            parse_request(&f(&[b"id", b"", &7u64.to_be_bytes()])),
            Some(7)
        );
        assert_eq!(parse_request(&f(&[b"id", b"", b"short"])), None);
        assert_eq!(parse_request(&f(&[b"id", b"x", &7u64.to_be_bytes()])), None);
        assert_eq!(parse_request(&f(&[b"id", &7u64.to_be_bytes()])), None);
        assert_eq!(parse_request(&f(&[b"", b"", &7u64.to_be_bytes()])), None);
    }
}
