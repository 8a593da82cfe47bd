//! Copy and move tasks.
//!
//! `CreateCopyTask` / `CreateMoveTask` check the object and segments and
//! queue a task for the client owning the (first) target segment, which
//! picks it up with `FetchTasks`, writes the new replicas between
//! `ReplicaTransferStart` and `ReplicaTransferEnd` (the object stays
//! readable meanwhile; a move drops its source replica at the end, after
//! readers' leases) and reports with `MarkTaskComplete`. `QueryTask`
//! follows a task; finished tasks are kept up to `max_total_finished_tasks`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};

use super::objects::{ObjectMeta, PendingKind, PendingPut, Replicas};
use super::segments::{Placement, Segment};
use super::service::{check_key, MasterService};
use crate::types::{
    ClientId, ReplicaDesc, ReplicaStatus, TaskAssignment, TaskId, TaskInfo, TaskStatus, TaskType,
};

/// Task limits and timeouts (milliseconds; 0 = no timeout).
#[derive(Debug, Clone, Copy)]
pub struct TaskPolicy {
    pub max_pending: usize,
    pub max_processing: usize,
    pub max_finished: usize,
    pub pending_timeout: u64,
    pub processing_timeout: u64,
}

impl Default for TaskPolicy {
    fn default() -> Self {
        TaskPolicy {
            max_pending: 10_000,
            max_processing: 10_000,
            max_finished: 10_000,
            pending_timeout: 300_000,
            processing_timeout: 300_000,
        }
    }
}

struct Task {
    assignment: TaskAssignment,
    status: TaskStatus,
    client: ClientId,
    /// Monotonic ms.
    created: u64,
    updated: u64,
    message: String,
}

/// Every task the master remembers.
#[derive(Default)]
pub struct TaskTable {
    tasks: HashMap<TaskId, Task>,
    /// Finished tasks, oldest first, for trimming.
    finished: VecDeque<TaskId>,
    pending: usize,
    processing: usize,
}

