//! The master RPC calls and their answers.
//!
//! Requests borrow their keys from the frame they were decoded from, so the
//! master serves a call without copying keys it does not keep.

use mooncake_common::{Error, Result};

use super::wire::{wire_struct, Decode, DecodeError, Encode, Reader};
use crate::types::{
    ClientId, DiskDescriptor, GetReplicaListResponse, LocalDiskDescriptor, MemoryDescriptor,
    OffloadBatch, OffloadTask, ReplicaDesc, ReplicaKind, ReplicaPolicy, ReplicaStatus, SegmentInfo,
    StorageConfig, TaskAssignment, TaskId, TaskInfo, TaskStatus, TaskType,
};

wire_struct!(ReplicaPolicy {
    replica_num,
    with_soft_pin,
    with_hard_pin,
    preferred_segment,
    preferred_segments,
    prefer_alloc_in_same_node,
    group_ids,
});
wire_struct!(SegmentInfo {
    name,
    base,
    size,
    transport_endpoint
});
wire_struct!(MemoryDescriptor {
    segment_name,
    transport_endpoint,
    buffer_address,
    size,
    suspected
});
wire_struct!(DiskDescriptor {
    file_path,
    object_size
});
wire_struct!(LocalDiskDescriptor {
    client_id,
    object_size,
    transport_endpoint
});
wire_struct!(OffloadTask {
    key,
    size,
    address,
    idle_ms
});
wire_struct!(OffloadBatch {
    tasks,
    removes,
    promotions
});
wire_struct!(StorageConfig {
    fsdir,
    enable_disk_eviction,
    quota_bytes
});
wire_struct!(ReplicaDesc { kind, status });
wire_struct!(GetReplicaListResponse {
    replicas,
    lease_ttl_ms
});
wire_struct!(TaskInfo {
    id,
    task_type,
    status,
    created_at_ms_epoch,
    last_updated_at_ms_epoch,
    assigned_client,
    message,
});
wire_struct!(TaskAssignment {
    id,
    task_type,
    key,
    source,
    targets
});

impl Encode for TaskType {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
}

impl<'de> Decode<'de> for TaskType {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(TaskType::ReplicaCopy),
            1 => Ok(TaskType::ReplicaMove),
            t => Err(DecodeError::BadTag {
                what: "task type",
                tag: t.into(),
            }),
        }
    }
}

impl Encode for TaskStatus {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
}

impl<'de> Decode<'de> for TaskStatus {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(TaskStatus::Pending),
            1 => Ok(TaskStatus::Processing),
            2 => Ok(TaskStatus::Failed),
            3 => Ok(TaskStatus::Success),
            t => Err(DecodeError::BadTag {
                what: "task status",
                tag: t.into(),
            }),
        }
    }
}

impl Encode for ReplicaStatus {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(match self {
            ReplicaStatus::Undefined => 0,
            ReplicaStatus::Initialized => 1,
            ReplicaStatus::Processing => 2,
            ReplicaStatus::Complete => 3,
            ReplicaStatus::Removed => 4,
            ReplicaStatus::Failed => 5,
        });
    }
}

impl<'de> Decode<'de> for ReplicaStatus {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        Ok(match r.u8()? {
            0 => ReplicaStatus::Undefined,
            1 => ReplicaStatus::Initialized,
            2 => ReplicaStatus::Processing,
            3 => ReplicaStatus::Complete,
            4 => ReplicaStatus::Removed,
            5 => ReplicaStatus::Failed,
            t => {
                return Err(DecodeError::BadTag {
                    what: "replica status",
                    tag: t.into(),
                })
            }
        })
    }
}

impl Encode for ReplicaKind {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ReplicaKind::Memory(m) => {
                out.push(0);
                m.encode(out);
            }
            ReplicaKind::Disk(d) => {
                out.push(1);
                d.encode(out);
            }
            ReplicaKind::LocalDisk(d) => {
                out.push(2);
                d.encode(out);
            }
        }
    }
}

