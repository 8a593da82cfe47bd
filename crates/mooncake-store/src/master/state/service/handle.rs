//! The RPC surface: one decoded request in, one answer out: the response
//! and when it may go out.

use mooncake_common::{Error, ErrorCode};

use super::MasterService;
use crate::master::state::mutation::{Call, Release};
use crate::proto::{Request, Response};

/// A decided call: its response, and the release the server must wait
/// for before sending it (an error of that wait replaces the response).
#[derive(Debug)]
#[must_use = "the response may go out only once its release holds"]
pub struct Answer {
    pub response: Response,
    pub release: Release,
}

impl MasterService {
    /// Serves one decoded request.
    pub fn handle(&self, req: Request<'_>, now: u64) -> Answer {
        self.handle_as(req, crate::tenant::DEFAULT_TENANT, now)
    }

    /// Serves one decoded request of a caller of `tenant` (which only
    /// multi-tenant mode reads).
    pub fn handle_as(&self, req: Request<'_>, tenant: &str, now: u64) -> Answer {
        let mut call = Call::default();
        let response = match &self.tenants {
            None => self.respond(&mut call, req, None, now),
            Some(_) => self.respond_as(&mut call, req, tenant, now),
        };
        Answer {
            response,
            release: call.release_reading(|| self.read_index()),
        }
    }

    /// The sink's read index (`MutationSink::read_index`).
    fn read_index(&self) -> Release {
        self.sink.as_ref().map_or(Release::Now, |s| s.read_index())
    }

