//! The shared-filesystem tier (`--root_fs_dir`): storage clients mount it,
//! take the objects eviction wants out of memory, write each as a file at
//! the path derived from its key, and report it durable; only then may the
//! memory copy go. Any client reads a file copy straight from the mount.
//!
//! A full tier either drops its oldest copies for new ones
//! (`--enable_disk_eviction`, the default) or takes no more: then objects
//! that could be written stay in memory and puts get `NO_AVAILABLE_HANDLE`
//! (-200) until room comes back. Nothing acknowledged is dropped unasked.

use mooncake_common::{Error, ErrorCode, Result};

use super::{check_key, MasterService};
use crate::master::config::policy::FilePolicy;
use crate::master::events::{Kind, Medium};
use crate::master::state::fs_tier::{FileTier, SHARED_FS};
use crate::master::state::mutation::{Call, DiskOp};
use crate::master::state::objects::ObjectMeta;
use crate::types::{
    ClientId, DiskDescriptor, OffloadBatch, OffloadTask, ReplicaDesc, ReplicaKind, ReplicaStatus,
    StorageConfig,
};

fn tier_off() -> Error {
    Error::new(
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
        "the shared-filesystem tier is off on this master (--root_fs_dir is empty)",
    )
}

fn changed(key: &str) -> Error {
    Error::new(
        ErrorCode::OBJECT_NOT_FOUND,
        format!("{key:?} changed since its file was written"),
    )
}

fn not_mounted(client: ClientId) -> Error {
    Error::new(
        ErrorCode::SEGMENT_NOT_FOUND,
        format!("client {client:032x} has not mounted the shared-filesystem tier"),
    )
}

impl MasterService {
    pub fn with_file_policy(mut self, policy: FilePolicy) -> Self {
        self.files = FileTier::new(policy);
        self
    }

    /// What clients need to know of the tier (the reference's
    /// `GetStorageConfig`).
    pub fn storage_config(&self) -> StorageConfig {
        let p = &self.files.policy;
        StorageConfig {
            fsdir: p.fsdir.clone().unwrap_or_default(),
            enable_disk_eviction: p.evict,
            quota_bytes: p.quota_bytes,
        }
    }

    /// `client` (a storage client that sees the mount) may be asked to
    /// write objects of its segments to the tier.
    pub(super) fn mount_shared_fs_in(
        &self,
        call: &mut Call,
        client: ClientId,
        now: u64,
    ) -> Result<()> {
        if !self.files.enabled() {
            return Err(tier_off());
        }
        if client == SHARED_FS {
            return Err(Error::new(ErrorCode::INVALID_PARAMS, "client id 0"));
        }
        self.ping_in(call, client, now).or_else(|e| match e.code {
            ErrorCode::CLIENT_NOT_FOUND => Ok(()),
            _ => Err(e),
        })?;
        self.files.mount(client);
        Ok(())
    }

    /// Up to `max` objects for `client` to write (each still as queued,
    /// leased for the copy) and files to delete.
    pub fn fetch_file_tasks(&self, client: ClientId, max: u32, now: u64) -> Result<OffloadBatch> {
        if !self.files.is_writer(client) {
            return Err(not_mounted(client));
        }
        let (tasks, removes) = self.files.take(client, max as usize);
        let mut fresh = Vec::with_capacity(tasks.len());
        for task in tasks {
            let key = task.key.clone();
            let mut shard = self.objects.lock(&key);
            let now = shard.clock(now);
            let obj = shard
                .get_mut(&key)
                .filter(|o| still_as_queued(o, client, &task));
            match obj {
                Some(mut obj) => {
                    let lease = self.policy.lease.lend_for_copy(&mut obj, now);
                    self.files.lent(&task.key, lease);
                    fresh.push(task);
                }
                None => {
                    self.files.write_done(client, &task.key);
                }
            }
        }
        Ok(OffloadBatch {
            tasks: fresh,
            removes,
            promotions: Vec::new(),
        })
    }

