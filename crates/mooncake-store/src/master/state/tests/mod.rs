//! State-machine tests with a hand-driven clock (milliseconds), by topic.

mod events;
mod eviction;
mod files;
mod groups;
mod hotkeys;
mod membership;
mod offload;
mod puts;
mod release;
mod removal;
mod strategies;
mod tasks;
mod tenants;

use mooncake_common::ErrorCode;

use crate::master::{
    AllocationStrategy, EvictionPolicy, LeasePolicy, MasterService, Policy, TaskPolicy, TickReport,
};
use crate::proto::{Request, Response};
use crate::types::{ClientId, ReplicaDesc, ReplicaPolicy, ReplicaStatus, SegmentInfo, MAX_KEY_LEN};
use crate::types::{TaskStatus, TaskType};

pub(in crate::master) const A: ClientId = 1;
pub(in crate::master) const B: ClientId = 2;
pub(in crate::master) const W: ClientId = 3;
pub(in crate::master) const LEASE: u64 = 100;
pub(in crate::master) const SOFT_PIN: u64 = 1_000;
pub(in crate::master) const CLIENT_TTL: u64 = 500;
pub(in crate::master) const DISCARD: u64 = 300;
pub(in crate::master) const RELEASE: u64 = 600;
/// Time for reads whose lease does not matter to the test.
pub(in crate::master) const NOW: u64 = 0;

pub(in crate::master) fn policy() -> Policy {
    Policy {
        lease: LeasePolicy {
            lease_ttl: LEASE,
            soft_pin_ttl: SOFT_PIN,
        },
        client_ttl: CLIENT_TTL,
        discard_after: DISCARD,
        release_after: RELEASE,
        high_watermark: 0.9,
        eviction_ratio: 0.2,
        evict_soft_pinned: true,
        eviction_policy: EvictionPolicy::Frequency,
        strategy: AllocationStrategy::Random,
        put_fence: true,
    }
}

pub(in crate::master) fn seg(name: &str, base: u64, size: u64) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        base,
        size,
        transport_endpoint: format!("{name}-host:1234"),
    }
}

pub(in crate::master) fn one() -> ReplicaPolicy {
    ReplicaPolicy::default()
}

/// One replica, on segment `name` if it has room.
pub(in crate::master) fn on(name: &str) -> ReplicaPolicy {
    ReplicaPolicy {
        preferred_segment: name.into(),
        ..one()
    }
}

pub(in crate::master) fn put(
    s: &MasterService,
    key: &str,
    len: u64,
    cfg: &ReplicaPolicy,
    now: u64,
) -> Vec<ReplicaDesc> {
    let d = s.put_start(W, key, len, cfg, false, now).unwrap();
    s.put_end(W, key, now).unwrap();
    d
}

/// Runs the timers with segment owner A alive.
pub(in crate::master) fn tick(s: &MasterService, now: u64) -> TickReport {
    let _ = s.ping(A, now);
    s.tick(now)
}

pub(in crate::master) fn used(s: &MasterService) -> u64 {
    s.stats(0).allocated_bytes
}

pub(in crate::master) fn code<T: std::fmt::Debug>(r: mooncake_common::Result<T>) -> ErrorCode {
    r.unwrap_err().code
}

pub(in crate::master) fn addr(d: &ReplicaDesc) -> u64 {
    d.memory().unwrap().buffer_address
}

pub(in crate::master) fn segment_of(d: &ReplicaDesc) -> &str {
    &d.memory().unwrap().segment_name
}

/// One segment "a" of `size` bytes owned by client A.
pub(in crate::master) fn with_segment(size: u64) -> MasterService {
    let s = MasterService::with_policy(policy());
    s.mount_segment(A, &seg("a", 0x10_000, size), 0).unwrap();
    s
}

/// Segment "a" owned by A and "b" owned by B, both alive.
pub(in crate::master) fn two_owners() -> MasterService {
    let s = with_segment(1 << 20);
    s.mount_segment(B, &seg("b", 1 << 40, 1 << 20), 0).unwrap();
    s
}

/// The tables, for the tests of other layers that check the state a log
/// or a snapshot leaves (nothing else outside `state` reaches them).
impl MasterService {
    pub(in crate::master) fn segments_table(&self) -> &super::segments::SegmentTable {
        &self.segments
    }

    pub(in crate::master) fn objects_table(&self) -> &super::objects::ObjectMap {
        &self.objects
    }
}
