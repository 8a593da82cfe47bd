//! The operations outside a served call: tests, tools and the drain jobs
//! call them directly. What they apply is logged like any mutation, but
//! they answer no client, so their `Call` is dropped and nobody waits for
//! its release. The server goes through `handle`, whose [`Answer`] carries
//! the release it must wait on.
//!
//! [`Answer`]: crate::master::Answer

use mooncake_common::Result;

use super::MasterService;
use crate::master::state::mutation::Call;
use crate::types::{ClientId, ReplicaDesc, ReplicaPolicy, SegmentInfo, TaskAssignment, TaskId};

impl MasterService {
    /// `mount_shared_fs_in`, outside a served call.
    pub fn mount_shared_fs(&self, client: ClientId, now: u64) -> Result<()> {
        self.mount_shared_fs_in(&mut Call::default(), client, now)
    }

    /// `notify_file_copies_in`, outside a served call.
    pub fn notify_file_copies(
        &self,
        client: ClientId,
        keys: &[&str],
        sizes: &[u64],
        failed: &[&str],
        removed: &[&str],
        now: u64,
    ) -> Vec<Result<()>> {
        self.notify_file_copies_in(
            &mut Call::default(),
            client,
            keys,
            sizes,
            failed,
            removed,
            now,
        )
    }

    /// `ping_in`, outside a served call.
    pub fn ping(&self, client: ClientId, now: u64) -> Result<()> {
        self.ping_in(&mut Call::default(), client, now)
    }

    /// `mount_segment_in`, outside a served call.
    pub fn mount_segment(&self, client: ClientId, seg: &SegmentInfo, now: u64) -> Result<()> {
        self.mount_segment_in(&mut Call::default(), client, seg, now)
    }

    /// `unmount_segment_in`, outside a served call.
    pub fn unmount_segment(&self, client: ClientId, name: &str, now: u64) -> Result<()> {
        self.unmount_segment_in(&mut Call::default(), client, name, now)
    }

    /// `mount_local_disk_in`, outside a served call.
    pub fn mount_local_disk(
        &self,
        client: ClientId,
        tier_id: &str,
        endpoint: &str,
        capacity: u64,
        now: u64,
    ) -> Result<()> {
        self.mount_local_disk_in(
            &mut Call::default(),
            client,
            tier_id,
            endpoint,
            capacity,
            now,
        )
    }

    /// `unmount_local_disk_in`, outside a served call.
    pub fn unmount_local_disk(&self, client: ClientId) -> Result<()> {
        self.unmount_local_disk_in(&mut Call::default(), client)
    }

    /// `notify_offload_in`, outside a served call.
    pub fn notify_offload(
        &self,
        client: ClientId,
        keys: &[&str],
        sizes: &[u64],
        restore: bool,
        now: u64,
    ) -> Vec<Result<()>> {
        self.notify_offload_in(&mut Call::default(), client, keys, sizes, restore, now)
    }

    /// `evict_disk_replicas_in`, outside a served call.
    pub fn evict_disk_replicas(
        &self,
        client: ClientId,
        keys: &[&str],
        now: u64,
    ) -> Vec<Result<()>> {
        self.evict_disk_replicas_in(&mut Call::default(), client, keys, now)
    }

    /// `promotion_start_in`, outside a served call.
    pub fn promotion_start(
        &self,
        client: ClientId,
        key: &str,
        now: u64,
    ) -> Result<Vec<ReplicaDesc>> {
        self.promotion_start_in(&mut Call::default(), client, key, now)
    }

    /// `put_start_in`, outside a served call.
    pub fn put_start(
        &self,
        client: ClientId,
        key: &str,
        len: u64,
        cfg: &ReplicaPolicy,
        upsert: bool,
        now: u64,
    ) -> Result<Vec<ReplicaDesc>> {
        self.put_start_in(&mut Call::default(), client, key, len, cfg, upsert, now)
    }

    /// `put_end_in`, outside a served call.
    pub fn put_end(&self, client: ClientId, key: &str, now: u64) -> Result<()> {
        self.put_end_in(&mut Call::default(), client, key, now)
    }

    /// `put_revoke_in`, outside a served call.
    pub fn put_revoke(&self, client: ClientId, key: &str, now: u64) -> Result<()> {
        self.put_revoke_in(&mut Call::default(), client, key, now)
    }

    /// `remove_in`, outside a served call.
    pub fn remove(&self, key: &str, force: bool, now: u64) -> Result<()> {
        self.remove_in(&mut Call::default(), key, force, now)
    }

    /// `remove_by_regex_in`, outside a served call.
    pub fn remove_by_regex(&self, pattern: &str, force: bool, now: u64) -> Result<u64> {
        self.remove_by_regex_in(&mut Call::default(), pattern, force, None, now)
    }

    /// `remove_all_in`, outside a served call.
    pub fn remove_all(&self, force: bool, now: u64) -> u64 {
        self.remove_all_in(&mut Call::default(), force, None, now)
    }

    /// `batch_replica_clear_in`, outside a served call.
    pub fn batch_replica_clear(&self, keys: &[&str], segment_name: &str, now: u64) -> Vec<String> {
        self.batch_replica_clear_in(&mut Call::default(), keys, segment_name, now)
    }

    /// `create_copy_task_in`, outside a served call.
    pub fn create_copy_task(&self, key: &str, targets: &[&str], now: u64) -> Result<TaskId> {
        self.create_copy_task_in(&mut Call::default(), key, targets, now)
    }

    /// `create_move_task_in`, outside a served call.
    pub fn create_move_task(
        &self,
        key: &str,
        source: &str,
        target: &str,
        now: u64,
    ) -> Result<TaskId> {
        self.create_move_task_in(&mut Call::default(), key, source, target, now)
    }

    /// `fetch_tasks_in`, outside a served call.
    pub fn fetch_tasks(&self, client: ClientId, max: u32, now: u64) -> Vec<TaskAssignment> {
        self.fetch_tasks_in(&mut Call::default(), client, max, now)
    }

    /// `mark_task_complete_in`, outside a served call.
    pub fn mark_task_complete(
        &self,
        client: ClientId,
        id: TaskId,
        success: bool,
        message: &str,
        now: u64,
    ) -> Result<()> {
        self.mark_task_complete_in(&mut Call::default(), client, id, success, message, now)
    }

    /// `replica_transfer_start_in`, outside a served call.
    pub fn replica_transfer_start(
        &self,
        client: ClientId,
        key: &str,
        source: &str,
        targets: &[&str],
        now: u64,
    ) -> Result<Vec<ReplicaDesc>> {
        self.replica_transfer_start_in(&mut Call::default(), client, key, source, targets, now)
    }

    /// `replica_transfer_end_in`, outside a served call.
    pub fn replica_transfer_end(&self, client: ClientId, key: &str, now: u64) -> Result<()> {
        self.replica_transfer_end_in(&mut Call::default(), client, key, now)
    }

    /// `replica_transfer_revoke_in`, outside a served call.
    pub fn replica_transfer_revoke(&self, client: ClientId, key: &str) -> Result<()> {
        self.replica_transfer_revoke_in(&mut Call::default(), client, key)
    }
}
