//! Segments and clients: heartbeats, mount and unmount, client expiry,
//! and what each takes with it.
//!
//! A client silent for `client_ttl` is dropped with everything that
//! depended on it: its segments are unmounted, replicas there are removed
//! (objects left with none are dropped), and its puts in flight are
//! abandoned with their space freed.

use std::sync::atomic::Ordering;

use mooncake_common::{Error, ErrorCode, Result};

use super::apply::Fate;
use super::{MasterService, MasterStats, SegmentSummary};
use crate::master::state::mutation::{Call, ClientOp, ObjectOp, SegmentOp, Segments};
use crate::master::state::objects::{ObjectMeta, PendingKind};
use crate::types::{ClientId, SegmentInfo};

impl MasterService {
    /// Heartbeat. `CLIENT_NOT_FOUND` when the client was unknown (first
    /// contact, expired, or master restarted): it is registered now and
    /// should mount its segments again.
    pub(super) fn ping_in(&self, call: &mut Call, client: ClientId, now: u64) -> Result<()> {
        let mut clients = self.clients.lock();
        if clients.touch(client, now) {
            drop(clients);
            self.segments.verify_owner(client);
            self.segments.clear_suspicion(client);
            return Ok(());
        }
        self.apply_clients(call, &mut clients, ClientOp::Register { client, now });
        Err(Error::new(
            ErrorCode::CLIENT_NOT_FOUND,
            "client was not registered; remount its segments",
        ))
    }

    /// Mounts a segment. Mounting the same segment again (same owner, base
    /// and size) is accepted, so a client can re-register after a master restart.
    pub(super) fn mount_segment_in(
        &self,
        call: &mut Call,
        client: ClientId,
        seg: &SegmentInfo,
        now: u64,
    ) -> Result<()> {
        {
            let mut w = self.segments.write();
            if w.check_mount(client, seg)? {
                let id = w.next_id();
                let mount = SegmentOp::Mount {
                    id,
                    owner: client,
                    info: seg,
                };
                self.apply_segments(call, &mut w, mount);
                if let Some(new) = w.get(&seg.name) {
                    new.start_ramp(now);
                }
            }
        }
        let mut clients = self.clients.lock();
        if !clients.touch(client, now) {
            self.apply_clients(call, &mut clients, ClientOp::Register { client, now });
        }
        drop(clients);
        self.segments.verify_owner(client);
        Ok(())
    }

    /// Unmounts one of the client's segments; objects with replicas there
    /// lose them (and are dropped when none is left).
    pub(super) fn unmount_segment_in(
        &self,
        call: &mut Call,
        client: ClientId,
        name: &str,
        now: u64,
    ) -> Result<()> {
        {
            let mut w = self.segments.write();
            let seg = w.get(name).ok_or_else(|| {
                Error::new(
                    ErrorCode::SEGMENT_NOT_FOUND,
                    format!("segment {name:?} is not mounted"),
                )
            })?;
            if seg.owner != client {
                return Err(Error::new(
                    ErrorCode::ILLEGAL_CLIENT,
                    format!("segment {name:?} belongs to another client"),
                ));
            }
            self.apply_segments(call, &mut w, SegmentOp::Unmount { name });
        }
        self.clients.lock().touch(client, now);
        self.drop_unmounted(call, &[], now);
        Ok(())
    }

    /// Marks the segments of clients silent for `suspect_after` (but not
    /// yet for `client_ttl`) Suspected, and only theirs. Volatile, as the
    /// last contact it is derived from: the leader's timer sets it.
    pub(super) fn suspect_clients(&self, now: u64) {
        let suspects = self.clients.lock().suspected(self.policy.client_ttl, now);
        self.segments.suspect_owners(&suspects);
    }

    /// How long a newly mounted segment takes to get its full share of
    /// new replicas, ms (0: at once; see `segments::ramp`).
    pub fn with_segment_ramp(self, ms: u64) -> Self {
        self.segments.set_ramp(ms);
        self
    }

    /// Silence after which a client is Suspected (0: never).
    pub fn with_suspect_after(self, ms: u64) -> Self {
        self.clients.lock().set_suspect_after(ms);
        self
    }

