//! KV events (`crate::master::events`): the leader reports a block stored
//! or gone where it decides so, never in `apply`, which a standby runs
//! too. The reference's cases, no more: a put's end (put, upsert, batch
//! puts) and a file copy's (its PutEnd of a disk replica); a remove of one
//! key; an eviction, from memory or from a disk tier, that leaves no copy
//! of the key. Removals by regex, of everything,
//! by replica clearing, by unmounts and by dropped puts publish nothing.

use super::MasterService;
use crate::master::events::{Kind, Medium, Publisher, Stats};
use crate::master::state::objects::ObjectMeta;

impl MasterService {
    /// Publishes this master's KV events on `publisher`.
    pub(crate) fn with_kv_events(mut self, publisher: Publisher) -> Self {
        self.kv_events = Some(publisher);
        self
    }

    /// This master starts leading (HA): its batch numbers go on from a base
    /// above any its predecessors used (see `Publisher::lead`).
    pub(crate) fn kv_events_lead(&self, epoch_ms: u64) {
        if let Some(p) = &self.kv_events {
            p.lead(epoch_ms);
        }
    }

    /// The publisher's counters, when it publishes.
    pub fn kv_event_stats(&self) -> Option<Stats> {
        self.kv_events.as_ref().map(Publisher::stats)
    }

    /// The events queued so far (see `Publisher::unsent`).
    #[cfg(test)]
    pub(in crate::master) fn kv_events_queued(&self) -> Vec<(Kind, String, Medium)> {
        self.kv_events
            .as_ref()
            .map(Publisher::queued)
            .unwrap_or_default()
    }

    pub(super) fn kv_event(&self, kind: Kind, key: &str, medium: Medium) {
        if let Some(p) = &self.kv_events {
            p.publish(kind, key, medium);
        }
    }

    /// `cpu` while a memory replica exists, else `disk`.
    pub(super) fn medium_of(obj: Option<&ObjectMeta>) -> Medium {
        match obj {
            Some(o) if !o.replicas.is_empty() => Medium::Cpu,
            _ => Medium::Disk,
        }
    }
}
