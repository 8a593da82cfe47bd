//! Reads: they change only volatile state (the read lease and soft pin),
//! so they make no mutation.

use mooncake_common::Result;

use super::{check_key, not_found, not_ready, MasterService};
use crate::master::objects::ObjectMeta;
use crate::types::{GetReplicaListResponse, ReplicaDesc, ReplicaStatus};

impl MasterService {
    /// Runs `read` on `key`'s complete object; when it succeeds, the read
    /// lease is granted.
    fn read_complete<R>(
        &self,
        key: &str,
        now: u64,
        read: impl FnOnce(&ObjectMeta) -> Result<R>,
    ) -> Result<R> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let obj = shard.map.get_mut(key).ok_or_else(|| not_found(key))?;
        if !obj.is_complete() {
            return Err(not_ready(key));
        }
        let r = read(obj)?;
        self.policy.lease.on_read(obj, now);
        Ok(r)
    }

    /// The complete replicas of `key`; grants the read lease.
    pub fn get_replica_list(&self, key: &str, now: u64) -> Result<GetReplicaListResponse> {
        let replicas = self.read_complete(key, now, |obj| {
            let live = obj.replicas.as_slice().iter();
            let live = live.filter(|p| p.segment.is_mounted());
            let replicas: Vec<ReplicaDesc> = live
                .clone()
                .filter(|p| p.segment.is_verified())
                .map(|p| {
                    p.segment
                        .descriptor(p.offset, obj.size, ReplicaStatus::Complete)
                })
                .collect();
            if replicas.is_empty() {
                // A restored segment waits for its owner to be heard from.
                return Err(match live.count() {
                    0 => not_found(key),
                    _ => not_ready(key),
                });
            }
            Ok(replicas)
        })?;
        Ok(GetReplicaListResponse {
            replicas,
            lease_ttl_ms: self.policy.lease.lease_ttl,
        })
    }

    /// Whether a complete object exists (a put in flight does not count).
    /// Like every metadata read in the reference, a hit grants the lease.
    pub fn exist_key(&self, key: &str, now: u64) -> Result<bool> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        match shard.map.get_mut(key) {
            Some(obj) if obj.is_complete() => {
                self.policy.lease.on_read(obj, now);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Size of a complete object; grants the lease.
    pub fn get_size(&self, key: &str, now: u64) -> Result<u64> {
        self.read_complete(key, now, |obj| Ok(obj.size))
    }

    /// Replicas of a complete object, without granting a lease (admin queries).
    pub fn query_key(&self, key: &str) -> Result<Vec<ReplicaDesc>> {
        check_key(key)?;
        let shard = self.objects.lock(key);
        let obj = shard.map.get(key).ok_or_else(|| not_found(key))?;
        if !obj.is_complete() {
            return Err(not_ready(key));
        }
        Ok(obj.replicas.descriptors(obj.size, ReplicaStatus::Complete))
    }

    /// Every complete object's key.
    pub fn all_keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        for shard in self.objects.shards() {
            keys.extend(
                shard
                    .map
                    .iter()
                    .filter(|(_, o)| o.is_complete())
                    .map(|(k, _)| k.to_string()),
            );
        }
        keys
    }
}
