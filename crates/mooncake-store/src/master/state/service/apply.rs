//! Applying mutations: every change to replicated state happens here, and
//! each apply function first hands its mutation to the sink (`observe`).
//! The callers hold the lock the mutation needs; `replay` takes it for a
//! mutation decided elsewhere.

use std::sync::atomic::Ordering;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::RwLockReadGuard;

use super::MasterService;
use crate::master::state::clients::ClientTable;
use crate::master::state::mutation::{
    Call, ClientOp, Mutation, ObjectOp, SegmentOp, Segments, TaskOp, Write,
};
use crate::master::state::objects::{flags, ObjectMeta, PendingKind, PendingPut, Replicas, Shard};
use crate::master::state::segments::{Placement, SegmentWriter};
use crate::master::state::tasks::TaskTable;

/// What became of an object a mutation was applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(super) enum Fate {
    Keep,
    /// The object is gone: the caller removes its key from the shard.
    Drop,
}

impl MasterService {
    /// The hook: every mutation passes here before it takes effect; the
    /// call notes where the sink put it. The guard keeps a snapshot's cut
    /// (`ObjectMap::cut`) out until the caller has applied the mutation:
    /// hold it to the end of the change.
    #[must_use = "hold the guard until the mutation is applied"]
    pub(super) fn observe(&self, call: &mut Call, m: &Mutation<'_>) -> RwLockReadGuard<'_, ()> {
        let cut = self.objects.hold_cut();
        if let Some(sink) = &self.sink {
            call.logged(sink.applied(m));
        }
        cut
    }

    /// Applies `op` to `key`'s object in its locked `shard`: a new entry
    /// for a fresh put, removed when the object goes.
    pub(super) fn apply_in(&self, call: &mut Call, shard: &mut Shard, key: &str, op: ObjectOp<'_>) {
        if let ObjectOp::PutStart { now, .. } | ObjectOp::TransferStart { now, .. } = op {
            shard.note_pending(now);
        }
        let create = is_fresh_put(&op);
        self.objects.update(shard, key, create, |obj| {
            self.apply_object(call, key, obj, op) == Fate::Keep
        });
    }

    /// Applies `op` to `obj`, the object `key` names, in a shard the caller
    /// holds. Sweeps over a shard call this from inside `retain`.
    pub(super) fn apply_object(
        &self,
        call: &mut Call,
        key: &str,
        obj: &mut ObjectMeta,
        op: ObjectOp<'_>,
    ) -> Fate {
        let m = Mutation::Object { key, op };
        let _cut = self.observe(call, &m);
        let Mutation::Object { op, .. } = m else {
            unreachable!("built above")
        };
        if matches!(op, ObjectOp::PutStart { .. } | ObjectOp::Remove { .. }) {
            // A file being written of what the key held is no copy of it.
            self.files.object_changed(key);
        }
        match op {
            ObjectOp::PutStart {
                client,
                size,
                pins,
                now,
                write,
            } => {
                let kind = match write {
                    Write::Fresh(replicas) => {
                        *obj = ObjectMeta {
                            size,
                            replicas,
                            flags: pins,
                            ..ObjectMeta::absent()
                        };
                        PendingKind::Fresh
                    }
                    Write::InPlace => {
                        obj.flags = pins;
                        PendingKind::InPlace
                    }
                    Write::Replacing(replicas) => PendingKind::Replacing {
                        replicas,
                        size,
                        flags: pins,
                    },
                };
                obj.pending = Some(Box::new(PendingPut {
                    client,
                    started: now,
                    kind,
                }));
                Fate::Keep
            }
            ObjectOp::PutEnd { now, readers_until } => {
                self.end_put(obj, now, readers_until);
                Fate::Keep
            }
            ObjectOp::PutRevoke => match take_put(obj).map(|p| p.kind) {
                Some(PendingKind::Fresh | PendingKind::InPlace) => {
                    obj.replicas.free_all(obj.size);
                    Fate::Drop
                }
                Some(PendingKind::Replacing { replicas, size, .. }) => {
                    replicas.free_all(size);
                    Fate::Keep
                }
                Some(PendingKind::Replicating { .. }) => unreachable!("not taken as a put"),
                None => Fate::Keep,
            },
            ObjectOp::DiscardPut { free_at, now } => {
                if self.discard_pending(obj, free_at, now) {
                    Fate::Drop
                } else {
                    Fate::Keep
                }
            }
            ObjectOp::Remove { now } => {
                self.release_object(obj, now);
                Fate::Drop
            }
            ObjectOp::DropReplicas { on, free_at, now } => {
                let mut gone = Vec::new();
                obj.replicas.retain(
                    |p| match on {
                        Segments::Named(name) => *p.segment.info.name != *name,
                        Segments::Unmounted => p.segment.is_mounted(),
                    },
                    |p| gone.push(p),
                );
                self.release(&gone, obj.size, free_at, now);
                Fate::Keep
            }
            ObjectOp::TransferStart {
                client,
                now,
                replicas,
                drop_source,
            } => {
                obj.pending = Some(Box::new(PendingPut {
                    client,
                    started: now,
                    kind: PendingKind::Replicating {
                        replicas,
                        drop_source: drop_source.map(Box::from),
                    },
                }));
                Fate::Keep
            }
            ObjectOp::TransferEnd { now, readers_until } => {
                let Some((replicas, drop_source)) = take_transfer(obj) else {
                    return Fate::Keep;
                };
                let mut all: Vec<Placement> = obj.replicas.as_slice().to_vec();
                if let Some(src) = drop_source {
                    let (gone, kept): (Vec<Placement>, Vec<Placement>) =
                        all.into_iter().partition(|p| *p.segment.info.name == *src);
                    all = kept;
                    // Readers holding a lease may still copy from the source.
                    self.release(&gone, obj.size, readers_until, now);
                }
                all.extend(replicas.as_slice().iter().cloned());
                obj.replicas = Replicas::from_vec(all);
                Fate::Keep
            }
            ObjectOp::TransferRevoke => {
                if let Some((replicas, _)) = take_transfer(obj) {
                    replicas.free_all(obj.size);
                }
                Fate::Keep
            }
            ObjectOp::Group { group } => {
                self.objects.groups.join(key, group);
                Fate::Keep
            }
        }
    }

    /// The version in flight becomes the object.
    fn end_put(&self, obj: &mut ObjectMeta, now: u64, readers_until: u64) {
        let Some(pending) = take_put(obj) else {
            return;
        };
        match pending.kind {
            PendingKind::Fresh | PendingKind::InPlace => obj.flags |= flags::COMPLETE,
            PendingKind::Replacing {
                replicas,
                size,
                flags: pins,
            } => {
                let old = std::mem::replace(&mut obj.replicas, replicas);
                let old_size = std::mem::replace(&mut obj.size, size);
                // Readers holding a lease may still copy the old bytes.
                self.release(old.as_slice(), old_size, readers_until, now);
                obj.flags = pins | flags::COMPLETE;
                obj.lease_until = now;
                obj.soft_pin_until = 0;
            }
            PendingKind::Replicating { .. } => unreachable!("not taken as a put"),
        }
        self.policy.lease.on_write(obj, now);
    }

    /// Ends a put in flight without its writer. Its space is freed at
    /// `free_at` (default: PutStart + release timeout, since the writer may
    /// still be writing). Returns true when the object itself must go.
    fn discard_pending(&self, obj: &mut ObjectMeta, free_at: Option<u64>, now: u64) -> bool {
        let Some(p) = obj.pending.take() else {
            return false;
        };
        let free_at =
            free_at.unwrap_or_else(|| p.started.saturating_add(self.policy.release_after));
        match p.kind {
            PendingKind::Fresh | PendingKind::InPlace => {
                self.release_staging(obj.replicas.as_slice(), obj.size, free_at, now);
                true
            }
            PendingKind::Replacing { replicas, size, .. } => {
                self.release_staging(replicas.as_slice(), size, free_at, now);
                false
            }
            PendingKind::Replicating { replicas, .. } => {
                self.release(replicas.as_slice(), obj.size, free_at, now);
                false
            }
        }
    }

    /// Frees the space of an object leaving the map (with `force`, even while
    /// leased); space a writer may still touch is retired instead.
    fn release_object(&self, obj: &mut ObjectMeta, now: u64) {
        if obj.pending.is_some() {
            let complete = obj.is_complete();
            self.discard_pending(obj, None, now);
            if !complete {
                return;
            }
        }
        obj.replicas.free_all(obj.size);
    }

    /// Like `release`, for the space of a discarded put (counted apart).
    fn release_staging(&self, placements: &[Placement], size: u64, free_at: u64, now: u64) {
        if free_at <= now {
            for p in placements {
                p.segment.free(p.offset, size);
            }
            self.counters.released_puts.fetch_add(1, Ordering::Relaxed);
        } else {
            self.retired.retire_staging(placements, size, free_at);
        }
    }

    /// Frees replicas now, or retires them until `free_at` if that is later.
    fn release(&self, placements: &[Placement], size: u64, free_at: u64, now: u64) {
        if free_at <= now {
            for p in placements {
                p.segment.free(p.offset, size);
            }
        } else {
            self.retired.retire(placements, size, free_at);
        }
    }

    pub(super) fn apply_segments(
        &self,
        call: &mut Call,
        w: &mut SegmentWriter<'_>,
        op: SegmentOp<'_>,
    ) {
        let m = Mutation::Segment(op);
        let _cut = self.observe(call, &m);
        let Mutation::Segment(op) = m else {
            unreachable!("built above")
        };
        match op {
            SegmentOp::Mount { id, owner, info } => {
                w.insert(id, owner, info);
            }
            SegmentOp::Unmount { name } => {
                w.remove(name);
            }
        }
    }

    pub(super) fn apply_clients(&self, call: &mut Call, clients: &mut ClientTable, op: ClientOp) {
        let _cut = self.observe(call, &Mutation::Client(op));
        match op {
            ClientOp::Register { client, now } => clients.insert(client, now),
            ClientOp::Expire { client } => {
                clients.remove(client);
            }
        }
    }

    pub(super) fn apply_tasks(&self, call: &mut Call, tasks: &mut TaskTable, op: TaskOp<'_>) {
        let m = Mutation::Task(op);
        let _cut = self.observe(call, &m);
        let Mutation::Task(op) = m else {
            unreachable!("built above")
        };
        match op {
            TaskOp::Create {
                task,
                executor,
                now,
            } => tasks.insert(task, executor, now),
            TaskOp::Start { ids, now } => {
                for &id in ids {
                    tasks.start(id, now);
                }
            }
            TaskOp::Finish {
                id,
                status,
                message,
                now,
            } => tasks.finish(id, status, message, now, self.task_policy.max_finished),
        }
    }

    /// Frees the retired space due at `now`; returns how many ranges.
    pub(super) fn apply_free_retired(&self, call: &mut Call, now: u64) -> usize {
        let _cut = self.observe(call, &Mutation::FreeRetired { now });
        let (ranges, puts) = self.retired.free_due(now);
        self.counters
            .released_puts
            .fetch_add(puts as u64, Ordering::Relaxed);
        ranges
    }

    /// Applies a mutation decided by another master (a standby following
    /// its leader): takes the lock the leader held and applies it the same
    /// way. The replicas a `PutStart` or `TransferStart` carries must
    /// already be reserved in this master's segments. Fails, changing
    /// nothing, when the mutation does not fit this state (a log that does
    /// not belong to it). A replayed mutation answers no call here.
    pub(crate) fn replay(&self, m: Mutation<'_>) -> Result<()> {
        let call = &mut Call::default();
        let diverged = |what: String| {
            Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("mutation does not fit this master's state: {what}"),
            ))
        };
        match m {
            Mutation::Object { key, op } => {
                let mut shard = self.objects.lock(key);
                let fresh = is_fresh_put(&op);
                if shard.contains_key(key) == fresh {
                    let state = if fresh { "exists" } else { "is absent" };
                    return diverged(format!("object {key:?} {state}"));
                }
                self.apply_in(call, &mut shard, key, op);
            }
            Mutation::Segment(op) => {
                let mut w = self.segments.write();
                let (name, mounting) = match &op {
                    SegmentOp::Mount { info, .. } => (info.name.as_str(), true),
                    SegmentOp::Unmount { name } => (*name, false),
                };
                if w.get(name).is_some() == mounting {
                    return diverged(format!("segment {name:?}"));
                }
                self.apply_segments(call, &mut w, op);
            }
            Mutation::Client(op) => self.apply_clients(call, &mut self.clients.lock(), op),
            Mutation::Task(op) => self.apply_tasks(call, &mut self.tasks.lock(), op),
            Mutation::FreeRetired { now } => {
                self.apply_free_retired(call, now);
            }
            Mutation::Disk(op) => self.replay_disk(call, op),
            m @ (Mutation::Reserve {
                segment,
                offset,
                len,
            }
            | Mutation::Unreserve {
                segment,
                offset,
                len,
                ..
            }) => {
                // Described only when it fails: a log replays millions.
                if !self.replay_space(call, m) {
                    return diverged(format!("space {offset}+{len} of segment {segment}"));
                }
            }
        }
        Ok(())
    }
}

/// A put of a key the map does not hold yet.
fn is_fresh_put(op: &ObjectOp<'_>) -> bool {
    matches!(
        op,
        ObjectOp::PutStart {
            write: Write::Fresh(_),
            ..
        }
    )
}

/// Takes the put in flight on `obj`, if any (a transfer is not a put).
fn take_put(obj: &mut ObjectMeta) -> Option<Box<PendingPut>> {
    obj.pending
        .take_if(|p| !matches!(p.kind, PendingKind::Replicating { .. }))
}

/// Takes the transfer in flight on `obj`, if any.
fn take_transfer(obj: &mut ObjectMeta) -> Option<(Replicas, Option<Box<str>>)> {
    let p = obj
        .pending
        .take_if(|p| matches!(p.kind, PendingKind::Replicating { .. }))?;
    match p.kind {
        PendingKind::Replicating {
            replicas,
            drop_source,
        } => Some((replicas, drop_source)),
        _ => unreachable!("taken only when replicating"),
    }
}
