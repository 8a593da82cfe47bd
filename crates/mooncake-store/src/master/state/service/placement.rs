//! Where a new version's replicas go: the allocation strategy's segment
//! score, and `local_first`'s order of the writer's host first.

use std::borrow::Cow;

use mooncake_common::{ErrorCode, Result};

use super::MasterService;
use crate::master::config::policy::AllocationStrategy;
use crate::master::state::segments::local_first::{host_id, host_ordered};
use crate::master::state::segments::{Placement, Segment};
use crate::types::{ClientId, ReplicaPolicy};

impl MasterService {
    /// Places `len` bytes per replica (reserving the ranges); a failure for
    /// lack of space asks for an eviction round.
    pub(super) fn place(&self, len: u64, cfg: &ReplicaPolicy, now: u64) -> Result<Vec<Placement>> {
        self.segments
            .place_ranked(
                len,
                cfg,
                self.policy.strategy,
                &|s| self.segment_score(s),
                &mut |s, n| s.allocate(n),
                now,
            )
            .inspect_err(|e| {
                if e.code == ErrorCode::NO_AVAILABLE_HANDLE {
                    self.eviction.request();
                }
            })
    }

    /// How a ranked strategy ranks `seg` (higher first).
    pub(super) fn segment_score(&self, seg: &Segment) -> f64 {
        match self.policy.strategy {
            AllocationStrategy::SsdFreeRatioFirst => self.disk.tier_free_ratio(seg.owner),
            _ => seg.free_ratio(),
        }
    }

    /// With `local_first` (or a put asking `prefer_alloc_in_same_node`), a
    /// single-replica put by `writer` tries the
    /// segments of the writer's host first, then the other hosts' (after
    /// any segments the caller prefers). The writer's host is that of a
    /// segment it mounted: the reference's writers also state it with each
    /// put, ours do not, so a writer without a segment is placed at random.
    pub(super) fn local_first<'c>(
        &self,
        cfg: &'c ReplicaPolicy,
        writer: ClientId,
        key: &str,
    ) -> Cow<'c, ReplicaPolicy> {
        // `prefer_alloc_in_same_node` asks for the same order for one put
        // whatever the strategy (the clients allow it with one replica only).
        let host_first =
            self.policy.strategy == AllocationStrategy::LocalFirst || cfg.prefer_alloc_in_same_node;
        if !host_first || cfg.replica_num != 1 {
            return Cow::Borrowed(cfg);
        }
        let segments = self.segments.all();
        let writer_host = segments
            .iter()
            .filter(|s| s.owner == writer)
            .find_map(|s| host_id(&s.info.name));
        let Some(writer_host) = writer_host else {
            return Cow::Borrowed(cfg);
        };
        let names: Vec<&str> = segments.iter().map(|s| s.info.name.as_str()).collect();
        let ordered = host_ordered(&names, writer_host, key);
        if ordered.is_empty() {
            return Cow::Borrowed(cfg);
        }
        let mut cfg = cfg.clone();
        for name in ordered {
            if !cfg.preferred_segments.contains(&name) && cfg.preferred_segment != name {
                cfg.preferred_segments.push(name);
            }
        }
        Cow::Owned(cfg)
    }
}
