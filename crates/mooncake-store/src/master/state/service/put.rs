//! Puts and upserts: PutStart, PutEnd, PutRevoke.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use mooncake_common::{Error, ErrorCode, Result};

use super::apply::Fate;
use super::{check_key, check_put, not_found, pin_flags, MasterService};
use crate::master::events::Kind;
use crate::master::state::allocator::aligned_len;
use crate::master::state::eviction::no_room;
use crate::master::state::mutation::{Call, ObjectOp, Write};
use crate::master::state::objects::{PendingKind, Replicas};
use crate::tenant;
use crate::types::{ClientId, ReplicaDesc, ReplicaPolicy, ReplicaStatus};

impl MasterService {
    /// Allocates replicas for `key`; the object becomes readable at `put_end`.
    /// With `upsert`, an existing object is replaced: in place when the size
    /// is unchanged and no reader holds a lease (unreadable until PutEnd),
    /// otherwise into new space while the old replicas stay readable.
    ///
    /// When no segment has room, the put joins an eviction round and is
    /// retried ([`crate::master::state::eviction::Eviction::room_for`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn put_start_in(
        &self,
        call: &mut Call,
        client: ClientId,
        key: &str,
        len: u64,
        cfg: &ReplicaPolicy,
        upsert: bool,
        now: u64,
    ) -> Result<Vec<ReplicaDesc>> {
        check_key(key)?;
        check_put(len, cfg)?;
        let group = requested_group(key, cfg)?;
        let group = group.as_deref();
        // Held until the put is placed: no other put takes the room
        // admitted to this one.
        let _admitted = match &self.tenants {
            Some(t) => {
                let lock = t.admission.lock();
                self.admit(t, call, key, len, cfg, now)?;
                Some(lock)
            }
            None => None,
        };
        self.check_metadata_budget(key)?;
        let generation = self.eviction.generation();
        let placed = self.put_start_once(call, client, key, len, cfg, group, upsert, now);
        if !no_room(&placed) || self.segments.max_capacity() < len {
            return placed;
        }
        let need = aligned_len(len)
            .unwrap_or(len)
            .saturating_mul(cfg.replica_num as u64);
        self.eviction.room_for(
            generation,
            placed,
            call,
            |call| self.put_start_once(call, client, key, len, cfg, group, upsert, now),
            |call| self.evict_for_put(call, need, now),
        )
    }

    /// A new key must fit `--max_metadata_bytes` (a key already held, in
    /// memory or in an SSD tier, costs nothing more). Checked apart from
    /// space: evicting objects for room is no answer to a full budget.
    fn check_metadata_budget(&self, key: &str) -> Result<()> {
        if self.objects.admits(key)
            || self.objects.lock(key).contains_key(key)
            || self.disk.has_copy(key)
        {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::NO_AVAILABLE_HANDLE,
            format!(
                "metadata budget full ({} bytes held, --max_metadata_bytes); remove objects first",
                self.objects.metadata_bytes()
            ),
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn put_start_once(
        &self,
        call: &mut Call,
        client: ClientId,
        key: &str,
        len: u64,
        cfg: &ReplicaPolicy,
        group: Option<&str>,
        upsert: bool,
        now: u64,
    ) -> Result<Vec<ReplicaDesc>> {
        let mut shard = self.objects.lock(key);
        // Space carved out of reserved space for the new replicas leaves the
        // reserved ranges before the PutStart is logged: no snapshot cut
        // between the two (`ObjectMap::cut`).
        let _cut = self.objects.hold_cut();
        let now = shard.clock(now);
        let in_flight_since = shard
            .get(key)
            .and_then(|obj| obj.pending.as_ref())
            .map(|p| p.started);
        if let Some(started) = in_flight_since {
            if now.saturating_sub(started) < self.policy.discard_after {
                // Not OBJECT_ALREADY_EXISTS (the reference's answer), which
                // clients report as a successful put: the put in flight may
                // be one a failover abandoned, and a retry told "done" would
                // leave the key empty. See docs/reference-behaviour.md.
                return Err(Error::new(
                    ErrorCode::OBJECT_REPLICA_BUSY,
                    format!("object {key:?} has a put in flight"),
                ));
            }
            // The earlier writer is a zombie: discard its put, then go on.
            self.counters.discarded_puts.fetch_add(1, Ordering::Relaxed);
            let discard = ObjectOp::DiscardPut { free_at: None, now };
            self.apply_in(call, &mut shard, key, discard);
        }
        if let (Some(want), Some(_), true) = (group, shard.get(key), upsert) {
            // An object stays in the group it was put in.
            let held = self.objects.groups.group_of(key);
            if held.as_deref().unwrap_or("") != want {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("object {key:?} is in another group"),
                ));
            }
        }
        if self.disk.has_copy(key) {
            if !upsert {
                return Err(Error::new(
                    ErrorCode::OBJECT_ALREADY_EXISTS,
                    format!("object {key:?} exists"),
                ));
            }
            // The new version makes the tier's copy stale.
            self.forget_copy(call, key, shard.get_mut(key).as_deref_mut());
        }
        let (write, descs) = match shard.get(key) {
            Some(_) if !upsert => {
                return Err(Error::new(
                    ErrorCode::OBJECT_ALREADY_EXISTS,
                    format!("object {key:?} exists"),
                ))
            }
            Some(obj)
                if obj.size == len
                    && !obj.is_leased(now)
                    && obj
                        .replicas
                        .as_slice()
                        .iter()
                        .all(|p| p.segment.is_mounted()) =>
            {
                let descs = obj.replicas.descriptors(len, ReplicaStatus::Processing);
                // Rewrites readable replicas: answered only once committed.
                call.answer_after_all();
                (Write::InPlace, descs)
            }
            existing => {
                let cfg = self.local_first(cfg, client, key);
                let replicas = Replicas::from_vec(self.place_put(call, len, &cfg, now)?);
                let descs = replicas.descriptors(len, ReplicaStatus::Processing);
                match existing {
                    Some(_) => (Write::Replacing(replicas), descs),
                    None => (Write::Fresh(replicas), descs),
                }
            }
        };
        let fresh = matches!(write, Write::Fresh(_));
        let start = ObjectOp::PutStart {
            client,
            size: len,
            pins: pin_flags(cfg),
            now,
            write,
        };
        self.apply_in(call, &mut shard, key, start);
        if let Some(group) = group.filter(|g| fresh && !g.is_empty()) {
            self.apply_in(call, &mut shard, key, ObjectOp::Group { group });
        }
        Ok(descs)
    }

    /// Marks the put complete: the object becomes readable.
    pub(super) fn put_end_in(
        &self,
        call: &mut Call,
        client: ClientId,
        key: &str,
        now: u64,
    ) -> Result<()> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        // One lookup for the check, the mutation and the copy's flags: the
        // object stays (a PutEnd never drops it) and the guard keeps the
        // shard's tally right.
        let mut obj = shard.get_mut(key).ok_or_else(|| not_found(key))?;
        let started = match &obj.pending {
            // Already complete: a repeated PutEnd is harmless.
            None => return Ok(()),
            Some(p) => {
                check_writer(key, &p.kind, p.client, client)?;
                p.started
            }
        };
        // Only a promotion writes an object whose copy is recorded.
        let promotion = self.disk.has_copy(key);
        let end = ObjectOp::PutEnd {
            now,
            readers_until: obj.lease_until,
        };
        let fate = self.apply_object(call, key, &mut obj, end);
        debug_assert!(fate == Fate::Keep, "a PutEnd keeps its object");
        if promotion {
            // The reads that asked for it leased the object (its copy, on
            // the reference); the memory replica keeps that lease, from
            // the promotion's start, rather than being the first to go.
            self.policy.lease.lease(&mut obj, started);
        }
        self.kv_event(Kind::Stored, key, Self::medium_of(Some(&*obj)));
        self.reflag_copy(call, key, &mut obj);
        self.offload_at_put_end(key, &obj);
        Ok(())
    }

    /// Abandons a put: the object (or, for an upsert, the new version) is
    /// dropped and its space freed.
    pub(super) fn put_revoke_in(
        &self,
        call: &mut Call,
        client: ClientId,
        key: &str,
        _now: u64,
    ) -> Result<()> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let obj = shard.get(key).ok_or_else(|| not_found(key))?;
        match &obj.pending {
            None => {
                return Err(Error::new(
                    ErrorCode::INVALID_WRITE,
                    format!("object {key:?} has no put in flight"),
                ))
            }
            Some(p) => check_writer(key, &p.kind, p.client, client)?,
        }
        if self.disk.has_copy(key) {
            // Only a promotion writes an object whose copy is recorded.
            self.counters
                .promotion_failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.apply_in(call, &mut shard, key, ObjectOp::PutRevoke);
        Ok(())
    }
}

