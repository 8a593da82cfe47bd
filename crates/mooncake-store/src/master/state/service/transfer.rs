//! Copy and move tasks (see `tasks`) and the replica transfers that carry
//! them out.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};

use super::{check_key, not_found, MasterService};
use crate::master::state::mutation::{Call, ObjectOp, Segments, TaskOp};
use crate::master::state::objects::{ObjectMeta, PendingKind, Replicas};
use crate::master::state::segments::{Placement, Segment};
use crate::types::{
    ClientId, ReplicaDesc, ReplicaStatus, TaskAssignment, TaskId, TaskInfo, TaskStatus, TaskType,
};

fn invalid(msg: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, msg)
}

fn task_not_found(id: TaskId) -> Error {
    Error::new(
        ErrorCode::TASK_NOT_FOUND,
        format!("task {id:032x} not found"),
    )
}

impl MasterService {
    fn mounted(&self, name: &str) -> Result<Arc<Segment>> {
        self.segments
            .get(name)
            .ok_or_else(|| invalid(format!("segment {name:?} is not mounted")))
    }

    fn require_object(&self, key: &str) -> Result<Replicas> {
        check_key(key)?;
        let shard = self.objects.lock(key);
        match shard.get(key) {
            Some(obj) if obj.is_complete() => Ok(obj.replicas.clone()),
            _ => Err(not_found(key)),
        }
    }