impl TaskTable {
    fn finish(
        &mut self,
        id: TaskId,
        status: TaskStatus,
        message: String,
        now: u64,
        max_finished: usize,
    ) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        match t.status {
            TaskStatus::Pending => self.pending -= 1,
            TaskStatus::Processing => self.processing -= 1,
            TaskStatus::Success | TaskStatus::Failed => return,
        }
        t.status = status;
        t.message = message;
        t.updated = now;
        self.finished.push_back(id);
        while self.finished.len() > max_finished {
            if let Some(old) = self.finished.pop_front() {
                self.tasks.remove(&old);
            }
        }
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, msg)
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
        match shard.map.get(key) {
            Some(obj) if obj.is_complete() => Ok(obj.replicas.clone()),
            _ => Err(not_found(key)),
        }
    }

    fn queue_task(
        &self,
        assignment: TaskAssignment,
        executor: ClientId,
        now: u64,
    ) -> Result<TaskId> {
        let mut table = self.tasks.lock();
        if table.pending >= self.task_policy.max_pending {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                "too many pending tasks",
            ));
        }
        let mut id: TaskId = rand::random();
        while id == 0 || table.tasks.contains_key(&id) {
            id = rand::random();
        }
        let mut assignment = assignment;
        assignment.id = id;
        table.tasks.insert(
            id,
            Task {
                assignment,
                status: TaskStatus::Pending,
                client: executor,
                created: now,
                updated: now,
                message: String::new(),
            },
        );
        table.pending += 1;
        Ok(id)
    }

    /// Queues a copy of `key` onto each of `targets` (mounted segments).
    pub fn create_copy_task(&self, key: &str, targets: &[&str], now: u64) -> Result<TaskId> {
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
        self.queue_task(assignment, executor, now)
    }

    /// Queues a move of `key`'s replica on `source` to `target`.
    pub fn create_move_task(
        &self,
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
        self.queue_task(assignment, executor, now)
    }

    pub fn query_task(&self, id: TaskId) -> Result<TaskInfo> {
        let table = self.tasks.lock();
        let t = table.tasks.get(&id).ok_or_else(|| {
            Error::new(
                ErrorCode::TASK_NOT_FOUND,
                format!("task {id:032x} not found"),
            )
        })?;
        let epoch = self.epoch_offset_ms.load(Ordering::Relaxed);
        Ok(TaskInfo {
            id,
            task_type: t.assignment.task_type,
            status: t.status,
            created_at_ms_epoch: epoch + t.created,
            last_updated_at_ms_epoch: epoch + t.updated,
            assigned_client: t.client,
            message: t.message.clone(),
        })
    }

    /// Hands up to `max` pending tasks to their executor; they become Processing.
    pub fn fetch_tasks(&self, client: ClientId, max: u32, now: u64) -> Vec<TaskAssignment> {
        let mut table = self.tasks.lock();
        let room = self
            .task_policy
            .max_processing
            .saturating_sub(table.processing)
            .min(max as usize);
        let mut out = Vec::new();
        for t in table.tasks.values_mut() {
            if out.len() == room {
                break;
            }
            if t.client == client && t.status == TaskStatus::Pending {
                t.status = TaskStatus::Processing;
                t.updated = now;
                out.push(t.assignment.clone());
            }
        }
        table.pending -= out.len();
        table.processing += out.len();
        out
    }

    /// The executor reports the outcome of a task it fetched.
    pub fn mark_task_complete(
        &self,
        client: ClientId,
        id: TaskId,
        success: bool,
        message: &str,
        now: u64,
    ) -> Result<()> {
        let mut table = self.tasks.lock();
        let t = table.tasks.get(&id).ok_or_else(|| {
            Error::new(
                ErrorCode::TASK_NOT_FOUND,
                format!("task {id:032x} not found"),
            )
        })?;
        if t.client != client {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                "task is assigned to another client",
            ));
        }
        if t.status != TaskStatus::Processing {
            return Err(invalid(format!("task is {:?}, not processing", t.status)));
        }
        let status = if success {
            TaskStatus::Success
        } else {
            TaskStatus::Failed
        };
        table.finish(
            id,
            status,
            message.to_string(),
            now,
            self.task_policy.max_finished,
        );
        Ok(())
    }

    /// Fails tasks past their timeouts or whose executor is gone; returns how many.
    pub(super) fn expire_tasks(&self, now: u64) -> usize {
        let p = self.task_policy;
        let mut table = self.tasks.lock();
        if table.pending + table.processing == 0 {
            return 0;
        }
        let live: HashSet<ClientId> = self.clients.lock().keys().copied().collect();
        let mut failed: Vec<(TaskId, &'static str)> = Vec::new();
        for (id, t) in &table.tasks {
            let age = now.saturating_sub(t.updated);
            let why = match t.status {
                TaskStatus::Pending if p.pending_timeout > 0 && age >= p.pending_timeout => {
                    "pending task timed out"
                }
                TaskStatus::Processing
                    if p.processing_timeout > 0 && age >= p.processing_timeout =>
                {
                    "task timed out"
                }
                TaskStatus::Pending | TaskStatus::Processing if !live.contains(&t.client) => {
                    "executor client is gone"
                }
                _ => continue,
            };
            failed.push((*id, why));
        }
        for &(id, why) in &failed {
            table.finish(id, TaskStatus::Failed, why.to_string(), now, p.max_finished);
        }
        failed.len()
    }

    // ---- data movement for an executing task ------------------------------

    /// Allocates replicas of `key` on `targets` (those without one already)
    /// for the caller to write; with a `source`, the transfer is a move and
    /// that replica goes at `replica_transfer_end`. The object stays readable.
    pub fn replica_transfer_start(
        &self,
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
        let obj = shard.map.get_mut(key).ok_or_else(|| not_found(key))?;
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
            Some(Box::from(source))
        };
        segs.retain(|s| !obj.replicas.on_segment(s));
        if segs.is_empty() {
            // Every target already holds a replica: a copy has nothing to
            // do, a move only drops its source.
            if let Some(src) = drop_source {
                let (size, lease_until) = (obj.size, obj.lease_until);
                let mut gone = Vec::new();
                obj.replicas
                    .retain(|p| *p.segment.info.name != *src, |p| gone.push(p));
                self.release(&Replicas::from_vec(gone), size, lease_until, now);
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
                    self.need_eviction.store(true, Ordering::Relaxed);
                    return Err(Error::new(
                        ErrorCode::NO_AVAILABLE_HANDLE,
                        format!("segment {} has no {size} free bytes", seg.info.name),
                    ));
                }
            }
        }
        let replicas = Replicas::from_vec(placed);
        let descs = replicas.descriptors(size, ReplicaStatus::Processing);
        obj.pending = Some(Box::new(PendingPut {
            client,
            started: now,
            kind: PendingKind::Replicating {
                replicas,
                drop_source,
            },
        }));
        shard.note_pending(now);
        Ok(descs)
    }

    /// The new replicas are written: they join the object; a move's source
    /// replica is dropped (its space waits for readers' leases).
    pub fn replica_transfer_end(&self, client: ClientId, key: &str, now: u64) -> Result<()> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let obj = shard.map.get_mut(key).ok_or_else(|| not_found(key))?;
        let (replicas, drop_source) = take_transfer(obj, client, key)?;
        let mut all: Vec<Placement> = obj.replicas.as_slice().to_vec();
        if let Some(src) = drop_source {
            let (gone, kept): (Vec<Placement>, Vec<Placement>) =
                all.into_iter().partition(|p| *p.segment.info.name == *src);
            all = kept;
            // Readers holding a lease may still copy from the source.
            self.release(&Replicas::from_vec(gone), obj.size, obj.lease_until, now);
        }
        all.extend(replicas.as_slice().iter().cloned());
        obj.replicas = Replicas::from_vec(all);
        Ok(())
    }

    /// Abandons a transfer: the new replicas are freed.
    pub fn replica_transfer_revoke(&self, client: ClientId, key: &str) -> Result<()> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let obj = shard.map.get_mut(key).ok_or_else(|| not_found(key))?;
        let (replicas, _) = take_transfer(obj, client, key)?;
        for p in replicas.as_slice() {
            p.segment.free(p.offset, obj.size);
        }
        Ok(())
    }
}

fn not_found(key: &str) -> Error {
    Error::new(
        ErrorCode::OBJECT_NOT_FOUND,
        format!("object {key:?} not found"),
    )
}

/// Takes the transfer in flight on `obj` if `client` started it.
fn take_transfer(
    obj: &mut ObjectMeta,
    client: ClientId,
    key: &str,
) -> Result<(Replicas, Option<Box<str>>)> {
    match &obj.pending {
        Some(p) if matches!(p.kind, PendingKind::Replicating { .. }) => {
            if p.client != client {
                return Err(Error::new(
                    ErrorCode::ILLEGAL_CLIENT,
                    "the transfer belongs to another client",
                ));
            }
        }
        _ => {
            return Err(Error::new(
                ErrorCode::OBJECT_NO_REPLICATION_TASK,
                format!("object {key:?} has no transfer in flight"),
            ))
        }
    }
    match obj.pending.take().map(|p| p.kind) {
        Some(PendingKind::Replicating {
            replicas,
            drop_source,
        }) => Ok((replicas, drop_source)),
        _ => unreachable!("checked above"),
    }
}
