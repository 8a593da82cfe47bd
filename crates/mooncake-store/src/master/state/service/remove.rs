//! Removal: one key, by regex, everything, and clearing replicas.

use mooncake_common::{Error, ErrorCode, Result};

use super::apply::Fate;
use super::{check_key, not_found, not_ready, MasterService};
use crate::master::events::{Kind, Medium};
use crate::master::state::mutation::{Call, ObjectOp, Segments};
use crate::master::state::objects::{ObjectMeta, PendingKind};

impl MasterService {
    /// Removes an object, as Remove does: reported as a KV event (under
    /// the shard's lock, so that it precedes a later put's). A batch
    /// remove is not reported, as in the reference (`remove_quietly`).
    pub(super) fn remove_in(
        &self,
        call: &mut Call,
        key: &str,
        force: bool,
        now: u64,
    ) -> Result<()> {
        self.remove_one(call, key, force, now, true)
    }

    /// A remove that publishes no KV event.
    pub(super) fn remove_quietly(
        &self,
        call: &mut Call,
        key: &str,
        force: bool,
        now: u64,
    ) -> Result<()> {
        self.remove_one(call, key, force, now, false)
    }

    /// Removes an object. Without `force`, a leased or hard-pinned object is
    /// `OBJECT_HAS_LEASE` and one being written is `REPLICA_IS_NOT_READY`.
    fn remove_one(
        &self,
        call: &mut Call,
        key: &str,
        force: bool,
        now: u64,
        publish: bool,
    ) -> Result<()> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let Some(obj) = shard.get(key) else {
            // A disk-only object: no lease, no put in flight.
            return match self.forget_copy(call, key, None) {
                true => {
                    if publish {
                        self.kv_event(Kind::Removed, key, Medium::Disk);
                    }
                    Ok(())
                }
                false => Err(not_found(key)),
            };
        };
        if !force {
            if !obj.is_complete() {
                return Err(not_ready(key));
            }
            if obj.is_leased(now) {
                return Err(Error::new(
                    ErrorCode::OBJECT_HAS_LEASE,
                    format!("object {key:?} is leased by a reader"),
                ));
            }
            if obj
                .pending
                .as_ref()
                .is_some_and(|p| matches!(p.kind, PendingKind::Replicating { .. }))
            {
                return Err(Error::new(
                    ErrorCode::OBJECT_HAS_REPLICATION_TASK,
                    format!("object {key:?} is being replicated"),
                ));
            }
            if obj.is_hard_pinned() {
                return Err(Error::new(
                    ErrorCode::OBJECT_HAS_LEASE,
                    format!("object {key:?} is hard-pinned"),
                ));
            }
        }
        if publish {
            self.kv_event(Kind::Removed, key, Self::medium_of(Some(obj)));
        }
        self.forget_copy(call, key, shard.get_mut(key).as_deref_mut());
        self.apply_in(call, &mut shard, key, ObjectOp::Remove { now });
        Ok(())
    }

    /// Removes every complete object whose key matches `pattern` and that
    /// `remove` would accept; returns how many.
    pub(super) fn remove_by_regex_in(
        &self,
        call: &mut Call,
        pattern: &str,
        force: bool,
        scope: Option<&str>,
        now: u64,
    ) -> Result<u64> {
        let re = regex::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| {
                Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("bad regex {pattern:?}: {e}"),
                )
            })?;
        let matches = |key: &str| match scope {
            None => re.is_match(key),
            Some(t) => {
                let (tenant, key) = crate::tenant::split(key);
                tenant == t && re.is_match(key)
            }
        };
        let n = self.remove_where(call, now, |key, obj| {
            matches(key)
                && obj.is_complete()
                && (force || (!obj.is_leased(now) && !obj.is_hard_pinned()))
        });
        Ok(n + self.remove_disk_only(call, now, matches))
    }

    /// Removes every complete object (hard-pinned ones too); leased ones only
    /// with `force`. Returns how many.
    /// In multi-tenant mode (`scope`), only the caller's tenant's.
    pub(super) fn remove_all_in(
        &self,
        call: &mut Call,
        force: bool,
        scope: Option<&str>,
        now: u64,
    ) -> u64 {
        let ours = |key: &str| scope.is_none_or(|t| crate::tenant::tenant_of(key) == t);
        let n = self.remove_where(call, now, |key, obj| {
            ours(key) && obj.is_complete() && (force || !obj.is_leased(now))
        });
        n + self.remove_disk_only(call, now, ours)
    }

    /// Removes the disk-only objects whose key `pred` accepts.
    fn remove_disk_only(&self, call: &mut Call, now: u64, pred: impl Fn(&str) -> bool) -> u64 {
        let mut n = 0;
        for key in self.disk.keys_where(pred) {
            let mut shard = self.objects.lock(&key);
            let _ = shard.clock(now);
            if !shard.contains_key(key.as_str()) && self.forget_copy(call, &key, None) {
                n += 1;
            }
        }
        n
    }

    fn remove_where(
        &self,
        call: &mut Call,
        now: u64,
        pred: impl Fn(&str, &ObjectMeta) -> bool,
    ) -> u64 {
        let mut n = 0;
        for mut shard in self.objects.shards() {
            self.objects.retain(&mut shard, |key, obj| {
                if !pred(key, obj) {
                    return true;
                }
                n += 1;
                if obj.is_on_disk() {
                    self.forget_copy(call, key, Some(&mut *obj));
                }
                self.apply_object(call, key, obj, ObjectOp::Remove { now }) == Fate::Keep
            });
        }
        n
    }

    /// Clears replicas of unleased complete objects: those on `segment_name`,
    /// or the whole object when it is empty. Returns the keys cleared.
    pub(super) fn batch_replica_clear_in(
        &self,
        call: &mut Call,
        keys: &[&str],
        segment_name: &str,
        now: u64,
    ) -> Vec<String> {
        let mut cleared = Vec::new();
        for &key in keys {
            if check_key(key).is_err() {
                continue;
            }
            let mut shard = self.objects.lock(key);
            let now = shard.clock(now);
            let Some(obj) = shard.get(key) else {
                continue;
            };
            if !obj.is_complete() || obj.pending.is_some() || obj.is_leased(now) {
                continue;
            }
            if segment_name.is_empty() {
                self.apply_in(call, &mut shard, key, ObjectOp::Remove { now });
                cleared.push(key.to_string());
                continue;
            }
            if !obj
                .replicas
                .as_slice()
                .iter()
                .any(|p| p.segment.info.name == segment_name)
            {
                continue;
            }
            let drop = ObjectOp::DropReplicas {
                on: Segments::Named(segment_name),
                free_at: now,
                now,
            };
            self.apply_in(call, &mut shard, key, drop);
            if shard.get(key).is_some_and(|o| o.replicas.is_empty()) {
                self.apply_in(call, &mut shard, key, ObjectOp::Remove { now });
            }
            cleared.push(key.to_string());
        }
        cleared
    }
}
