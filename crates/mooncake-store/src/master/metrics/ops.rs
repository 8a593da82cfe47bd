//! Per-call counters: which family each request counts under.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::proto::Request;

/// A single (not batch) call, in the reference's order of families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    ExistKey,
    PutStart,
    PutEnd,
    PutRevoke,
    GetReplicaList,
    GetReplicaListByRegex,
    Remove,
    RemoveByRegex,
    RemoveAll,
    MountSegment,
    UnmountSegment,
    RemountSegment,
    Ping,
    CopyStart,
    CopyEnd,
    CopyRevoke,
    MoveStart,
    MoveEnd,
    MoveRevoke,
    EvictDiskReplica,
    CreateCopyTask,
    CreateMoveTask,
    UpdateTask,
    QueryTask,
    FetchTasks,
    // Ours: the reference has no such families.
    GetSize,
    ReplicaTransferStart,
    ReplicaTransferEnd,
    ReplicaTransferRevoke,
}

impl Op {
    pub const ALL: [Op; 29] = [
        Op::ExistKey,
        Op::PutStart,
        Op::PutEnd,
        Op::PutRevoke,
        Op::GetReplicaList,
        Op::GetReplicaListByRegex,
        Op::Remove,
        Op::RemoveByRegex,
        Op::RemoveAll,
        Op::MountSegment,
        Op::UnmountSegment,
        Op::RemountSegment,
        Op::Ping,
        Op::CopyStart,
        Op::CopyEnd,
        Op::CopyRevoke,
        Op::MoveStart,
        Op::MoveEnd,
        Op::MoveRevoke,
        Op::EvictDiskReplica,
        Op::CreateCopyTask,
        Op::CreateMoveTask,
        Op::UpdateTask,
        Op::QueryTask,
        Op::FetchTasks,
        Op::GetSize,
        Op::ReplicaTransferStart,
        Op::ReplicaTransferEnd,
        Op::ReplicaTransferRevoke,
    ];

    /// (metric name part, RPC name for help texts).
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            Op::ExistKey => ("exist_key", "ExistKey"),
            Op::PutStart => ("put_start", "PutStart"),
            Op::PutEnd => ("put_end", "PutEnd"),
            Op::PutRevoke => ("put_revoke", "PutRevoke"),
            Op::GetReplicaList => ("get_replica_list", "GetReplicaList"),
            Op::GetReplicaListByRegex => ("get_replica_list_by_regex", "GetReplicaListByRegex"),
            Op::Remove => ("remove", "Remove"),
            Op::RemoveByRegex => ("remove_by_regex", "RemoveByRegex"),
            Op::RemoveAll => ("remove_all", "RemoveAll"),
            Op::MountSegment => ("mount_segment", "MountSegment"),
            Op::UnmountSegment => ("unmount_segment", "UnmountSegment"),
            Op::RemountSegment => ("remount_segment", "ReMountSegment"),
            Op::Ping => ("ping", "Ping"),
            Op::CopyStart => ("copy_start", "CopyStart"),
            Op::CopyEnd => ("copy_end", "CopyEnd"),
            Op::CopyRevoke => ("copy_revoke", "CopyRevoke"),
            Op::MoveStart => ("move_start", "MoveStart"),
            Op::MoveEnd => ("move_end", "MoveEnd"),
            Op::MoveRevoke => ("move_revoke", "MoveRevoke"),
            Op::EvictDiskReplica => ("evict_disk_replica", "EvictDiskReplica"),
            Op::CreateCopyTask => ("create_copy_task", "CreateCopyTask"),
            Op::CreateMoveTask => ("create_move_task", "CreateMoveTask"),
            Op::UpdateTask => ("update_task", "MarkTaskToComplete"),
            Op::QueryTask => ("query_task", "QueryTask"),
            Op::FetchTasks => ("fetch_tasks", "FetchTasks"),
            Op::GetSize => ("get_size", "GetSize"),
            Op::ReplicaTransferStart => ("replica_transfer_start", "ReplicaTransferStart"),
            Op::ReplicaTransferEnd => ("replica_transfer_end", "ReplicaTransferEnd"),
            Op::ReplicaTransferRevoke => ("replica_transfer_revoke", "ReplicaTransferRevoke"),
        }
    }

    /// The family a request counts under (before copy/move attribution).
    pub fn of(req: &Request<'_>) -> Option<Op> {
        Some(match req {
            Request::Ping { .. } => Op::Ping,
            Request::MountSegment { .. } => Op::MountSegment,
            Request::UnmountSegment { .. } => Op::UnmountSegment,
            Request::PutStart { .. } => Op::PutStart,
            Request::PutEnd { .. } => Op::PutEnd,
            Request::PutRevoke { .. } => Op::PutRevoke,
            Request::GetReplicaList { .. } => Op::GetReplicaList,
            Request::ExistKey { .. } => Op::ExistKey,
            Request::GetSize { .. } => Op::GetSize,
            Request::Remove { .. } => Op::Remove,
            Request::RemoveByRegex { .. } => Op::RemoveByRegex,
            Request::RemoveAll { .. } => Op::RemoveAll,
            Request::CreateCopyTask { .. } => Op::CreateCopyTask,
            Request::CreateMoveTask { .. } => Op::CreateMoveTask,
            Request::QueryTask { .. } => Op::QueryTask,
            Request::FetchTasks { .. } => Op::FetchTasks,
            Request::MarkTaskComplete { .. } => Op::UpdateTask,
            Request::ReplicaTransferStart { .. } => Op::ReplicaTransferStart,
            Request::ReplicaTransferEnd { .. } => Op::ReplicaTransferEnd,
            Request::ReplicaTransferRevoke { .. } => Op::ReplicaTransferRevoke,
            _ => return None,
        })
    }
}