    /// `client` wrote `keys` (of `sizes`) durably, could not write
    /// `failed`, and deleted the files of `removed`. A file is accepted as
    /// the object's copy when the object is still the one the task named
    /// and the tier has room (making it, with eviction on); otherwise it
    /// is queued for deletion and its result says why.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn notify_file_copies_in(
        &self,
        call: &mut Call,
        client: ClientId,
        keys: &[&str],
        sizes: &[u64],
        failed: &[&str],
        removed: &[&str],
        now: u64,
    ) -> Vec<Result<()>> {
        for &key in removed {
            self.files.deleted(key);
        }
        for &key in keys.iter().chain(failed) {
            self.give_back_lease(key, now);
        }
        for &key in failed {
            // The object stays in memory; a stale one is queued anew anyway.
            self.files.write_done(client, key);
        }
        keys.iter()
            .zip(sizes)
            .map(|(&key, &size)| {
                check_key(key)?;
                let r = match self.files.write_done(client, key) {
                    true => self.accept_file(call, client, key, size, now),
                    false => Err(changed(key)),
                };
                if r.is_err() {
                    self.files.queue_delete(key);
                }
                r
            })
            .collect()
    }

    /// The write of `key` ended: its object gets its earlier lease back.
    fn give_back_lease(&self, key: &str, now: u64) {
        let Some(lease) = self.files.take_lease(key) else {
            return;
        };
        let mut shard = self.objects.lock(key);
        let _ = shard.clock(now);
        // A statement, not the block's tail: the guard must drop before `shard`.
        if let Some(mut obj) = shard.get_mut(key) {
            lease.release(&mut obj);
        };
    }

    fn accept_file(
        &self,
        call: &mut Call,
        client: ClientId,
        key: &str,
        size: u64,
        now: u64,
    ) -> Result<()> {
        let p = &self.files.policy;
        if self.disk.file_bytes().saturating_add(size) > p.capacity {
            if !p.evict || size > p.capacity {
                return Err(Error::new(
                    ErrorCode::NO_AVAILABLE_HANDLE,
                    "the shared-filesystem tier is full",
                ));
            }
            self.evict_files(call, p.capacity - size, key, now);
        }
        let mut shard = self.objects.lock(key);
        let _ = shard.clock(now);
        let obj = shard.get_mut(key).filter(|o| {
            o.is_complete()
                && o.pending.is_none()
                && !o.is_on_disk()
                && o.size == size
                && o.replicas
                    .as_slice()
                    .iter()
                    .any(|r| r.segment.owner == client)
        });
        let Some(mut obj) = obj else {
            return Err(changed(key));
        };
        let op = DiskOp::AddCopy {
            client: SHARED_FS,
            key,
            size,
        };
        self.apply_copy(call, Some(&mut obj), op);
        // As the reference's PutEnd of a disk replica.
        self.kv_event(Kind::Stored, key, Medium::Disk);
        Ok(())
    }

    /// Drops the tier's oldest copies (not `keep`'s) until it holds at
    /// most `limit` bytes; objects with no memory copy go with them.
    fn evict_files(&self, call: &mut Call, limit: u64, keep: &str, now: u64) {
        while self.disk.file_bytes() > limit {
            let victims = self.disk.oldest_files(64);
            let victims: Vec<String> = victims.into_iter().filter(|k| k != keep).collect();
            if victims.is_empty() {
                return;
            }
            let keys: Vec<&str> = victims.iter().map(String::as_str).collect();
            let before = self.disk.file_bytes();
            for key in keys {
                if self.disk.file_bytes() <= limit {
                    break;
                }
                let mut shard = self.objects.lock(key);
                let _ = shard.clock(now);
                if self.disk.copy(key).is_some_and(|c| c.owner == SHARED_FS) {
                    self.apply_copy(
                        call,
                        shard.get_mut(key).as_deref_mut(),
                        DiskOp::DropCopy { key },
                    );
                    self.files.queue_delete(key);
                    if !shard.contains_key(key) {
                        self.kv_event(Kind::Removed, key, Medium::Disk);
                    }
                }
            }
            if self.disk.file_bytes() == before {
                return;
            }
        }
    }

    // ---- what the rest of the service asks ----------------------------

    /// The tier's writer that could write `obj`: one holding a replica.
    pub(super) fn file_target(&self, obj: &ObjectMeta) -> Option<(ClientId, u64)> {
        if !self.files.enabled() {
            return None;
        }
        obj.replicas
            .as_slice()
            .iter()
            .filter(|p| p.segment.is_mounted())
            .find(|p| self.files.is_writer(p.segment.owner))
            .map(|p| (p.segment.owner, p.segment.info.base + p.offset))
    }

    /// Queues `key` to be written to the tier (at most `limit` per writer).
    pub(super) fn queue_file_write(&self, key: &str, obj: &ObjectMeta, limit: usize) -> bool {
        if obj.is_on_disk() || !obj.is_complete() {
            return false;
        }
        let Some((writer, address)) = self.file_target(obj) else {
            return false;
        };
        let p = &self.files.policy;
        if obj.size > p.capacity {
            return false;
        }
        let room = (!p.evict).then(|| p.capacity.saturating_sub(self.disk.file_bytes()));
        let task = OffloadTask {
            key: key.to_string(),
            size: obj.size,
            address,
            idle_ms: 0,
        };
        self.files.queue_write(writer, task, limit, room)
    }

    /// `key`'s file copy as readers see it.
    pub(super) fn file_replica(&self, key: &str, size: u64) -> Option<ReplicaDesc> {
        Some(ReplicaDesc {
            kind: ReplicaKind::Disk(DiskDescriptor {
                file_path: self.files.path(key)?,
                object_size: size,
            }),
            status: ReplicaStatus::Complete,
        })
    }

    /// (bytes of the tier's files, its capacity).
    pub fn file_usage(&self) -> (u64, u64) {
        match self.files.enabled() {
            true => (self.disk.file_bytes(), self.files.policy.capacity),
            false => (0, 0),
        }
    }

    /// Bytes of writes to the tier queued or in flight.
    pub fn file_writes_reserved(&self) -> u64 {
        self.files.reserved()
    }
}

/// Whether `obj` is still the object `task` named, with its bytes at the
/// task's address on `client`, and has no copy yet.
fn still_as_queued(obj: &ObjectMeta, client: ClientId, task: &OffloadTask) -> bool {
    obj.is_complete()
        && obj.pending.is_none()
        && !obj.is_on_disk()
        && obj.size == task.size
        && obj.replicas.as_slice().iter().any(|p| {
            p.segment.is_mounted()
                && p.segment.owner == client
                && p.segment.info.base + p.offset == task.address
        })
}
