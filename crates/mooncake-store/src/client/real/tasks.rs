//! The copy and move tasks the master assigns to a client holding a
//! segment: fetched every [`TASK_POLL_INTERVAL`], executed, reported.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{Opcode, TransferRequest};

use super::flight::Flight;
use super::plan::Frag;
use super::worker::Worker;
use super::RealClient;
use crate::types::{MemoryDescriptor, ReplicaDesc, TaskAssignment};

/// How often a client holding a segment asks the master for copy and move
/// tasks to execute.
const TASK_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Tasks taken per poll; the rest wait for the next one.
const TASKS_PER_POLL: u32 = 16;

impl RealClient {
    /// Starts the thread executing the copy and move tasks the master assigns
    /// to this client, if it holds a segment. Call once the client is shared;
    /// the thread holds it weakly and ends with it (or at `close`).
    pub(crate) fn start_executor(self: &Arc<Self>) {
        if self.segments.is_empty() {
            return;
        }
        let weak: Weak<RealClient> = Arc::downgrade(self);
        let worker = Worker::spawn("mooncake-tasks", TASK_POLL_INTERVAL, move || {
            match weak.upgrade() {
                Some(client) if !client.closed.load(Ordering::Relaxed) => {
                    client.run_tasks();
                    true
                }
                _ => false,
            }
        });
        *self.executor.lock() = Some(worker);
    }

    /// Executes the tasks waiting for this client and reports each outcome.
    fn run_tasks(&self) {
        let tasks = match self.master.fetch_tasks(self.id, TASKS_PER_POLL) {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(error = %e, "fetch_tasks failed");
                return;
            }
        };
        for task in tasks {
            let outcome = self.execute_task(&task);
            let message = match &outcome {
                Ok(()) => String::new(),
                Err(e) => {
                    tracing::warn!(task = %format!("{:032x}", task.id), key = %task.key, error = %e, "task failed");
                    e.to_string()
                }
            };
            if let Err(e) =
                self.master
                    .mark_task_complete(self.id, task.id, outcome.is_ok(), &message)
            {
                tracing::warn!(error = %e, "mark_task_complete failed");
            }
        }
    }

    /// Copies `task.key` onto the task's targets: new replicas are allocated
    /// by the master, filled from an existing replica, then published (a
    /// move's source replica goes at that point) or revoked.
    fn execute_task(&self, task: &TaskAssignment) -> Result<()> {
        // Looking the replicas up first leases them for the copy.
        // (A disk-only source stays staged while `found` lives.)
        let mut found = self.lookup(std::slice::from_ref(&task.key));
        let sources = found
            .pop()
            .unwrap_or_else(|| Err(Error::new(ErrorCode::INTERNAL_ERROR, "empty lookup")))?;
        let fresh =
            self.master
                .replica_transfer_start(self.id, &task.key, &task.source, &task.targets)?;
        if fresh.is_empty() {
            return Ok(()); // every target already held a replica
        }
        let filled = self.fill_replicas(&task.key, &sources, &fresh);
        let published = filled.and_then(|()| self.master.replica_transfer_end(self.id, &task.key));
        if let Err(e) = published {
            if let Err(r) = self.master.replica_transfer_revoke(self.id, &task.key) {
                tracing::warn!(key = %task.key, error = %r, "replica_transfer_revoke failed");
            }
            return Err(e);
        }
        Ok(())
    }

    /// Writes the object held by `sources` (ranked replicas) into the new
    /// replicas `fresh`: those in this client's segments are read in one
    /// engine batch (memcpy for an own source); any other target is then
    /// written from the first local copy.
    fn fill_replicas(
        &self,
        key: &str,
        sources: &[MemoryDescriptor],
        fresh: &[ReplicaDesc],
    ) -> Result<()> {
        let size = sources[0].size;
        let targets: Vec<&MemoryDescriptor> =
            fresh.iter().filter_map(ReplicaDesc::memory).collect();
        if targets.len() != fresh.len() || targets.iter().any(|t| t.size != size) {
            return Err(Error::new(
                ErrorCode::INVALID_REPLICA,
                format!("master allocated replicas that do not fit the {size} byte object"),
            ));
        }
        if size == 0 {
            return Ok(());
        }
        let len = usize::try_from(size)
            .map_err(|_| Error::new(ErrorCode::INVALID_REPLICA, "object too large"))?;
        let (local, remote): (Vec<&MemoryDescriptor>, Vec<&MemoryDescriptor>) = targets
            .into_iter()
            .partition(|t| self.site.owns(t.buffer_address, t.size));
        let Some(first) = local.first() else {
            return Err(Error::new(
                ErrorCode::INVALID_REPLICA,
                "no new replica lies in this client's segments",
            ));
        };
        let frags: Vec<Frag> = local
            .iter()
            .map(|t| Frag {
                src_off: 0,
                dst: t.buffer_address as usize,
                len,
            })
            .collect();
        self.fetch(&[(sources, frags, key)])
            .pop()
            .unwrap_or(Ok(()))?;
        let mut requests = Vec::with_capacity(remote.len());
        for t in remote {
            requests.push(TransferRequest {
                opcode: Opcode::Write,
                source: first.buffer_address as usize,
                target_id: self.handle(&t.transport_endpoint)?,
                target_offset: t.buffer_address,
                length: len,
            });
        }
        Flight::run(&self.engine, &requests, &[])
            .into_iter()
            .collect()
    }
}