    /// Answers `req`; `scope`: in multi-tenant mode, the caller's tenant,
    /// the one whose objects removals of many keys reach.
    pub(super) fn respond(
        &self,
        call: &mut Call,
        req: Request<'_>,
        scope: Option<&str>,
        now: u64,
    ) -> Response {
        use Request as Q;
        use Response as A;
        let mismatch = |a: usize, b: usize| A::Failed {
            error: Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("{a} keys but {b} value lengths"),
            ),
        };
        match req {
            Q::Ping { client_id } => A::Unit {
                result: self.ping_in(call, client_id, now),
            },
            Q::MountSegment { client_id, segment } => A::Unit {
                result: self.mount_segment_in(call, client_id, &segment, now),
            },
            Q::UnmountSegment { client_id, name } => A::Unit {
                result: self.unmount_segment_in(call, client_id, name, now),
            },
            Q::PutStart {
                client_id,
                key,
                value_len,
                config,
                upsert,
            } => A::Replicas {
                result: self.put_start_in(call, client_id, key, value_len, &config, upsert, now),
            },
            Q::BatchPutStart {
                client_id,
                keys,
                value_lens,
                config,
                upsert,
            } => {
                if keys.len() != value_lens.len() {
                    return mismatch(keys.len(), value_lens.len());
                }
                if !config.groups_fit(keys.len()) {
                    let e = Error::new(
                        ErrorCode::INVALID_PARAMS,
                        "group_ids must name one group per key",
                    );
                    let results = vec![Err(e); keys.len()];
                    return A::BatchReplicas { results };
                }
                // A key repeated in one batch: its first occurrence's put
                // holds it, so the repeat keeps the stored value and
                // succeeds ("first wins", as in the reference), rather than
                // meeting a put in flight.
                let mut started = std::collections::HashSet::new();
                let results = keys
                    .iter()
                    .zip(&value_lens)
                    .enumerate()
                    .map(|(i, (&k, &len))| {
                        if !upsert && started.contains(k) {
                            return Err(Error::new(
                                ErrorCode::OBJECT_ALREADY_EXISTS,
                                format!("object {k:?} is put earlier in this batch"),
                            ));
                        }
                        let own;
                        let config = match config.group_ids {
                            Some(_) => {
                                own = config.for_keys(&[i]);
                                &own
                            }
                            None => &config,
                        };
                        let r = self.put_start_in(call, client_id, k, len, config, upsert, now);
                        if r.is_ok() && keys.len() > 1 {
                            started.insert(k);
                        }
                        r
                    })
                    .collect();
                A::BatchReplicas { results }
            }
            Q::PutEnd { client_id, key } => A::Unit {
                result: self.put_end_in(call, client_id, key, now),
            },
            Q::BatchPutEnd { client_id, keys } => A::Units {
                results: keys
                    .iter()
                    .map(|k| self.put_end_in(call, client_id, k, now))
                    .collect(),
            },
            Q::PutRevoke { client_id, key } => A::Unit {
                result: self.put_revoke_in(call, client_id, key, now),
            },
            Q::BatchPutRevoke { client_id, keys } => A::Units {
                results: keys
                    .iter()
                    .map(|k| self.put_revoke_in(call, client_id, k, now))
                    .collect(),
            },
            Q::GetReplicaList { key } => A::ReplicaList {
                result: self.get_replica_list(key, now),
            },
            Q::BatchGetReplicaList { keys } => A::BatchReplicaList {
                results: keys.iter().map(|k| self.get_replica_list(k, now)).collect(),
            },
            Q::ExistKey { key } => A::Bool {
                result: self.exist_key(key, now),
            },
            Q::BatchExistKey { keys } => A::Bools {
                results: keys.iter().map(|k| self.exist_key(k, now)).collect(),
            },
            Q::GetSize { key } => A::Count {
                result: self.get_size(key, now),
            },
            Q::Remove { key, force } => A::Unit {
                result: self.remove_in(call, key, force, now),
            },
            Q::BatchRemove { keys, force } => A::Units {
                results: keys
                    .iter()
                    .map(|k| self.remove_quietly(call, k, force, now))
                    .collect(),
            },
            Q::RemoveByRegex { pattern, force } => A::Count {
                result: self.remove_by_regex_in(call, pattern, force, scope, now),
            },
            Q::BatchReplicaClear {
                keys, segment_name, ..
            } => A::Keys {
                result: Ok(self.batch_replica_clear_in(call, &keys, segment_name, now)),
            },
            Q::CreateCopyTask { key, targets } => A::Task {
                result: self.create_copy_task_in(call, key, &targets, now),
            },
            Q::CreateMoveTask {
                key,
                source,
                target,
            } => A::Task {
                result: self.create_move_task_in(call, key, source, target, now),
            },
            Q::QueryTask { id } => A::TaskState {
                result: self.query_task(id),
            },
            Q::FetchTasks { client_id, max } => A::Tasks {
                result: Ok(self.fetch_tasks_in(call, client_id, max, now)),
            },
            Q::MarkTaskComplete {
                client_id,
                id,
                success,
                message,
            } => A::Unit {
                result: self.mark_task_complete_in(call, client_id, id, success, message, now),
            },
            Q::ReplicaTransferStart {
                client_id,
                key,
                source,
                targets,
            } => A::Replicas {
                result: self.replica_transfer_start_in(call, client_id, key, source, &targets, now),
            },
            Q::ReplicaTransferEnd { client_id, key } => A::Unit {
                result: self.replica_transfer_end_in(call, client_id, key, now),
            },
            Q::ReplicaTransferRevoke { client_id, key } => A::Unit {
                result: self.replica_transfer_revoke_in(call, client_id, key),
            },
            Q::RemoveAll { force } => A::Count {
                result: Ok(self.remove_all_in(call, force, scope, now)),
            },
            Q::MountLocalDisk {
                client_id,
                tier_id,
                endpoint,
                capacity,
            } => A::Unit {
                result: self.mount_local_disk_in(call, client_id, tier_id, endpoint, capacity, now),
            },
            Q::UnmountLocalDisk { client_id } => A::Unit {
                result: self.unmount_local_disk_in(call, client_id),
            },
            Q::FetchOffloadTasks {
                client_id,
                max,
                promote_round_ms,
            } => A::Offload {
                result: self.fetch_offload_tasks_paced(client_id, max, promote_round_ms, now),
            },
            Q::NotifyOffload {
                client_id,
                keys,
                sizes,
                restore,
            } => {
                if keys.len() != sizes.len() {
                    return mismatch(keys.len(), sizes.len());
                }
                A::Units {
                    results: self.notify_offload_in(call, client_id, &keys, &sizes, restore, now),
                }
            }
            Q::NotifyOffloadFailure { client_id, keys } => A::Unit {
                result: self.notify_offload_failure(client_id, &keys),
            },
            Q::PromotionStart { client_id, key } => A::Replicas {
                result: self.promotion_start_in(call, client_id, key, now),
            },
            Q::EvictDiskReplicas { client_id, keys } => A::Units {
                results: self.evict_disk_replicas_in(call, client_id, &keys, now),
            },
            // The connection answers it (see `serve::server`).
            Q::Authenticate { .. } | Q::LeaderTerm { .. } | Q::Tenant { .. } => {
                A::Unit { result: Ok(()) }
            }
            Q::GetStorageConfig {} => A::Storage {
                result: Ok(self.storage_config()),
            },
            Q::MountSharedFs { client_id } => A::Unit {
                result: self.mount_shared_fs_in(call, client_id, now),
            },
            Q::FetchFileTasks { client_id, max } => A::Offload {
                result: self.fetch_file_tasks(client_id, max, now),
            },
            Q::NotifyFileCopies {
                client_id,
                keys,
                sizes,
                failed,
                removed,
            } => {
                if keys.len() != sizes.len() {
                    return mismatch(keys.len(), sizes.len());
                }
                A::Units {
                    results: self
                        .notify_file_copies(client_id, &keys, &sizes, &failed, &removed, now),
                }
            }
            // The server answers it when this master leads with replication.
            Q::ReplicationPull { .. } | Q::SnapshotFetch { .. } => A::Failed {
                error: Error::new(
                    ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                    "this master does not replicate its log",
                ),
            },
        }
    }
}
