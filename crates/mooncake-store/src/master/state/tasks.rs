//! Copy and move tasks: the table of tasks and its plain operations.
//!
//! `CreateCopyTask` / `CreateMoveTask` check the object and segments and
//! queue a task for the client owning the (first) target segment, which
//! picks it up with `FetchTasks`, writes the new replicas between
//! `ReplicaTransferStart` and `ReplicaTransferEnd` (the object stays
//! readable meanwhile; a move drops its source replica at the end, after
//! readers' leases) and reports with `MarkTaskComplete`. `QueryTask`
//! follows a task; finished tasks are kept up to `max_total_finished_tasks`.
//! The checks and the object side live in the service; this table only
//! keeps tasks and their counts consistent.

use std::collections::{HashMap, VecDeque};

use crate::master::config::policy::TaskPolicy;
use crate::types::{ClientId, TaskAssignment, TaskId, TaskInfo, TaskStatus};

struct Task {
    assignment: TaskAssignment,
    status: TaskStatus,
    client: ClientId,
    /// Monotonic ms.
    created: u64,
    updated: u64,
    message: String,
}

/// One task as a snapshot keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskRecord {
    pub(crate) assignment: TaskAssignment,
    pub(crate) status: TaskStatus,
    pub(crate) client: ClientId,
    pub(crate) created: u64,
    pub(crate) updated: u64,
    pub(crate) message: String,
}

/// Every task the master remembers.
#[derive(Default)]
pub(crate) struct TaskTable {
    tasks: HashMap<TaskId, Task>,
    /// Finished tasks, oldest first, for trimming.
    finished: VecDeque<TaskId>,
    pending: usize,
    processing: usize,
}

impl TaskTable {
    /// Tasks not fetched yet.
    pub(crate) fn pending(&self) -> usize {
        self.pending
    }

    /// Tasks fetched and not finished.
    pub(crate) fn processing(&self) -> usize {
        self.processing
    }

    pub(crate) fn contains(&self, id: TaskId) -> bool {
        self.tasks.contains_key(&id)
    }

    /// Who executes task `id`, and how far it got.
    pub(crate) fn state(&self, id: TaskId) -> Option<(ClientId, TaskStatus)> {
        self.tasks.get(&id).map(|t| (t.client, t.status))
    }

    /// Task `id` as `QueryTask` reports it; `epoch` is the wall-clock ms of
    /// monotonic time 0.
    pub(crate) fn info(&self, id: TaskId, epoch: u64) -> Option<TaskInfo> {
        let t = self.tasks.get(&id)?;
        Some(TaskInfo {
            id,
            task_type: t.assignment.task_type,
            status: t.status,
            created_at_ms_epoch: epoch + t.created,
            last_updated_at_ms_epoch: epoch + t.updated,
            assigned_client: t.client,
            message: t.message.clone(),
        })
    }

    pub(crate) fn assignment(&self, id: TaskId) -> Option<&TaskAssignment> {
        self.tasks.get(&id).map(|t| &t.assignment)
    }

    /// Queues a pending task (its id is `assignment.id`, not in use).
    pub(crate) fn insert(&mut self, assignment: TaskAssignment, executor: ClientId, now: u64) {
        let id = assignment.id;
        self.tasks.insert(
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
        self.pending += 1;
    }

    /// Up to `max` pending tasks of `client`.
    pub(crate) fn pending_for(&self, client: ClientId, max: usize) -> Vec<TaskId> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.client == client && t.status == TaskStatus::Pending)
            .map(|(&id, _)| id)
            .take(max)
            .collect()
    }

    /// A pending task was handed to its executor: it is processing.
    pub(crate) fn start(&mut self, id: TaskId, now: u64) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        if t.status == TaskStatus::Pending {
            t.status = TaskStatus::Processing;
            t.updated = now;
            self.pending -= 1;
            self.processing += 1;
        }
    }

    /// Ends an unfinished task; beyond `max_finished` finished tasks the
    /// oldest are forgotten.
    pub(crate) fn finish(
        &mut self,
        id: TaskId,
        status: TaskStatus,
        message: &str,
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
        t.message = message.to_string();
        t.updated = now;
        self.finished.push_back(id);
        while self.finished.len() > max_finished {
            if let Some(old) = self.finished.pop_front() {
                self.tasks.remove(&old);
            }
        }
    }

    /// Every task: unfinished ones first, then finished ones oldest first
    /// (the order [`TaskTable::restore`] needs).
    pub(crate) fn export(&self) -> Vec<TaskRecord> {
        let record = |id: &TaskId| {
            let t = &self.tasks[id];
            TaskRecord {
                assignment: t.assignment.clone(),
                status: t.status,
                client: t.client,
                created: t.created,
                updated: t.updated,
                message: t.message.clone(),
            }
        };
        let open = self
            .tasks
            .iter()
            .filter(|(_, t)| matches!(t.status, TaskStatus::Pending | TaskStatus::Processing));
        let mut out: Vec<TaskRecord> = open.map(|(id, _)| record(id)).collect();
        out.extend(self.finished.iter().map(record));
        out
    }

    /// Adds a task as [`TaskTable::export`] gave it.
    pub(crate) fn restore(&mut self, r: TaskRecord) {
        let id = r.assignment.id;
        match r.status {
            TaskStatus::Pending => self.pending += 1,
            TaskStatus::Processing => self.processing += 1,
            TaskStatus::Success | TaskStatus::Failed => self.finished.push_back(id),
        }
        let task = Task {
            assignment: r.assignment,
            status: r.status,
            client: r.client,
            created: r.created,
            updated: r.updated,
            message: r.message,
        };
        self.tasks.insert(id, task);
    }

    /// Unfinished tasks past their timeout, or whose executor `is_live`
    /// says is gone, with the reason.
    pub(crate) fn overdue(
        &self,
        p: &TaskPolicy,
        now: u64,
        is_live: impl Fn(ClientId) -> bool,
    ) -> Vec<(TaskId, &'static str)> {
        let mut failed = Vec::new();
        for (id, t) in &self.tasks {
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
                TaskStatus::Pending | TaskStatus::Processing if !is_live(t.client) => {
                    "executor client is gone"
                }
                _ => continue,
            };
            failed.push((*id, why));
        }
        failed
    }
}
