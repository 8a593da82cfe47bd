//! Types shared by the master, its clients and the wire protocol.

use serde::{Deserialize, Serialize};

/// Longest key the master accepts, in bytes (longer keys are `INVALID_KEY`).
/// The reference takes 4 MiB keys (measured), so callers may rely on them.
pub const MAX_KEY_LEN: usize = 4 << 20;
/// Largest single value the master accepts (larger values are `INVALID_PARAMS`;
/// values that fit this limit but no segment are `NO_AVAILABLE_HANDLE`).
pub const MAX_VALUE_LEN: u64 = 1 << 40;
/// Most replicas one object may ask for (more is `INVALID_PARAMS`).
pub const MAX_REPLICA_NUM: usize = 64;

/// How many copies of an object to keep and where to put them: the
/// reference's `ReplicateConfig` (the crate root's [`crate::ReplicateConfig`]
/// is the reference Rust crate's four-field one, which converts to this).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaPolicy {
    /// Total number of replicas, each on a distinct segment, best effort (at least one).
    pub replica_num: usize,
    /// Keep the object out of eviction while it is accessed within the soft-pin TTL.
    pub with_soft_pin: bool,
    /// Never evict the object; only an explicit remove drops it.
    pub with_hard_pin: bool,
    /// Segment to try first (`""` = none).
    pub preferred_segment: String,
    /// Segments to try first, in order (after `preferred_segment`).
    pub preferred_segments: Vec<String>,
    /// The writer's host first for this one-replica put (the master's
    /// `local_first` order), whatever the allocation strategy.
    pub prefer_alloc_in_same_node: bool,
    /// The group of each key the call writes, in order (`""`: none); one
    /// entry for a single-key put. Members of a group are leased together
    /// by a read of any one of them and evicted together; an existing
    /// object keeps its group (`None` here), an upsert naming another one
    /// is refused. `None`: no group named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_ids: Option<Vec<String>>,
}

impl ReplicaPolicy {
    /// This policy for the keys at `indices` of the call it was given for
    /// (their groups, in that order).
    pub fn for_keys(&self, indices: &[usize]) -> ReplicaPolicy {
        let mut p = self.clone();
        if let Some(groups) = &self.group_ids {
            p.group_ids = Some(
                indices
                    .iter()
                    .filter_map(|&i| groups.get(i).cloned())
                    .collect(),
            );
        }
        p
    }

    /// Whether the groups, if named, match a call on `keys` keys (the
    /// reference answers INVALID_PARAMS for every key otherwise).
    pub fn groups_fit(&self, keys: usize) -> bool {
        self.group_ids.as_ref().is_none_or(|g| g.len() == keys)
    }
}

impl Default for ReplicaPolicy {
    fn default() -> Self {
        ReplicaPolicy {
            replica_num: 1,
            with_soft_pin: false,
            with_hard_pin: false,
            preferred_segment: String::new(),
            preferred_segments: Vec::new(),
            prefer_alloc_in_same_node: false,
            group_ids: None,
        }
    }
}

/// One write command, as every put and upsert variant passes it down to the
/// master: where the replicas go, and whether an existing object is
/// replaced (`upsert`) or makes the put fail.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteOptions {
    pub config: ReplicaPolicy,
    pub upsert: bool,
}

impl WriteOptions {
    /// A put: a key that already exists is refused.
    pub fn put(config: &ReplicaPolicy) -> WriteOptions {
        WriteOptions {
            config: config.clone(),
            upsert: false,
        }
    }

    /// An upsert: an existing object is replaced.
    pub fn upsert(config: &ReplicaPolicy) -> WriteOptions {
        WriteOptions {
            config: config.clone(),
            upsert: true,
        }
    }
}

/// A put of `config`.
impl From<&ReplicaPolicy> for WriteOptions {
    fn from(config: &ReplicaPolicy) -> WriteOptions {
        WriteOptions::put(config)
    }
}

/// Identifies a client process: random per process (uuid-like).
pub type ClientId = u128;

/// A memory segment a client contributes to the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    /// Segment name, unique in the cluster.
    pub name: String,
    /// Virtual address of the segment buffer in its owner process.
    pub base: u64,
    pub size: u64,
    /// Transfer-engine segment name to open (the engine's local server name), e.g. `"host:port"`.
    pub transport_endpoint: String,
}

/// Life cycle of a replica, as the reference names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplicaStatus {
    Undefined,
    Initialized,
    Processing,
    Complete,
    Removed,
    Failed,
}

