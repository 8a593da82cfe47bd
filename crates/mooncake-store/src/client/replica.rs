//! Which replica to read: this process's own memory (a plain memcpy, no
//! engine), then a segment on this host (the engine's shared-memory path),
//! then anything else (TCP). Pure logic over descriptors.

use crate::types::{MemoryDescriptor, ReplicaDesc, ReplicaStatus};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Locality {
    Own,
    SameHost,
    Remote,
}

/// Host part of an engine endpoint `host:port` (`[v6]:port` too).
pub(crate) fn endpoint_host(endpoint: &str) -> &str {
    if let Some(rest) = endpoint.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match endpoint.rsplit_once(':') {
        Some((host, _)) if !host.contains(':') => host,
        _ => endpoint,
    }
}

/// Where a replica lives relative to a client whose engine is `own_endpoint`
/// on `own_host`.
pub(crate) fn locality(desc: &MemoryDescriptor, own_endpoint: &str, own_host: &str) -> Locality {
    if desc.transport_endpoint == own_endpoint {
        Locality::Own
    } else if endpoint_host(&desc.transport_endpoint) == own_host {
        Locality::SameHost
    } else {
        Locality::Remote
    }
}

/// The complete memory replicas, best first. The order among equally good
/// replicas is kept (the master already spreads load).
pub(crate) fn rank(
    replicas: &[ReplicaDesc],
    own_endpoint: &str,
    own_host: &str,
) -> Vec<MemoryDescriptor> {
    let mut mem: Vec<&MemoryDescriptor> = replicas
        .iter()
        .filter(|r| r.status == ReplicaStatus::Complete)
        .filter_map(ReplicaDesc::memory)
        .collect();
    mem.sort_by_key(|d| locality(d, own_endpoint, own_host));
    mem.into_iter().cloned().collect()
}

/// This client's place in the cluster, for choosing how bytes move: its
/// engine endpoint and host, the segments it mounted, and whether replicas
/// in them are copied with a plain memcpy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Site {
    pub endpoint: String,
    pub host: String,
    /// `(base, len)` of each of this client's own segments.
    pub segments: Vec<(u64, u64)>,
    /// `MC_STORE_MEMCPY`; off, own replicas go through the engine too.
    pub memcpy: bool,
}

impl Site {
    /// Whether `[addr, addr+len)` lies inside one of this client's segments.
    pub(super) fn owns(&self, addr: u64, len: u64) -> bool {
        self.segments.iter().any(|&(base, size)| {
            addr >= base
                && addr
                    .checked_add(len)
                    .is_some_and(|end| base.checked_add(size).is_some_and(|limit| end <= limit))
        })
    }

    /// Whether this process copies replica `d` itself, with a memcpy: it is
    /// in one of its own segments, and memcpy is on.
    pub(super) fn is_own(&self, d: &MemoryDescriptor) -> bool {
        self.memcpy
            && locality(d, &self.endpoint, &self.host) == Locality::Own
            && self.owns(d.buffer_address, d.size)
    }

    /// The complete memory replicas, best first (see [`rank`]).
    pub(super) fn rank(&self, replicas: &[ReplicaDesc]) -> Vec<MemoryDescriptor> {
        rank(replicas, &self.endpoint, &self.host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DiskDescriptor, ReplicaKind};

    fn mem(endpoint: &str, status: ReplicaStatus) -> ReplicaDesc {
        ReplicaDesc {
            kind: ReplicaKind::Memory(MemoryDescriptor {
                segment_name: endpoint.into(),
                transport_endpoint: endpoint.into(),
                buffer_address: 0x1000,
                size: 10,
                suspected: false,
            }),
            status,
        }
    }

    #[test]
    fn own_then_same_host_then_remote() {
        let replicas = vec![
            mem("far:1", ReplicaStatus::Complete),
            ReplicaDesc {
                kind: ReplicaKind::Disk(DiskDescriptor {
                    file_path: "/x".into(),
                    object_size: 10,
                }),
                status: ReplicaStatus::Complete,
            },
            mem("me:2", ReplicaStatus::Complete),
            mem("me:1", ReplicaStatus::Complete),
            mem("me:3", ReplicaStatus::Processing),
        ];
        let order: Vec<String> = rank(&replicas, "me:1", "me")
            .into_iter()
            .map(|d| d.transport_endpoint)
            .collect();
        assert_eq!(order, ["me:1", "me:2", "far:1"]);
    }

    #[test]
    fn own_replicas_lie_in_own_segments_with_memcpy_on() {
        let mut site = Site {
            endpoint: "me:1".into(),
            host: "me".into(),
            segments: vec![(0x1000, 0x100), (0x4000, 0x10)],
            memcpy: true,
        };
        let at = |endpoint: &str, addr: u64, size: u64| MemoryDescriptor {
            segment_name: endpoint.into(),
            transport_endpoint: endpoint.into(),
            buffer_address: addr,
            size,
            suspected: false,
        };
        assert!(site.is_own(&at("me:1", 0x1000, 0x100)));
        assert!(site.is_own(&at("me:1", 0x4008, 8)));
        assert!(
            !site.is_own(&at("me:1", 0x10ff, 2)),
            "runs past the segment"
        );
        assert!(!site.is_own(&at("me:1", 0x2000, 1)), "between segments");
        assert!(!site.is_own(&at("me:2", 0x1000, 1)), "a peer on this host");
        assert!(!site.owns(u64::MAX, 2), "wraps around");
        assert!(site.owns(0x1000, 0));
        site.memcpy = false;
        assert!(!site.is_own(&at("me:1", 0x1000, 1)), "memcpy off");
        assert!(site.owns(0x1000, 1), "still our segment");
    }

    #[test]
    fn hosts_of_endpoints() {
        assert_eq!(endpoint_host("a:1"), "a");
        assert_eq!(endpoint_host("a"), "a");
        assert_eq!(endpoint_host("[::1]:5"), "::1");
        assert_eq!(endpoint_host("fe80::1"), "fe80::1");
    }
}
