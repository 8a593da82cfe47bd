//! HA mode: finding the leading master through the election backend,
//! with lookups shared between the calls that fail at the same time.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mooncake_common::Result;
use parking_lot::Mutex;

use super::term::Terms;
use crate::ha;
use crate::rpc::resolve;
use crate::rpc::rpc_fail;

/// How long one leader lookup's outcome stands. While no master leads (a
/// failover takes seconds) every call fails, and each would otherwise start
/// a lookup of its own: a thread, a runtime and a connection to the
/// coordination service per call.
const LOOKUP_REUSE: Duration = Duration::from_millis(500);
/// How often a lookup that found a Lease without holder asks again: the
/// pace failing calls look the leader up at anyway ([`LOOKUP_REUSE`]).
const LEADERLESS_POLL: Duration = Duration::from_millis(500);
/// A failed lookup (no leader yet, during a failover) is reused only this
/// long, so that a new leader is found within a few of these.
const FAILED_LOOKUP_REUSE: Duration = Duration::from_millis(20);

/// HA mode: the cluster whose leader is the master, and where it is found.
pub(super) struct Election {
    pub(super) backend: ha::ElectionBackend,
    pub(super) cluster: String,
    /// The last lookup: when it ended, and what it found. Locked for the
    /// whole lookup, so callers that need one at once share it.
    pub(super) last: Mutex<Option<(Instant, Result<Vec<SocketAddr>>)>>,
    /// The highest term a lookup found (`super::term`).
    pub(super) terms: Terms,
}

impl Election {
    pub(super) fn new(backend: ha::ElectionBackend, cluster: String) -> Election {
        Election {
            backend,
            cluster,
            last: Mutex::new(None),
            terms: Terms::default(),
        }
    }

    /// Looks the leader up now: its socket addresses; its term is learned.
    /// On a Lease, while it has no holder (a failover between the old
    /// holder's expiry and the new one's win), it polls for up to `wait`.
    /// `RPC_FAIL` when none leads, when the one found leads an older term
    /// than this client has seen (a stale answer), or when the coordination
    /// service is out of reach (to the caller, each means the master cannot
    /// be reached).
    pub(super) fn look_up(&self, wait: Duration) -> Result<Vec<SocketAddr>> {
        let cluster = &self.cluster;
        let deadline = Instant::now() + wait;
        let poll = matches!(self.backend, ha::ElectionBackend::K8s(..));
        loop {
            match ha::find_leader(&self.backend, cluster) {
                Ok(Some(leader)) => {
                    if let Err(seen) = self.terms.learn(leader.term) {
                        return Err(rpc_fail(format!(
                            "the coordination service names {} as leader of cluster {cluster:?} \
                             in term {}, older than term {seen} this client has seen",
                            leader.address, leader.term
                        )));
                    }
                    return resolve(&leader.address, "master").map_err(|e| rpc_fail(e.context));
                }
                Ok(None) if poll && Instant::now() + LEADERLESS_POLL < deadline => {
                    std::thread::sleep(LEADERLESS_POLL)
                }
                Ok(None) => return Err(rpc_fail(format!("no master leads cluster {cluster:?}"))),
                Err(e) => {
                    return Err(rpc_fail(format!(
                        "cannot look the leader of cluster {cluster:?} up: {e}"
                    )))
                }
            }
        }
    }

    /// Drops the last lookup, so that the next one asks the coordination
    /// service again (a master refused this client's term).
    pub(super) fn forget(&self) {
        *self.last.lock() = None;
    }

    /// The leader's addresses, as found by a recent lookup or by a new one
    /// (waiting up to `wait` for one). A lookup is reused for
    /// [`LOOKUP_REUSE`] when it found a leader other than `failing` (the
    /// address that just refused), for [`FAILED_LOOKUP_REUSE`] when it
    /// found none.
    pub(super) fn leader(&self, wait: Duration, failing: &[SocketAddr]) -> Result<Vec<SocketAddr>> {
        let mut last = self.last.lock();
        if let Some((at, found)) = &*last {
            let fresh = match found {
                Ok(addrs) => addrs != failing && at.elapsed() < LOOKUP_REUSE,
                Err(_) => at.elapsed() < FAILED_LOOKUP_REUSE,
            };
            if fresh {
                return found.clone();
            }
        }
        let found = self.look_up(wait);
        *last = Some((Instant::now(), found.clone()));
        found
    }
}
