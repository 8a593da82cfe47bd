//! The storage tiers' calls: a storage client's SSD tier (mount, the
//! offload mailbox, copies, promotions, tier eviction) and the
//! shared-filesystem tier's.

use mooncake_common::Result;

use super::{unexpected, unit, units, MasterClient};
use crate::proto::{Request, Response};
use crate::types::{ClientId, OffloadBatch, ReplicaDesc, StorageConfig};

impl MasterClient {
    /// Mounts this client's SSD tier (see `Request::MountLocalDisk`).
    pub fn mount_local_disk(
        &self,
        client_id: ClientId,
        tier_id: &str,
        endpoint: &str,
        capacity: u64,
    ) -> Result<()> {
        unit(self.call(&Request::MountLocalDisk {
            client_id,
            tier_id,
            endpoint,
            capacity,
        })?)
    }

    /// Withdraws this client's SSD tier (see `Request::UnmountLocalDisk`).
    pub fn unmount_local_disk(&self, client_id: ClientId) -> Result<()> {
        unit(self.call(&Request::UnmountLocalDisk { client_id })?)
    }

    /// `promote_round_ms`: see `Request::FetchOffloadTasks`.
    pub fn fetch_offload_tasks(
        &self,
        client_id: ClientId,
        max: u32,
        promote_round_ms: u64,
    ) -> Result<OffloadBatch> {
        let req = Request::FetchOffloadTasks {
            client_id,
            max,
            promote_round_ms,
        };
        match self.call(&req)? {
            Response::Offload { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    /// Reports copies durable in this client's tier; one result per key.
    pub fn notify_offload(
        &self,
        client_id: ClientId,
        keys: &[String],
        sizes: &[u64],
        restore: bool,
    ) -> Result<Vec<Result<()>>> {
        let keys_ref: Vec<&str> = keys.iter().map(String::as_str).collect();
        units(
            self.call(&Request::NotifyOffload {
                client_id,
                keys: keys_ref,
                sizes: sizes.to_vec(),
                restore,
            })?,
            keys.len(),
        )
    }

    /// The shared-filesystem tier's directory and limits (empty: off).
    pub fn get_storage_config(&self) -> Result<StorageConfig> {
        match self.call(&Request::GetStorageConfig {})? {
            Response::Storage { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    /// Mounts this storage client on the shared-filesystem tier.
    pub fn mount_shared_fs(&self, client_id: ClientId) -> Result<()> {
        unit(self.call(&Request::MountSharedFs { client_id })?)
    }

    pub fn fetch_file_tasks(&self, client_id: ClientId, max: u32) -> Result<OffloadBatch> {
        match self.call(&Request::FetchFileTasks { client_id, max })? {
            Response::Offload { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    /// Reports files written (one result per key), failed and removed.
    pub fn notify_file_copies(
        &self,
        client_id: ClientId,
        copied: &[(String, u64)],
        failed: &[String],
        removed: &[String],
    ) -> Result<Vec<Result<()>>> {
        fn strs(v: &[String]) -> Vec<&str> {
            v.iter().map(String::as_str).collect()
        }
        units(
            self.call(&Request::NotifyFileCopies {
                client_id,
                keys: copied.iter().map(|(k, _)| k.as_str()).collect(),
                sizes: copied.iter().map(|(_, s)| *s).collect(),
                failed: strs(failed),
                removed: strs(removed),
            })?,
            copied.len(),
        )
    }

    pub fn promotion_start(&self, client_id: ClientId, key: &str) -> Result<Vec<ReplicaDesc>> {
        match self.call(&Request::PromotionStart { client_id, key })? {
            Response::Replicas { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    pub fn notify_offload_failure(&self, client_id: ClientId, keys: &[String]) -> Result<()> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        unit(self.call(&Request::NotifyOffloadFailure { client_id, keys })?)
    }

    pub fn evict_disk_replicas(
        &self,
        client_id: ClientId,
        keys: &[String],
    ) -> Result<Vec<Result<()>>> {
        let n = keys.len();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        units(
            self.call(&Request::EvictDiskReplicas { client_id, keys })?,
            n,
        )
    }
}
