//! The tier service: how a reader gets a disk-only object from the
//! storage client whose SSD tier holds it (the reference's
//! `batch_get_offload_object` / `release_offload_buffer`).
//!
//! The reader asks the owner to `Stage` some keys; the owner reads them
//! from its tier (checksums verified) into its staging buffer, an
//! engine-managed shared-memory buffer, and answers with their addresses.
//! The reader pulls the bytes with the transfer engine (or copies them out
//! of the shared mapping on the same host), then `Release`s the batch.
//! Bytes never pass through the master, nor through this protocol.

use std::collections::HashMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use crate::proto::frame::{decode_payload, encode_frame};
use crate::proto::messages::wire_enum;
use crate::proto::wire::{wire_struct, Decode, DecodeError, Encode, Reader};
use crate::rpc::{connect_any, rpc_fail, ClientOptions, Connector, Handler, Pool};

/// One object staged for a reader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedObject {
    pub address: u64,
    pub size: u64,
}

/// A `Stage` answer: one result per key, all held until `Release`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedBatch {
    pub batch_id: u64,
    /// The owner's engine endpoint (the segment to read from).
    pub endpoint: String,
    pub objects: Vec<Result<StagedObject>>,
}

wire_struct!(StagedObject { address, size });
wire_struct!(StagedBatch {
    batch_id,
    endpoint,
    objects
});

wire_enum! {
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum TierRequest<'a> {
        1 => Stage { keys: Vec<&'a str> },
        2 => Release { batch_id: u64 },
    }
}

wire_enum! {
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum TierResponse {
        1 => Staged { result: Result<StagedBatch> },
        2 => Unit { result: Result<()> },
    }
}

/// What the owner side does with the calls.
pub(crate) trait TierServe: Send + Sync + 'static {
    fn stage(&self, keys: &[&str]) -> Result<StagedBatch>;
    fn release(&self, batch_id: u64);
}

/// The tier protocol on the RPC server loop.
pub(crate) struct TierHandler<S>(pub Arc<S>);

impl<S: TierServe> Handler for TierHandler<S> {
    type Request<'a> = TierRequest<'a>;
    type Response = TierResponse;
    type Session = ();
    const OVERSIZED_ANSWER: ErrorCode = ErrorCode::SERIALIZE_FAIL;

    fn session(&self, _: &crate::rpc::Peer) {}

    fn handle(&self, _: &mut (), req: TierRequest<'_>) -> TierResponse {
        match req {
            TierRequest::Stage { keys } => TierResponse::Staged {
                result: self.0.stage(&keys),
            },
            TierRequest::Release { batch_id } => {
                self.0.release(batch_id);
                TierResponse::Unit { result: Ok(()) }
            }
        }
    }

    fn failure(&self, error: Error) -> TierResponse {
        TierResponse::Unit { result: Err(error) }
    }
}

struct Peer {
    addr: String,
}

impl Connector for Peer {
    fn peer(&self) -> String {
        format!("tier service {}", self.addr)
    }

    fn connect(&self, timeout: Duration) -> Result<TcpStream> {
        let addrs: Vec<_> = self
            .addr
            .to_socket_addrs()
            .map_err(|e| rpc_fail(format!("tier service {}: {e}", self.addr)))?
            .collect();
        connect_any(&addrs, timeout).map_err(|e| rpc_fail(format!("{}: {e}", self.addr)))
    }
}

const OPTIONS: ClientOptions = ClientOptions {
    connect_timeout: Duration::from_secs(5),
    call_timeout: Duration::from_secs(60),
    max_idle: 8,
    read_buffer: 8 << 10,
    poll: Duration::ZERO,
    drop_idle_on_failure: true,
};

/// A staged batch to hand back: (tier service, its pool, batch id).
type Release = (String, Arc<Pool<Peer>>, u64);

/// Connections to other storage clients' tier services, one pool each.
#[derive(Default)]
pub(crate) struct TierPeers {
    pools: Mutex<HashMap<String, Arc<Pool<Peer>>>>,
    /// Releases waiting for the releaser thread (started on first use).
    releases: Mutex<Option<Sender<Release>>>,
    /// Stage calls sent to other clients' tier services (reads of their
    /// disk-only objects), the reference's `get_offload_rpc_read_count`.
    reads: std::sync::atomic::AtomicU64,
}