/// Where a memory replica's bytes live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryDescriptor {
    pub segment_name: String,
    pub transport_endpoint: String,
    /// Address inside the owner's segment buffer (`SegmentInfo::base` + offset).
    pub buffer_address: u64,
    pub size: u64,
    /// The segment's owner missed its heartbeats (`--client_suspect_ms`):
    /// the master lists such a replica only when no other memory replica
    /// is served, and readers wait for it only a short while
    /// (`MC_STORE_SUSPECT_READ_TIMEOUT_MS`). Absent: not suspected.
    #[serde(default)]
    pub suspected: bool,
}

/// Where a disk replica's bytes live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskDescriptor {
    pub file_path: String,
    pub object_size: u64,
}

/// A copy in a storage client's SSD tier (the reference's `LOCAL_DISK`):
/// readable through its owner, which stages it for the reader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalDiskDescriptor {
    /// The storage client holding the copy.
    pub client_id: ClientId,
    pub object_size: u64,
    /// The owner's tier service, `host:port`.
    pub transport_endpoint: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaKind {
    Memory(MemoryDescriptor),
    Disk(DiskDescriptor),
    LocalDisk(LocalDiskDescriptor),
}

/// One replica of an object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDesc {
    pub kind: ReplicaKind,
    pub status: ReplicaStatus,
}

impl ReplicaDesc {
    /// The memory descriptor, if this is a memory replica.
    pub fn memory(&self) -> Option<&MemoryDescriptor> {
        match &self.kind {
            ReplicaKind::Memory(m) => Some(m),
            ReplicaKind::Disk(_) | ReplicaKind::LocalDisk(_) => None,
        }
    }

    /// Size of the object this replica holds.
    pub fn size(&self) -> u64 {
        match &self.kind {
            ReplicaKind::Memory(m) => m.size,
            ReplicaKind::Disk(d) => d.object_size,
            ReplicaKind::LocalDisk(d) => d.object_size,
        }
    }
}

/// Answer to GetReplicaList: replicas (all complete) and the lease granted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetReplicaListResponse {
    pub replicas: Vec<ReplicaDesc>,
    /// How long (from the master's answer) the object is protected from removal and eviction.
    pub lease_ttl_ms: u64,
}

/// Identifies a copy or move task (a UUID; Python shows it as `(hi, lo)`).
pub type TaskId = u128;

/// What a task does, numbered as the reference's `TaskType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskType {
    /// Add replicas of an object on target segments.
    ReplicaCopy = 0,
    /// Move an object's replica from a source segment to a target segment.
    ReplicaMove = 1,
}

/// Where a task is, numbered as the reference's `TaskStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskStatus {
    Pending = 0,
    Processing = 1,
    Failed = 2,
    Success = 3,
}

/// Answer to QueryTask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    pub id: TaskId,
    pub task_type: TaskType,
    pub status: TaskStatus,
    pub created_at_ms_epoch: u64,
    pub last_updated_at_ms_epoch: u64,
    /// The client that executes the task.
    pub assigned_client: ClientId,
    pub message: String,
}

/// A task handed to the client that executes it (FetchTasks). Copy: write
/// the object to each of `targets`; move: to `targets[0]`, then drop the
/// replica on `source`. The client drives it with CopyStart/CopyEnd (or
/// MoveStart/MoveEnd) and reports with MarkTaskComplete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskAssignment {
    pub id: TaskId,
    pub task_type: TaskType,
    pub key: String,
    /// Move only: the segment whose replica goes away.
    pub source: String,
    pub targets: Vec<String>,
}

/// An object a storage client is asked to copy to its SSD tier: its bytes
/// are at `address` in the client's own segment (a read lease keeps them
/// there while the task is fresh).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffloadTask {
    pub key: String,
    pub size: u64,
    pub address: u64,
    /// How long (ms) the object had gone unused when it was handed out: a
    /// tier evicting LRU ranks the copy by it, as if memory and tier were
    /// one cache.
    pub idle_ms: u64,
}

/// What `FetchOffloadTasks` hands a storage client: objects to write to its
/// tier, and keys whose tier copies are no longer wanted (removed or
/// replaced objects).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffloadBatch {
    pub tasks: Vec<OffloadTask>,
    pub removes: Vec<String>,
    /// Disk-only objects read often: copy them back to memory
    /// (`PromotionStart`, then `PutEnd`).
    pub promotions: Vec<String>,
}

/// The shared-filesystem tier as the master announces it
/// (`GetStorageConfig`): `fsdir` is `<root_fs_dir>/<cluster_id>`, empty
/// when the tier is off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StorageConfig {
    pub fsdir: String,
    pub enable_disk_eviction: bool,
    pub quota_bytes: u64,
}
