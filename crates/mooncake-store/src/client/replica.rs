//! Which replica to read: this process's own memory (a plain memcpy, no
//! engine), then a segment on this host (the engine's shared-memory path),
//! then anything else (TCP). Pure logic over descriptors.

use crate::types::{MemoryDescriptor, ReplicaDesc, ReplicaStatus};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Locality {
    Own,
    SameHost,
    Remote,
}

/// Host part of an engine endpoint `host:port` (`[v6]:port` too).
pub fn endpoint_host(endpoint: &str) -> &str {
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
pub fn locality(desc: &MemoryDescriptor, own_endpoint: &str, own_host: &str) -> Locality {
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
pub fn rank(replicas: &[ReplicaDesc], own_endpoint: &str, own_host: &str) -> Vec<MemoryDescriptor> {
    let mut mem: Vec<&MemoryDescriptor> = replicas
        .iter()
        .filter(|r| r.status == ReplicaStatus::Complete)
        .filter_map(ReplicaDesc::memory)
        .collect();
    mem.sort_by_key(|d| locality(d, own_endpoint, own_host));
    mem.into_iter().cloned().collect()
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
    fn hosts_of_endpoints() {
        assert_eq!(endpoint_host("a:1"), "a");
        assert_eq!(endpoint_host("a"), "a");
        assert_eq!(endpoint_host("[::1]:5"), "::1");
        assert_eq!(endpoint_host("fe80::1"), "fe80::1");
    }
}