/// The group `cfg` names for its one key, scoped to the key's tenant:
/// `None` when it names none, `Some("")` for "no group".
fn requested_group<'a>(key: &str, cfg: &'a ReplicaPolicy) -> Result<Option<Cow<'a, str>>> {
    match cfg.group_ids.as_deref() {
        None => Ok(None),
        Some([g]) if g.contains('\0') => Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "a group id holds no NUL character",
        )),
        Some([g]) if g.is_empty() => Ok(Some(Cow::Borrowed(""))),
        Some([g]) => Ok(Some(tenant::scoped(tenant::tenant_of(key), g))),
        Some(gs) => Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("group_ids names {} groups for one key", gs.len()),
        )),
    }
}

/// Whether `client` may end the put in flight, of `kind` by `writer`.
fn check_writer(key: &str, kind: &PendingKind, writer: ClientId, client: ClientId) -> Result<()> {
    if matches!(kind, PendingKind::Replicating { .. }) {
        return Err(Error::new(
            ErrorCode::OBJECT_HAS_REPLICATION_TASK,
            format!("object {key:?} is being replicated, not written"),
        ));
    }
    if writer != client {
        return Err(Error::new(
            ErrorCode::ILLEGAL_CLIENT,
            format!("object {key:?} is being written by another client"),
        ));
    }
    Ok(())
}
