//! Reads: they change only volatile state (the read lease and soft pin),
//! so they make no mutation.

use mooncake_common::{Error, ErrorCode, Result};

use super::{check_key, not_found, not_ready, MasterService};
use crate::master::state::objects::ObjectMeta;
use crate::types::{GetReplicaListResponse, ReplicaDesc, ReplicaStatus};

impl MasterService {
    /// Runs `read` on `key`'s complete object; when it succeeds, the read
    /// lease is granted (to its whole group, if it is in one).
    fn read_complete<R>(
        &self,
        key: &str,
        now: u64,
        read: impl FnOnce(&ObjectMeta) -> Result<R>,
    ) -> Result<R> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let mut obj = shard.get_mut(key).ok_or_else(|| not_found(key))?;
        if !obj.is_complete() {
            return Err(not_ready(key));
        }
        let r = read(&obj)?;
        let stale = self.policy.lease.is_stale(&obj, now);
        self.policy.lease.on_read(&mut obj, now);
        drop(obj);
        drop(shard);
        if stale {
            self.lease_group(key, now);
        }
        Ok(r)
    }

    /// A read of a grouped object leases every complete member of its
    /// group, as the reference does: the members are used together. Only
    /// when the object read had less than half a lease left (as the
    /// reference), so a batch reading a whole group leases it about once.
    /// One shard locked at a time; the lease is volatile, so no mutation.
    fn lease_group(&self, key: &str, now: u64) {
        for member in self.objects.groups.members_with(key) {
            let mut shard = self.objects.lock(&member);
            let now = shard.clock(now);
            if let Some(mut obj) = shard.get_mut(&member) {
                if obj.is_complete() {
                    self.policy.lease.lease(&mut obj, now);
                }
            };
        }
    }

    /// The complete replicas of `key`, memory first, then its copy in an
    /// SSD tier; grants the read lease (a disk-only object has none). A
    /// Suspected owner's memory replicas are left out while another memory
    /// replica is not (`clients::health`).
    pub fn get_replica_list(&self, key: &str, now: u64) -> Result<GetReplicaListResponse> {
        let in_memory = self.read_complete(key, now, |obj| {
            let live = obj.replicas.as_slice().iter();
            let live = live.filter(|p| p.segment.is_mounted());
            let served = live.clone().filter(|p| p.segment.is_verified());
            let trusted = served.clone().any(|p| !p.segment.is_suspected());
            let mut replicas: Vec<ReplicaDesc> = served
                .filter(|p| !trusted || !p.segment.is_suspected())
                .map(|p| {
                    p.segment
                        .descriptor(p.offset, obj.size, ReplicaStatus::Complete)
                })
                .collect();
            if obj.is_on_disk() {
                replicas.extend(self.disk_replica(key).map(|(d, _)| d));
            }
            if replicas.is_empty() {
                // A restored segment waits for its owner to be heard from.
                return Err(match live.count() {
                    0 => not_found(key),
                    _ => Error::new(
                        ErrorCode::REPLICA_IS_NOT_READY,
                        format!("object {key:?} is on a segment whose owner was not heard from since the restore"),
                    ),
                });
            }
            Ok(replicas)
        });
        let mut replicas = match in_memory {
            Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => match self.disk_replica(key) {
                Some((d, _)) => {
                    if let crate::types::ReplicaKind::LocalDisk(l) = &d.kind {
                        self.disk_hit(key, l.client_id, now);
                    }
                    vec![d]
                }
                None => return Err(e),
            },
            // Its promotion is under way: the copy serves until it ends,
            // as the reference's disk replica does.
            Err(e) if e.code == ErrorCode::REPLICA_IS_NOT_READY => {
                vec![self.promoting_copy(key).ok_or(e)?]
            }
            r => r?,
        };
        self.hot_key_read(key, &mut replicas, now);
        Ok(GetReplicaListResponse {
            replicas,
            lease_ttl_ms: self.policy.lease.lease_ttl,
        })
    }

    /// Whether a complete object exists (a put in flight does not count,
    /// unless it is a promotion: its disk copy serves).
    /// Unlike the reference, which leases on a hit, a check is not a use:
    /// clients that poll for prefixes would otherwise keep every object
    /// they ask about from being evicted (see `leases`). A grouped object
    /// is the exception, as in the reference: a hit leases its group.
    pub fn exist_key(&self, key: &str, now: u64) -> Result<bool> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        shard.clock(now);
        match shard.get(key) {
            Some(obj) if obj.is_complete() => {
                let stale = self.policy.lease.is_stale(obj, now);
                drop(shard);
                if stale {
                    self.lease_group(key, now);
                }
                Ok(true)
            }
            // A put in flight, unless it is a promotion (the copy serves).
            Some(_) => Ok(self.disk.has_copy(key)),
            None => Ok(self.disk.has_copy(key)),
        }
    }

    /// Size of a complete object; grants the lease.
    pub fn get_size(&self, key: &str, now: u64) -> Result<u64> {
        match self.read_complete(key, now, |obj| Ok(obj.size)) {
            Err(e)
                if e.code == ErrorCode::OBJECT_NOT_FOUND
                    || e.code == ErrorCode::REPLICA_IS_NOT_READY =>
            {
                self.disk.copy(key).map(|c| c.size).ok_or(e)
            }
            r => r,
        }
    }

    /// Replicas of a complete object, without granting a lease (admin queries).
    pub fn query_key(&self, key: &str) -> Result<Vec<ReplicaDesc>> {
        check_key(key)?;
        let shard = self.objects.lock(key);
        let Some(obj) = shard.get(key) else {
            let (d, _) = self.disk_replica(key).ok_or_else(|| not_found(key))?;
            return Ok(vec![d]);
        };
        if !obj.is_complete() {
            drop(shard);
            return self
                .promoting_copy(key)
                .map(|d| vec![d])
                .ok_or_else(|| not_ready(key));
        }
        let mut v = obj.replicas.descriptors(obj.size, ReplicaStatus::Complete);
        if obj.is_on_disk() {
            v.extend(self.disk_replica(key).map(|(d, _)| d));
        }
        Ok(v)
    }

    /// The copy of `key` while its object is a put in flight: only a
    /// promotion writes an object whose copy is still recorded (a new
    /// version forgets it at its start).
    fn promoting_copy(&self, key: &str) -> Option<ReplicaDesc> {
        self.disk_replica(key).map(|(d, _)| d)
    }

    /// Every complete object's key.
    pub fn all_keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        self.visit_keys(|k| keys.push(k.to_owned()));
        keys
    }

    /// Hands every complete object's key to `visit`: those in memory shard
    /// by shard, each shard locked only while its keys are visited (so
    /// `visit` should only copy them), then those only in an SSD tier.
    /// Nothing is collected on the way: `/get_all_keys` writes its answer
    /// straight from here.
    pub fn visit_keys(&self, mut visit: impl FnMut(&str)) {
        for shard in self.objects.shards() {
            for (key, obj) in shard.iter() {
                if obj.is_complete() {
                    visit(key);
                }
            }
        }
        // The tier's keys are copied out first: a shard is never locked
        // under the tier's lock.
        for key in self.disk.keys_where(|_| true) {
            let in_memory = self
                .objects
                .lock(&key)
                .get(&key)
                .is_some_and(ObjectMeta::is_complete);
            if !in_memory {
                visit(&key);
            }
        }
    }
}