/// A batch call, in the reference's order of families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOp {
    ExistKey,
    QueryIp,
    ReplicaClear,
    GetReplicaList,
    PutStart,
    PutEnd,
    PutRevoke,
}

impl BatchOp {
    pub const ALL: [BatchOp; 7] = [
        BatchOp::ExistKey,
        BatchOp::QueryIp,
        BatchOp::ReplicaClear,
        BatchOp::GetReplicaList,
        BatchOp::PutStart,
        BatchOp::PutEnd,
        BatchOp::PutRevoke,
    ];

    /// (metric name part, RPC name for help texts).
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            BatchOp::ExistKey => ("exist_key", "BatchExistKey"),
            BatchOp::QueryIp => ("query_ip", "BatchQueryIp"),
            BatchOp::ReplicaClear => ("replica_clear", "BatchReplicaClear"),
            BatchOp::GetReplicaList => ("get_replica_list", "BatchGetReplicaList"),
            BatchOp::PutStart => ("put_start", "BatchPutStart"),
            BatchOp::PutEnd => ("put_end", "BatchPutEnd"),
            BatchOp::PutRevoke => ("put_revoke", "BatchPutRevoke"),
        }
    }

    pub fn of(req: &Request<'_>) -> Option<BatchOp> {
        Some(match req {
            Request::BatchPutStart { .. } => BatchOp::PutStart,
            Request::BatchPutEnd { .. } => BatchOp::PutEnd,
            Request::BatchPutRevoke { .. } => BatchOp::PutRevoke,
            Request::BatchGetReplicaList { .. } => BatchOp::GetReplicaList,
            Request::BatchExistKey { .. } => BatchOp::ExistKey,
            Request::BatchReplicaClear { .. } => BatchOp::ReplicaClear,
            _ => return None,
        })
    }
}

#[derive(Default, Clone)]
pub(super) struct OpCounters {
    pub requests: Counter,
    pub failures: Counter,
}

#[derive(Default, Clone)]
pub(super) struct BatchCounters {
    pub requests: Counter,
    pub failures: Counter,
    pub partial_successes: Counter,
    pub items: Counter,
    pub failed_items: Counter,
}

pub(super) fn register_singles(r: &mut Registry) -> Vec<OpCounters> {
    Op::ALL
        .iter()
        .map(|op| {
            let (name, rpc) = op.names();
            let c = OpCounters::default();
            r.register(
                format!("master_{name}_requests"),
                format!("Total number of {rpc} requests received"),
                c.requests.clone(),
            );
            r.register(
                format!("master_{name}_failures"),
                format!("Total number of failed {rpc} requests"),
                c.failures.clone(),
            );
            c
        })
        .collect()
}

pub(super) fn register_batches(r: &mut Registry) -> Vec<BatchCounters> {
    BatchOp::ALL
        .iter()
        .map(|op| {
            let (name, rpc) = op.names();
            let c = BatchCounters::default();
            let p = format!("master_batch_{name}");
            let families = [
                (
                    "requests",
                    format!("Total number of {rpc} requests received"),
                    &c.requests,
                ),
                (
                    "failures",
                    format!("Total number of {rpc} requests where every item failed"),
                    &c.failures,
                ),
                (
                    "partial_successes",
                    format!("Total number of {rpc} requests where some items failed"),
                    &c.partial_successes,
                ),
                (
                    "items",
                    format!("Total number of items in {rpc} requests"),
                    &c.items,
                ),
                (
                    "failed_items",
                    format!("Total number of failed items in {rpc} requests"),
                    &c.failed_items,
                ),
            ];
            for (suffix, help, counter) in families {
                r.register(format!("{p}_{suffix}"), help, counter.clone());
            }
            c
        })
        .collect()
}