    /// Drops clients silent for `client_ttl`; returns how many.
    pub(super) fn expire_clients(&self, call: &mut Call, now: u64) -> usize {
        let dead = {
            let mut clients = self.clients.lock();
            let dead = clients.silent(self.policy.client_ttl, now);
            for &client in &dead {
                self.apply_clients(call, &mut clients, ClientOp::Expire { client });
            }
            dead
        };
        self.retire_clients(call, &dead, now)
    }

    /// Unmounts what the `dead` clients (already expired) had mounted.
    pub(super) fn retire_clients(&self, call: &mut Call, dead: &[ClientId], now: u64) -> usize {
        if dead.is_empty() {
            return 0;
        }
        for &id in dead {
            let mut w = self.segments.write();
            let segments = w.owned_by(id);
            let names: Vec<&str> = segments.iter().map(|s| s.info.name.as_str()).collect();
            tracing::warn!(client = %format!("{id:032x}"), segments = ?names, "client expired");
            for name in names {
                self.apply_segments(call, &mut w, SegmentOp::Unmount { name });
            }
        }
        self.drop_unmounted(call, dead, now);
        self.unmount_tiers(call, dead);
        self.counters
            .expired_clients
            .fetch_add(dead.len() as u64, Ordering::Relaxed);
        dead.len()
    }

    /// Removes every reference to unmounted segments, and abandons puts in
    /// flight by `dead_clients`.
    fn drop_unmounted(&self, call: &mut Call, dead_clients: &[ClientId], now: u64) {
        for mut shard in self.objects.shards() {
            self.objects.retain(&mut shard, |key, obj| {
                self.keep_live_parts(call, key, obj, dead_clients, now)
            });
        }
    }

    /// Strips dead parts from one object; false when nothing usable is left.
    fn keep_live_parts(
        &self,
        call: &mut Call,
        key: &str,
        obj: &mut ObjectMeta,
        dead_clients: &[ClientId],
        now: u64,
    ) -> bool {
        let mut apply =
            |obj: &mut ObjectMeta, op| self.apply_object(call, key, obj, op) == Fate::Keep;
        if obj
            .pending
            .as_ref()
            .is_some_and(|p| dead_clients.contains(&p.client))
        {
            // Its writer is gone, so nothing writes into this space any more.
            self.counters.discarded_puts.fetch_add(1, Ordering::Relaxed);
            let discard = ObjectOp::DiscardPut {
                free_at: Some(now),
                now,
            };
            if !apply(obj, discard) {
                return false;
            }
        }
        let new_version_lost = obj.pending.as_ref().is_some_and(|p| match &p.kind {
            PendingKind::Replacing { replicas, .. } | PendingKind::Replicating { replicas, .. } => {
                replicas.as_slice().iter().any(|r| !r.segment.is_mounted())
            }
            _ => false,
        });
        if new_version_lost && !apply(obj, ObjectOp::DiscardPut { free_at: None, now }) {
            return false;
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
            return apply(obj, ObjectOp::DiscardPut { free_at: None, now });
        }
        // Space on an unmounted segment is gone with it; nothing to free.
        let drop = ObjectOp::DropReplicas {
            on: Segments::Unmounted,
            free_at: now,
            now,
        };
        let _ = apply(obj, drop);
        if obj.replicas.is_empty() {
            return apply(obj, ObjectOp::Remove { now });
        }
        true
    }

    pub fn segment_summaries(&self) -> Vec<SegmentSummary> {
        let mut v: Vec<SegmentSummary> = self
            .segments
            .all()
            .iter()
            .map(|s| SegmentSummary {
                id: s.id,
                name: s.info.name.clone(),
                endpoint: s.info.transport_endpoint.clone(),
                base: s.info.base,
                used: s.used(),
                capacity: s.capacity(),
                owner: s.owner,
                status: s.status().name(),
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn stats(&self, now: u64) -> MasterStats {
        let (allocated_bytes, capacity_bytes) = self.segments.usage();
        let s = MasterStats {
            allocated_bytes,
            capacity_bytes,
            segment_count: self.segments.all().len() as u64,
            active_clients: self.clients.lock().len() as u64,
            ..Default::default()
        };
        let counts = self.objects.counts(now);
        MasterStats {
            key_count: counts.complete,
            pending_puts: counts.pending,
            soft_pin_key_count: counts.soft_pinned,
            hard_pin_key_count: counts.hard_pinned,
            ..s
        }
    }
}