impl TierPeers {
    fn pool(&self, addr: &str) -> Arc<Pool<Peer>> {
        self.pools
            .lock()
            .entry(addr.to_string())
            .or_insert_with(|| {
                Arc::new(Pool::new(
                    Peer {
                        addr: addr.to_string(),
                    },
                    OPTIONS,
                ))
            })
            .clone()
    }

    fn call(&self, addr: &str, req: &TierRequest<'_>) -> Result<TierResponse> {
        call_pool(&self.pool(addr), req)
    }

    /// Stage calls sent so far.
    pub(crate) fn read_count(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn stage(&self, addr: &str, keys: &[&str]) -> Result<StagedBatch> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.call(
            addr,
            &TierRequest::Stage {
                keys: keys.to_vec(),
            },
        )? {
            TierResponse::Staged { result } => {
                let batch = result?;
                if batch.objects.len() != keys.len() {
                    return Err(rpc_fail(format!(
                        "tier service {addr} staged {} of {} keys",
                        batch.objects.len(),
                        keys.len()
                    )));
                }
                Ok(batch)
            }
            TierResponse::Unit { result } => Err(result
                .err()
                .unwrap_or_else(|| rpc_fail("tier service answered Stage with Unit"))),
        }
    }

    /// Hands a staged batch back to its owner. The reader's bytes are
    /// already copied, so nothing waits for the answer: a background
    /// thread sends the `Release` (in order, on its own connections) while
    /// the read returns. A release that never arrives is freed by the
    /// owner's TTL sweep.
    pub(crate) fn release(&self, addr: &str, batch_id: u64) {
        let pool = self.pool(addr);
        let mut releases = self.releases.lock();
        if releases.is_none() {
            *releases = spawn_releaser();
        }
        let job = (addr.to_string(), pool, batch_id);
        let job = match releases.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(e) => e.0,
            },
            None => job,
        };
        // No releaser thread: release in this thread.
        drop(releases);
        release_now(&job.0, &job.1, job.2);
    }
}

fn call_pool(pool: &Pool<Peer>, req: &TierRequest<'_>) -> Result<TierResponse> {
    let mut frame = Vec::new();
    encode_frame(req, &mut frame)
        .map_err(|e| Error::new(ErrorCode::SERIALIZE_FAIL, e.to_string()))?;
    pool.call(&frame, |answer| Ok(decode_payload::<TierResponse>(answer)?))
}

fn release_now(addr: &str, pool: &Pool<Peer>, batch_id: u64) {
    if let Err(e) = call_pool(pool, &TierRequest::Release { batch_id }) {
        tracing::debug!(addr, error = %e, "release of a staged batch failed (its TTL frees it)");
    }
}

/// The thread that sends releases; it ends when its `TierPeers` drops
/// (after sending what was queued).
fn spawn_releaser() -> Option<Sender<Release>> {
    let (tx, rx) = channel::<Release>();
    let spawned = std::thread::Builder::new()
        .name("mooncake-tier-release".into())
        .spawn(move || {
            for (addr, pool, batch_id) in rx {
                release_now(&addr, &pool, batch_id);
            }
        });
    match spawned {
        Ok(_) => Some(tx),
        Err(e) => {
            tracing::debug!(error = %e, "no releaser thread: staged batches are released inline");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let req = TierRequest::Stage {
            keys: vec!["a", "b"],
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        let back = TierRequest::decode(&mut Reader::new(&out)).unwrap();
        assert_eq!(back, req);
        let resp = TierResponse::Staged {
            result: Ok(StagedBatch {
                batch_id: 7,
                endpoint: "h:1".into(),
                objects: vec![
                    Ok(StagedObject {
                        address: 4096,
                        size: 10,
                    }),
                    Err(Error::new(ErrorCode::OBJECT_NOT_FOUND, "gone")),
                ],
            }),
        };
        let mut out = Vec::new();
        resp.encode(&mut out);
        assert_eq!(TierResponse::decode(&mut Reader::new(&out)).unwrap(), resp);
    }
}
