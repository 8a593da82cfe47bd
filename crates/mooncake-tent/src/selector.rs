//! The transport selector: for one request, which transports may carry it,
//! best first, from what both ends advertise. Pure logic.
//!
//! - `shm`: the peer is on this host (same host id) and the target range
//!   lies in one of its shared buffers: one mapped copy, no spraying; the
//!   local side need not be registered.
//! - `tcp`: the peer advertises at least one TCP endpoint: slices sprayed
//!   over its paths. Local memory the engine has not registered is staged
//!   through a registered host buffer (the "no direct path" case on a host
//!   without device memory).
//!
//! The order is the configured preference (`transports` of the matching
//! policy, default `["shm", "tcp"]`); later entries are the failover order.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    Shm,
    Tcp,
}

impl TransportKind {
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
        }
    }

    /// A transport name of the configuration; names this build has no
    /// transport for (`rdma`, `nvlink`, ...) are `None`.
    pub fn parse(name: &str) -> Option<TransportKind> {
        match name.trim().to_ascii_lowercase().as_str() {
            "shm" => Some(TransportKind::Shm),
            "tcp" => Some(TransportKind::Tcp),
            _ => None,
        }
    }
}

/// What both ends offer for one request.
#[derive(Clone, Copy, Debug, Default)]
pub struct Offer {
    /// The peer runs on this host (same boot, same PID namespace).
    pub same_host: bool,
    /// The target range lies in a buffer the peer shares through memory.
    pub target_shared: bool,
    /// TCP endpoints of the peer this engine can reach.
    pub tcp_paths: usize,
    /// The local range lies in memory registered with the engine.
    pub local_registered: bool,
}

/// One way to carry a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub transport: TransportKind,
    /// Through a registered host staging buffer.
    pub staged: bool,
}

/// The transports of `preference` that can carry a request with `offer`,
/// in that order. Empty: no path (the caller reports it).
pub fn select(preference: &[TransportKind], offer: &Offer) -> Vec<Choice> {
    let mut out = Vec::new();
    for &t in preference {
        if out.iter().any(|c: &Choice| c.transport == t) {
            continue;
        }
        let fits = match t {
            TransportKind::Shm => offer.same_host && offer.target_shared,
            TransportKind::Tcp => offer.tcp_paths > 0,
        };
        if fits {
            out.push(Choice {
                transport: t,
                staged: t == TransportKind::Tcp && !offer.local_registered,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use TransportKind::*;

    const BOTH: [TransportKind; 2] = [Shm, Tcp];

    fn offer(same_host: bool, shared: bool, paths: usize, registered: bool) -> Offer {
        Offer {
            same_host,
            target_shared: shared,
            tcp_paths: paths,
            local_registered: registered,
        }
    }

    fn direct(t: TransportKind) -> Choice {
        Choice {
            transport: t,
            staged: false,
        }
    }

    #[test]
    fn same_host_shared_prefers_shm_then_tcp() {
        assert_eq!(
            select(&BOTH, &offer(true, true, 2, true)),
            vec![direct(Shm), direct(Tcp)]
        );
    }

    #[test]
    fn other_host_is_tcp() {
        assert_eq!(
            select(&BOTH, &offer(false, true, 2, true)),
            vec![direct(Tcp)]
        );
        // Same host, but the target is not in shared memory.
        assert_eq!(
            select(&BOTH, &offer(true, false, 1, true)),
            vec![direct(Tcp)]
        );
    }

    #[test]
    fn unregistered_local_is_staged_over_tcp_not_over_shm() {
        assert_eq!(
            select(&BOTH, &offer(true, true, 1, false)),
            vec![
                direct(Shm),
                Choice {
                    transport: Tcp,
                    staged: true
                }
            ]
        );
    }

    #[test]
    fn preference_order_and_no_path() {
        assert_eq!(
            select(&[Tcp, Shm], &offer(true, true, 1, true)),
            vec![direct(Tcp), direct(Shm)]
        );
        assert_eq!(select(&[Tcp], &offer(true, true, 0, true)), vec![]);
        assert!(select(&BOTH, &offer(false, false, 0, true)).is_empty());
        assert_eq!(select(&[Tcp, Tcp], &offer(false, false, 1, true)).len(), 1);
    }

    #[test]
    fn names() {
        assert_eq!(TransportKind::parse(" TCP "), Some(Tcp));
        assert_eq!(TransportKind::parse("shm"), Some(Shm));
        assert_eq!(TransportKind::parse("rdma"), None);
        assert_eq!(Shm.name(), "shm");
    }
}
