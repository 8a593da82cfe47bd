//! Client liveness: clients heartbeat (`ping`); one silent for `client_ttl`
//! is dropped with everything that depended on it: its segments are
//! unmounted, replicas there are removed (objects left with none are
//! dropped), and its puts in flight are abandoned with their space freed.

use std::sync::atomic::Ordering;

use super::objects::{ObjectMeta, PendingKind, SHARDS};
use super::service::MasterService;
use crate::types::ClientId;

/// What the master knows about a live client.
#[derive(Debug, Clone)]
pub struct ClientState {
    /// Last heartbeat or mount (ms).
    pub last_seen: u64,
    /// Names of the segments it mounted.
    pub segments: Vec<String>,
}

impl ClientState {
    pub fn new(now: u64) -> Self {
        ClientState {
            last_seen: now,
            segments: Vec::new(),
        }
    }
}

impl MasterService {
    /// Drops clients silent for `client_ttl`; returns how many.
    pub(super) fn expire_clients(&self, now: u64) -> usize {
        let ttl = self.policy.client_ttl;
        let dead: Vec<(ClientId, ClientState)> = {
            let mut clients = self.clients.lock();
            let ids: Vec<ClientId> = clients
                .iter()
                .filter(|(_, c)| c.last_seen.saturating_add(ttl) <= now)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| clients.remove(&id).map(|c| (id, c)))
                .collect()
        };
        if dead.is_empty() {
            return 0;
        }
        for (id, state) in &dead {
            tracing::warn!(client = %format!("{id:032x}"), segments = ?state.segments, "client expired");
            for name in &state.segments {
                self.segments.unmount(name, Some(*id));
            }
        }
        let ids: Vec<ClientId> = dead.iter().map(|(id, _)| *id).collect();
        self.drop_unmounted(&ids, now);
        self.counters
            .expired_clients
            .fetch_add(dead.len() as u64, Ordering::Relaxed);
        dead.len()
    }

    /// Removes every reference to unmounted segments, and abandons puts in
    /// flight by `dead_clients`.
    pub(super) fn drop_unmounted(&self, dead_clients: &[ClientId], now: u64) {
        for i in 0..SHARDS {
            let mut shard = self.objects.lock_shard(i);
            shard
                .map
                .retain(|_, obj| self.keep_live_parts(obj, dead_clients, now));
        }
    }

    /// Strips dead parts from one object; false when nothing usable is left.
    fn keep_live_parts(&self, obj: &mut ObjectMeta, dead_clients: &[ClientId], now: u64) -> bool {
        if obj
            .pending
            .as_ref()
            .is_some_and(|p| dead_clients.contains(&p.client))
        {
            // Its writer is gone, so nothing writes into this space any more.
            self.counters.discarded_puts.fetch_add(1, Ordering::Relaxed);
            if self.discard_pending(obj, Some(now), now) {
                return false;
            }
        }
        let new_version_lost = obj.pending.as_ref().is_some_and(|p| match &p.kind {
            PendingKind::Replacing { replicas, .. } | PendingKind::Replicating { replicas, .. } => {
                replicas.as_slice().iter().any(|r| !r.segment.is_mounted())
            }
            _ => false,
        });
        if new_version_lost {
            self.discard_pending(obj, None, now);
        }
        if obj
            .replicas
            .as_slice()
            .iter()
            .all(|r| r.segment.is_mounted())
        {
            return true;
        }
        if !obj.is_complete() {
            // A put in flight lost one of its targets: abandon it.
            self.discard_pending(obj, None, now);
            return false;
        }
        // Space on an unmounted segment is gone with it; nothing to free.
        obj.replicas.retain(|r| r.segment.is_mounted(), |_| {});
        if obj.replicas.is_empty() {
            self.release_object(obj, now);
            return false;
        }
        true
    }
}