impl<'de> Decode<'de> for ReplicaKind {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(ReplicaKind::Memory(Decode::decode(r)?)),
            1 => Ok(ReplicaKind::Disk(Decode::decode(r)?)),
            2 => Ok(ReplicaKind::LocalDisk(Decode::decode(r)?)),
            t => Err(DecodeError::BadTag {
                what: "replica kind",
                tag: t.into(),
            }),
        }
    }
}

/// Defines an enum whose variants have named fields, tagged by a byte on the wire.
/// With a lifetime parameter, decoding borrows from the input.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident $(<$lt:lifetime>)? {
            $( $(#[$vmeta:meta])* $tag:literal => $var:ident { $($field:ident : $fty:ty),* $(,)? } ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub enum $name $(<$lt>)? {
            $( $(#[$vmeta])* $var { $($field: $fty),* } ),*
        }

        impl $(<$lt>)? $name $(<$lt>)? {
            /// The wire tag of this variant.
            pub fn tag(&self) -> u8 {
                match self { $( $name::$var { .. } => $tag ),* }
            }

            /// The variant's name, as metrics and logs show it.
            pub fn name(&self) -> &'static str {
                Self::name_of(self.tag())
            }

            pub fn name_of(tag: u8) -> &'static str {
                match tag { $( $tag => stringify!($var), )* _ => "Unknown" }
            }

            /// Every tag in use.
            pub const TAGS: &'static [u8] = &[$($tag),*];
        }

        impl $(<$lt>)? Encode for $name $(<$lt>)? {
            fn encode(&self, out: &mut Vec<u8>) {
                match self {
                    $( $name::$var { $($field),* } => {
                        out.push($tag);
                        $( Encode::encode($field, out); )*
                    } )*
                }
            }
        }

        wire_enum!(@decode $name [$($lt)?] { $( $tag => $var { $($field),* } ),* });
    };
    (@decode $name:ident [$lt:lifetime] { $( $tag:literal => $var:ident { $($field:ident),* } ),* }) => {
        impl<$lt> Decode<$lt> for $name<$lt> {
            fn decode(r: &mut Reader<$lt>) -> Result<Self, DecodeError> {
                match r.u8()? {
                    $( $tag => Ok($name::$var { $($field: Decode::decode(r)?),* }), )*
                    t => Err(DecodeError::BadTag { what: stringify!($name), tag: t.into() }),
                }
            }
        }
    };
    (@decode $name:ident [] { $( $tag:literal => $var:ident { $($field:ident),* } ),* }) => {
        impl<'de> Decode<'de> for $name {
            fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
                match r.u8()? {
                    $( $tag => Ok($name::$var { $($field: Decode::decode(r)?),* }), )*
                    t => Err(DecodeError::BadTag { what: stringify!($name), tag: t.into() }),
                }
            }
        }
    };
}
pub(crate) use wire_enum;