    fn queue_task(
        &self,
        call: &mut Call,
        mut task: TaskAssignment,
        executor: ClientId,
        now: u64,
    ) -> Result<TaskId> {
        let mut table = self.tasks.lock();
        if table.pending() >= self.task_policy.max_pending {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                "too many pending tasks",
            ));
        }
        let mut id: TaskId = rand::random();
        while id == 0 || table.contains(id) {
            id = rand::random();
        }
        task.id = id;
        let create = TaskOp::Create {
            task,
            executor,
            now,
        };
        self.apply_tasks(call, &mut table, create);
        Ok(id)
    }

    /// Queues a copy of `key` onto each of `targets` (mounted segments).
    pub(super) fn create_copy_task_in(
        &self,
        call: &mut Call,
        key: &str,
        targets: &[&str],
        now: u64,
    ) -> Result<TaskId> {
        self.require_object(key)?;
        let first = targets
            .first()
            .ok_or_else(|| invalid("no target segment"))?;
        for t in targets {
            self.mounted(t)?;
        }
        let executor = self.mounted(first)?.owner;
        let assignment = TaskAssignment {
            id: 0,
            task_type: TaskType::ReplicaCopy,
            key: key.to_string(),
            source: String::new(),
            targets: targets.iter().map(|t| t.to_string()).collect(),
        };
        self.queue_task(call, assignment, executor, now)
    }

    /// Queues a move of `key`'s replica on `source` to `target`.
    pub(super) fn create_move_task_in(
        &self,
        call: &mut Call,
        key: &str,
        source: &str,
        target: &str,
        now: u64,
    ) -> Result<TaskId> {
        let replicas = self.require_object(key)?;
        let src = self.mounted(source)?;
        let executor = self.mounted(target)?.owner;
        if source == target {
            return Err(invalid("source and target are the same segment"));
        }
        if !replicas.on_segment(&src) {
            return Err(Error::new(
                ErrorCode::REPLICA_NOT_FOUND,
                format!("object {key:?} has no replica on {source:?}"),
            ));
        }
        let assignment = TaskAssignment {
            id: 0,
            task_type: TaskType::ReplicaMove,
            key: key.to_string(),
            source: source.to_string(),
            targets: vec![target.to_string()],
        };
        self.queue_task(call, assignment, executor, now)
    }

    pub fn query_task(&self, id: TaskId) -> Result<TaskInfo> {
        let epoch = self.epoch_offset_ms.load(Ordering::Relaxed);
        self.tasks
            .lock()
            .info(id, epoch)
            .ok_or_else(|| task_not_found(id))
    }

    /// Hands up to `max` pending tasks to their executor; they become Processing.
    pub(super) fn fetch_tasks_in(
        &self,
        call: &mut Call,
        client: ClientId,
        max: u32,
        now: u64,
    ) -> Vec<TaskAssignment> {
        let mut table = self.tasks.lock();
        let room = self
            .task_policy
            .max_processing
            .saturating_sub(table.processing())
            .min(max as usize);
        let ids = table.pending_for(client, room);
        if ids.is_empty() {
            return Vec::new();
        }
        self.apply_tasks(call, &mut table, TaskOp::Start { ids: &ids, now });
        ids.iter()
            .filter_map(|&id| table.assignment(id).cloned())
            .collect()
    }

    /// The executor reports the outcome of a task it fetched.
    pub(super) fn mark_task_complete_in(
        &self,
        call: &mut Call,
        client: ClientId,
        id: TaskId,
        success: bool,
        message: &str,
        now: u64,
    ) -> Result<()> {
        let mut table = self.tasks.lock();
        let (executor, status) = table.state(id).ok_or_else(|| task_not_found(id))?;
        if executor != client {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                "task is assigned to another client",
            ));
        }
        if status != TaskStatus::Processing {
            return Err(invalid(format!("task is {status:?}, not processing")));
        }
        let status = if success {
            TaskStatus::Success
        } else {
            TaskStatus::Failed
        };
        let finish = TaskOp::Finish {
            id,
            status,
            message,
            now,
        };
        self.apply_tasks(call, &mut table, finish);
        Ok(())
    }

    /// Fails tasks past their timeouts or whose executor is gone; returns how many.
    pub(super) fn expire_tasks(&self, call: &mut Call, now: u64) -> usize {
        let mut table = self.tasks.lock();
        if table.pending() + table.processing() == 0 {
            return 0;
        }
        let failed = {
            let clients = self.clients.lock();
            table.overdue(&self.task_policy, now, |c| clients.contains(c))
        };
        for &(id, why) in &failed {
            let finish = TaskOp::Finish {
                id,
                status: TaskStatus::Failed,
                message: why,
                now,
            };
            self.apply_tasks(call, &mut table, finish);
        }
        failed.len()
    }

    // ---- data movement for an executing task ------------------------------

    /// Allocates replicas of `key` on `targets` (those without one already)
    /// for the caller to write; with a `source`, the transfer is a move and
    /// that replica goes at `replica_transfer_end`. The object stays readable.
    pub(super) fn replica_transfer_start_in(
        &self,
        call: &mut Call,
        client: ClientId,
        key: &str,
        source: &str,
        targets: &[&str],
        now: u64,
    ) -> Result<Vec<ReplicaDesc>> {
        check_key(key)?;
        if targets.is_empty() {
            return Err(invalid("no target segment"));
        }
        let mut segs: Vec<Arc<Segment>> = Vec::with_capacity(targets.len());
        for t in targets {
            let seg = self.segments.get(t).ok_or_else(|| {
                Error::new(
                    ErrorCode::SEGMENT_NOT_FOUND,
                    format!("segment {t:?} is not mounted"),
                )
            })?;
            if !segs.iter().any(|s| Arc::ptr_eq(s, &seg)) {
                segs.push(seg);
            }
        }
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let obj = shard.get(key).ok_or_else(|| not_found(key))?;
        if !obj.is_complete() {
            return Err(Error::new(
                ErrorCode::REPLICA_IS_NOT_READY,
                format!("object {key:?} is being written"),
            ));
        }
        if let Some(p) = &obj.pending {
            let code = match p.kind {
                PendingKind::Replicating { .. } => ErrorCode::OBJECT_HAS_REPLICATION_TASK,
                _ => ErrorCode::OBJECT_REPLICA_BUSY,
            };
            return Err(Error::new(code, format!("object {key:?} is busy")));
        }
        let drop_source = if source.is_empty() {
            None
        } else {
            let src = self.segments.get(source);
            if !src.is_some_and(|s| obj.replicas.on_segment(&s)) {
                return Err(Error::new(
                    ErrorCode::REPLICA_NOT_FOUND,
                    format!("object {key:?} has no replica on {source:?}"),
                ));
            }
            Some(source)
        };
        segs.retain(|s| !obj.replicas.on_segment(s));
        if segs.is_empty() {
            // Every target already holds a replica: a copy has nothing to
            // do, a move only drops its source.
            if let Some(src) = drop_source {
                let drop = ObjectOp::DropReplicas {
                    on: Segments::Named(src),
                    free_at: obj.lease_until,
                    now,
                };
                self.apply_in(call, &mut shard, key, drop);
            }
            return Ok(Vec::new());
        }
        let size = obj.size;
        let mut placed: Vec<Placement> = Vec::with_capacity(segs.len());
        for seg in segs {
            match seg.allocate(size) {
                Some(offset) => placed.push(Placement {
                    segment: seg,
                    offset,
                }),
                None => {
                    for p in &placed {
                        p.segment.free(p.offset, size);
                    }
                    self.eviction.request();
                    return Err(Error::new(
                        ErrorCode::NO_AVAILABLE_HANDLE,
                        format!("segment {} has no {size} free bytes", seg.info.name),
                    ));
                }
            }
        }
        let replicas = Replicas::from_vec(placed);
        let descs = replicas.descriptors(size, ReplicaStatus::Processing);
        let start = ObjectOp::TransferStart {
            client,
            now,
            replicas,
            drop_source,
        };
        self.apply_in(call, &mut shard, key, start);
        Ok(descs)
    }

    /// Whether the transfer in flight on `key` is a move (`None`: there is
    /// none), for the copy and move metric families.
    pub fn transfer_is_move(&self, key: &str) -> Option<bool> {
        let shard = self.objects.lock(key);
        match &shard.get(key)?.pending.as_ref()?.kind {
            PendingKind::Replicating { drop_source, .. } => Some(drop_source.is_some()),
            _ => None,
        }
    }

    /// The new replicas are written: they join the object; a move's source
    /// replica is dropped (its space waits for readers' leases).
    pub(super) fn replica_transfer_end_in(
        &self,
        call: &mut Call,
        client: ClientId,
        key: &str,
        now: u64,
    ) -> Result<()> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let obj = shard.get(key).ok_or_else(|| not_found(key))?;
        check_transfer(obj, client, key)?;
        let end = ObjectOp::TransferEnd {
            now,
            readers_until: obj.lease_until,
        };
        self.apply_in(call, &mut shard, key, end);
        Ok(())
    }

    /// Abandons a transfer: the new replicas are freed.
    pub(super) fn replica_transfer_revoke_in(
        &self,
        call: &mut Call,
        client: ClientId,
        key: &str,
    ) -> Result<()> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let obj = shard.get(key).ok_or_else(|| not_found(key))?;
        check_transfer(obj, client, key)?;
        self.apply_in(call, &mut shard, key, ObjectOp::TransferRevoke);
        Ok(())
    }
}

/// Whether `client` has a transfer in flight on `obj`.
fn check_transfer(obj: &ObjectMeta, client: ClientId, key: &str) -> Result<()> {
    match &obj.pending {
        Some(p) if matches!(p.kind, PendingKind::Replicating { .. }) => {
            if p.client != client {
                return Err(Error::new(
                    ErrorCode::ILLEGAL_CLIENT,
                    "the transfer belongs to another client",
                ));
            }
            Ok(())
        }
        _ => Err(Error::new(
            ErrorCode::OBJECT_NO_REPLICATION_TASK,
            format!("object {key:?} has no transfer in flight"),
        )),
    }
}
