//! What drain jobs (`serve::drain_jobs`) read and set in the tables: segment
//! status, fill, and the objects with a replica on a segment.

use super::MasterService;
use crate::master::state::segments::SegmentStatus;

/// An object with a replica on a segment being drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DrainCandidate {
    pub(crate) key: String,
    pub(crate) size: u64,
    /// Every segment holding one of its replicas.
    pub(crate) segments: Vec<String>,
    /// Hard-pinned, or a put or transfer in flight: not moved now.
    pub(crate) blocked: bool,
}

impl MasterService {
    /// `None` when `name` is not mounted.
    pub(crate) fn segment_status(&self, name: &str) -> Option<SegmentStatus> {
        self.segments.get(name).map(|s| s.status())
    }

    /// False when `name` is not mounted.
    pub(crate) fn set_segment_status(&self, name: &str, status: SegmentStatus) -> bool {
        match self.segments.get(name) {
            Some(s) => {
                s.set_status(status);
                true
            }
            None => false,
        }
    }

    /// (allocated, capacity) of a mounted segment.
    pub(crate) fn segment_fill(&self, name: &str) -> Option<(u64, u64)> {
        self.segments.get(name).map(|s| (s.used(), s.capacity()))
    }

    /// Names of every mounted segment.
    pub(crate) fn segment_names(&self) -> Vec<String> {
        self.segments
            .all()
            .iter()
            .map(|s| s.info.name.clone())
            .collect()
    }

    /// The complete objects with a replica on any of `segments`.
    pub(crate) fn objects_on(&self, segments: &[String]) -> Vec<DrainCandidate> {
        let mut out = Vec::new();
        for shard in self.objects.shards() {
            for (key, obj) in shard.iter() {
                if !obj.is_complete() {
                    continue;
                }
                let names: Vec<String> = obj
                    .replicas
                    .as_slice()
                    .iter()
                    .map(|p| p.segment.info.name.clone())
                    .collect();
                if !names.iter().any(|n| segments.contains(n)) {
                    continue;
                }
                out.push(DrainCandidate {
                    key: key.to_string(),
                    size: obj.size,
                    segments: names,
                    blocked: obj.is_hard_pinned() || obj.pending.is_some(),
                });
            }
        }
        out
    }
}