wire_enum! {
    /// A call to the master.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Request<'a> {
        /// Heartbeat.
        1 => Ping { client_id: ClientId },
        2 => MountSegment { client_id: ClientId, segment: SegmentInfo },
        3 => UnmountSegment { client_id: ClientId, name: &'a str },
        /// `upsert` = insert or replace.
        4 => PutStart { client_id: ClientId, key: &'a str, value_len: u64, config: ReplicaPolicy, upsert: bool },
        5 => BatchPutStart {
            client_id: ClientId,
            keys: Vec<&'a str>,
            value_lens: Vec<u64>,
            config: ReplicaPolicy,
            upsert: bool,
        },
        6 => PutEnd { client_id: ClientId, key: &'a str },
        7 => BatchPutEnd { client_id: ClientId, keys: Vec<&'a str> },
        8 => PutRevoke { client_id: ClientId, key: &'a str },
        9 => BatchPutRevoke { client_id: ClientId, keys: Vec<&'a str> },
        10 => GetReplicaList { key: &'a str },
        11 => BatchGetReplicaList { keys: Vec<&'a str> },
        12 => ExistKey { key: &'a str },
        13 => BatchExistKey { keys: Vec<&'a str> },
        14 => GetSize { key: &'a str },
        15 => Remove { key: &'a str, force: bool },
        16 => BatchRemove { keys: Vec<&'a str>, force: bool },
        17 => RemoveByRegex { pattern: &'a str, force: bool },
        18 => RemoveAll { force: bool },
        /// Drops replicas (on `segment_name`, or all) of objects whose lease has expired.
        19 => BatchReplicaClear { client_id: ClientId, keys: Vec<&'a str>, segment_name: &'a str },
        20 => CreateCopyTask { key: &'a str, targets: Vec<&'a str> },
        21 => CreateMoveTask { key: &'a str, source: &'a str, target: &'a str },
        22 => QueryTask { id: TaskId },
        /// The executor asks for its tasks (they become Processing).
        23 => FetchTasks { client_id: ClientId, max: u32 },
        24 => MarkTaskComplete { client_id: ClientId, id: TaskId, success: bool, message: &'a str },
        /// Allocates the new replicas of a copy (or move, with `source`).
        25 => ReplicaTransferStart { client_id: ClientId, key: &'a str, source: &'a str, targets: Vec<&'a str> },
        /// Adds the written replicas (and drops the source of a move).
        26 => ReplicaTransferEnd { client_id: ClientId, key: &'a str },
        27 => ReplicaTransferRevoke { client_id: ClientId, key: &'a str },
        /// A storage client's SSD tier: `tier_id` names its directory across
        /// restarts (copies another client held in it move to this one),
        /// `endpoint` is its tier service, `capacity` its byte limit.
        28 => MountLocalDisk { client_id: ClientId, tier_id: &'a str, endpoint: &'a str, capacity: u64 },
        /// The objects to copy to the tier and the copies to delete.
        /// `promote_round_ms`: how often the tier takes promotions (its
        /// offload heartbeat; 0: the master's default). Sent with every
        /// pull, so a new leader knows it at once.
        29 => FetchOffloadTasks { client_id: ClientId, max: u32, promote_round_ms: u64 },
        /// These objects are durable in the tier (`restore`: found by a
        /// restart scan rather than written for a task).
        30 => NotifyOffload { client_id: ClientId, keys: Vec<&'a str>, sizes: Vec<u64>, restore: bool },
        /// These tasks failed; their memory copies stay.
        31 => NotifyOffloadFailure { client_id: ClientId, keys: Vec<&'a str> },
        /// Phase 1 of a tier eviction: the master forgets these copies.
        32 => EvictDiskReplicas { client_id: ClientId, keys: Vec<&'a str> },
        /// Promotion: memory replicas for a disk-only object whose copy
        /// this client holds; it fills them from its tier and ends with
        /// PutEnd (or PutRevoke).
        33 => PromotionStart { client_id: ClientId, key: &'a str },
        /// A standby (`standby`: its member id) asks its leader for the
        /// log entries after `after` (whose term it has as `after_term`):
        /// it holds every entry up to `after` and has applied those up to
        /// `applied`. The leader answers once it has more, or its commit
        /// point passed `applied`, or after `wait_ms`.
        34 => ReplicationPull {
            standby: &'a str,
            after: u64,
            after_term: u64,
            applied: u64,
            max: u32,
            wait_ms: u32,
        },
        /// The shared-filesystem tier's directory and limits.
        35 => GetStorageConfig {},
        /// This storage client mounts the shared-filesystem tier: it may be
        /// asked to write objects of its segments there.
        36 => MountSharedFs { client_id: ClientId },
        /// Up to `max` objects to write to the shared filesystem, and files
        /// to delete there.
        37 => FetchFileTasks { client_id: ClientId, max: u32 },
        /// `keys` (of `sizes`) are durable on the shared filesystem;
        /// `failed` could not be written; the files of `removed` are gone.
        /// One result per key.
        38 => NotifyFileCopies {
            client_id: ClientId,
            keys: Vec<&'a str>,
            sizes: Vec<u64>,
            failed: Vec<&'a str>,
            removed: Vec<&'a str>,
        },
        /// Proves this connection knows the cluster token (the master's
        /// `--cluster_token_file`): with one configured, the first call of
        /// every connection. Answered `Unit`; accepted (and ignored) by a
        /// master without a token.
        39 => Authenticate { token: &'a str },
        /// A standby loading the leader's snapshot at `seq` asks for its
        /// bytes from `offset` on.
        40 => SnapshotFetch { standby: &'a str, seq: u64, offset: u64 },
        /// HA: the election term this connection's calls are made under
        /// (the leader's term as the client found it in the coordination
        /// service), stated once per connection after `Authenticate`. A
        /// master leading another term refuses it, and every later call
        /// on the connection, with `UNAVAILABLE_IN_CURRENT_STATUS`;
        /// accepted (and ignored) by a master outside HA.
        41 => LeaderTerm { term: u64 },
        /// The tenant this connection's object calls act for, stated once
        /// per connection after `Authenticate` (none stated: `default`).
        /// Read only by a master in multi-tenant mode.
        42 => Tenant { tenant_id: &'a str },
        /// This storage client withdraws its SSD tier (before it stops): no
        /// more offload or promotion work, and its copies are forgotten.
        /// Done already when it has none.
        43 => UnmountLocalDisk { client_id: ClientId },
    }
}

/// Log entry frames (`master::durable::oplog` codec), back to back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frames(pub Vec<u8>);

impl Encode for Frames {
    fn encode(&self, out: &mut Vec<u8>) {
        super::wire::put_varint(out, self.0.len() as u64);
        out.extend_from_slice(&self.0);
    }
}

impl<'de> Decode<'de> for Frames {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        let n = r.len(1)?;
        Ok(Frames(r.bytes(n)?.to_vec()))
    }
}

wire_enum! {
    /// The master's answer. A call gets the variant of its kind, or `Failed`
    /// when the call itself was rejected (malformed frame, mismatched batch).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Response {
        1 => Unit { result: Result<()> },
        2 => Units { results: Vec<Result<()>> },
        3 => Replicas { result: Result<Vec<ReplicaDesc>> },
        4 => BatchReplicas { results: Vec<Result<Vec<ReplicaDesc>>> },
        5 => ReplicaList { result: Result<GetReplicaListResponse> },
        6 => BatchReplicaList { results: Vec<Result<GetReplicaListResponse>> },
        7 => Bool { result: Result<bool> },
        8 => Bools { results: Vec<Result<bool>> },
        9 => Count { result: Result<u64> },
        10 => Failed { error: Error },
        11 => Keys { result: Result<Vec<String>> },
        12 => Task { result: Result<TaskId> },
        13 => TaskState { result: Result<TaskInfo> },
        14 => Tasks { result: Result<Vec<TaskAssignment>> },
        15 => Offload { result: Result<OffloadBatch> },
        /// The answer to `ReplicationPull`: the leader's term, its commit
        /// point, its clock (ms) and the entries `after + 1 ..`.
        16 => Entries { term: u64, committed: u64, leader_now: u64, frames: Frames },
        17 => Storage { result: Result<StorageConfig> },
        /// The answer to a pull the log no longer reaches back to (it was
        /// compacted into a snapshot), and to `SnapshotFetch`: the bytes
        /// `offset ..` (at most a chunk) of the snapshot at entry `seq`
        /// of `term`, `total` bytes long.
        18 => SnapshotChunk { seq: u64, term: u64, leader_now: u64, offset: u64, total: u64, chunk: Frames },
    }
}
