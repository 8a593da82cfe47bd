//! The master's state changes as typed commands.
//!
//! Every change to replicated state is a [`Mutation`]: the leader decides
//! it (checks, placement, reading the clock and leases) and then applies
//! it; a standby applies the same mutations in the same order and ends in
//! the same state. Applying reads only the mutation, replicated state and
//! the policy, never volatile state (leases, soft-pin deadlines, heartbeat
//! times, shard clocks), so what the leader saw in those travels in the
//! mutation (`readers_until`).
//!
//! Mutations borrow keys and names from the request that caused them, so
//! deciding and applying allocate nothing beyond what the state keeps.
//! See `service` for where they are applied and observed.
//!
//! Placements travel as [`Replicas`], i.e. segments and offsets; a log
//! records each as (`Segment::id`, offset). A standby turns them back into
//! replicas by reserving exactly those ranges in its own segments (same
//! ids, since mounts are replayed with the leader's ids), then replays the
//! mutation with `MasterService::replay`. Each range of a `TransferStart`
//! has the object's size.

use super::objects::Replicas;
use super::segments::SegmentId;
use crate::types::{ClientId, SegmentInfo, TaskAssignment, TaskId, TaskStatus};

/// One change to the master's replicated state.
#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub(crate) enum Mutation<'a> {
    /// A change to the object `key`, under its shard's lock.
    Object {
        key: &'a str,
        op: ObjectOp<'a>,
    },
    Segment(SegmentOp<'a>),
    Client(ClientOp),
    Task(TaskOp<'a>),
    /// A change to the SSD tiers and their copies (`ssd_tier`).
    Disk(DiskOp<'a>),
    /// Frees the retired space due at `now`. (A range retired concurrently
    /// with it may be freed by a standby here and by the leader only at the
    /// next one; it was due either way.)
    FreeRetired {
        now: u64,
    },
    /// `[offset, offset + len)` of a segment is reserved for the leader's
    /// puts (`segments::space`): taken, though no object holds it yet.
    Reserve {
        segment: SegmentId,
        offset: u64,
        len: u64,
    },
    /// Reserved space no object took goes back: freed at `free_at`
    /// (retired until then: a writer of an earlier term may hold it).
    Unreserve {
        segment: SegmentId,
        offset: u64,
        len: u64,
        free_at: u64,
        now: u64,
    },
}

/// A change to one object.
#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub(crate) enum ObjectOp<'a> {
    /// PutStart or upsert: a new version is being written by `client`.
    /// The replicas in `write` are already reserved in their segments (on
    /// the leader by placement, on a standby from the logged offsets).
    PutStart {
        client: ClientId,
        size: u64,
        /// `objects::flags` pin bits of the new version.
        pins: u8,
        now: u64,
        write: Write,
    },
    /// PutEnd: the version in flight becomes readable. A replaced version
    /// is freed at `readers_until` (the old version's lease).
    PutEnd { now: u64, readers_until: u64 },
    /// PutRevoke: the version in flight is dropped and its space freed.
    PutRevoke,
    /// A put (or transfer) in flight is given up without its writer; its
    /// space is freed at `free_at`, by default its PutStart plus the
    /// release timeout. A fresh put takes its object with it.
    DiscardPut { free_at: Option<u64>, now: u64 },
    /// The object goes, whatever is in flight; its space is freed (space a
    /// writer may still touch is retired).
    Remove { now: u64 },
    /// Replicas on `on` go; their space is freed at `free_at`. The object
    /// stays, with the replicas it has left.
    DropReplicas {
        on: Segments<'a>,
        free_at: u64,
        now: u64,
    },
    /// ReplicaTransferStart: `client` writes `replicas` (reserved, as for
    /// `PutStart`) as extra replicas; a move drops the one on `drop_source`
    /// at the end.
    TransferStart {
        client: ClientId,
        now: u64,
        replicas: Replicas,
        drop_source: Option<&'a str>,
    },
    /// ReplicaTransferEnd: the new replicas join the object; a move's
    /// source replica is freed at `readers_until`.
    TransferEnd { now: u64, readers_until: u64 },
    /// ReplicaTransferRevoke: the new replicas are freed.
    TransferRevoke,
    /// The object, just put, joins `group` (its tenant-scoped name); it
    /// leaves it when it leaves the object map.
    Group { group: &'a str },
}

/// Where a `PutStart` writes.
#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub(crate) enum Write {
    /// A new object (the key was absent).
    Fresh(Replicas),
    /// An upsert rewriting the object's own replicas (same size, no lease).
    InPlace,
    /// An upsert into new replicas; the old ones stay readable until PutEnd.
    Replacing(Replicas),
}

/// Which replicas `DropReplicas` takes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Segments<'a> {
    /// Those on the segment of this name.
    Named(&'a str),
    /// Those on segments no longer mounted.
    Unmounted,
}

#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub(crate) enum SegmentOp<'a> {
    /// A new segment, under the id the leader gave it.
    Mount {
        id: SegmentId,
        owner: ClientId,
        info: &'a SegmentInfo,
    },
    /// The segment goes with its space; replicas there are dropped by the
    /// object mutations that follow.
    Unmount { name: &'a str },
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum ClientOp {
    /// A client the master did not know (first contact, or after expiry).
    Register { client: ClientId, now: u64 },
    /// A silent client is forgotten; its segments are unmounted by the
    /// segment mutations that follow.
    Expire { client: ClientId },
}

#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub(crate) enum TaskOp<'a> {
    /// A task is queued for `executor` (`task.id` is chosen by the leader).
    Create {
        task: TaskAssignment,
        executor: ClientId,
        now: u64,
    },
    /// FetchTasks handed these pending tasks to their executor.
    Start { ids: &'a [TaskId], now: u64 },
    /// The task ended: reported by its executor, or failed by a timeout.
    Finish {
        id: TaskId,
        status: TaskStatus,
        message: &'a str,
        now: u64,
    },
}

/// A change to the SSD tiers. Copies are `LOCAL_DISK` replicas: they exist
/// only once durable in their tier.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DiskOp<'a> {
    /// `client` mounts its tier; copies in a tier of the same id that
    /// another client held (an earlier process on the same directory) pass
    /// to `client`.
    MountTier {
        client: ClientId,
        tier_id: &'a str,
        endpoint: &'a str,
        capacity: u64,
    },
    /// The tier goes (its copies are dropped by `DropCopy`s first).
    UnmountTier { client: ClientId },
    /// `key` has a durable copy of `size` bytes in `client`'s tier (under
    /// the object's shard lock: the object, if in memory, is flagged).
    AddCopy {
        client: ClientId,
        key: &'a str,
        size: u64,
    },
    /// `key`'s copy is forgotten (under the object's shard lock).
    DropCopy { key: &'a str },
}

/// Sees every mutation as it is applied: where an operation log plugs in.
///
/// `applied` runs before the mutation takes effect, under the lock that
/// orders it against every other mutation of the same object (or table).
/// Allocations happen before the mutation that carries them is seen, frees
/// after the mutation that causes them, so the order in which a sink sees
/// mutations is one in which a standby can reserve every logged range. It
/// must not block or call back into the service: append and return where
/// the entry lies ([`Release`]); the server waits for it once the call is
/// decided, outside every lock.
pub(crate) trait MutationSink: Send + Sync {
    /// Records `m`; returns what a call must wait for to have it kept
    /// ([`Release::Now`]: the sink keeps no positions, or skipped it).
    fn applied(&self, m: &Mutation<'_>) -> Release;

    /// What a call that logged nothing waits for before it is answered:
    /// its answer read state that may rest on entries not yet kept, so it
    /// waits for the last one logged (Raft's read index). `Now` when every
    /// entry is kept, or for a sink whose reads need no wait.
    fn read_index(&self) -> Release {
        Release::Now
    }
}

/// When the master may answer a call, as its mutations' log positions say
/// (openraft's `Respond { when }`).
///
/// - `Now`: the call logged nothing (a read, a refusal, a master without
///   a log) and every entry its answer may rest on is kept, or nothing it
///   logged needs waiting for.
/// - `Durable(pos)`: a master with a local write-ahead log answers once
///   the log is on disk up to `pos`.
/// - `Committed(seq)`: a replicated leader answers once the standbys in
///   sync hold its log up to `seq`.
///
/// The position is the call's last entry (for a call that logged nothing,
/// the sink's last entry while it is not committed:
/// [`MutationSink::read_index`]), except for a put in reserved
/// space (`segments::space`): it waits only up to its reservation's
/// entry, since the commit of its PutEnd covers its own. One put of the
/// call outside reserved space makes it wait for all its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use = "the answer goes out only once its release holds"]
pub enum Release {
    #[default]
    Now,
    Durable(u64),
    Committed(u64),
}

impl Release {
    /// The log position (0 for `Now`).
    pub fn position(self) -> u64 {
        match self {
            Release::Now => 0,
            Release::Durable(p) | Release::Committed(p) => p,
        }
    }

    /// The same release, waiting at most up to `upto` (`Now` at 0).
    fn upto(self, upto: u64) -> Release {
        match self {
            Release::Durable(p) if p.min(upto) > 0 => Release::Durable(p.min(upto)),
            Release::Committed(p) if p.min(upto) > 0 => Release::Committed(p.min(upto)),
            _ => Release::Now,
        }
    }
}

/// One call being served: what its mutations were given by the sink, and
/// so when it may be answered ([`Call::release`]). The state machine
/// records into it as it applies; the server waits on the release.
#[derive(Debug, Default)]
pub(crate) struct Call {
    /// Where its last mutation lies.
    logged: Release,
    /// Set by a call whose answer need not wait for its own entries: the
    /// position up to which they must be kept instead (`u64::MAX`: one of
    /// them must wait after all).
    answer_at: Option<u64>,
}

impl Call {
    /// Notes where the sink put one of this call's mutations.
    pub(crate) fn logged(&mut self, at: Release) {
        if at != Release::Now {
            self.logged = at;
        }
    }

    /// A PutStart of this call, in reserved space (`segments::space`), may
    /// be answered once the log is kept up to `upto` (its reservation),
    /// before its own entry: its PutEnd's commit covers that.
    pub(crate) fn answer_at(&mut self, upto: u64) {
        self.answer_at = Some(self.answer_at.map_or(upto, |v| v.max(upto)));
    }

    /// A PutStart of this call outside reserved space: the call waits for
    /// all its entries, whatever [`Call::answer_at`] said.
    pub(crate) fn answer_after_all(&mut self) {
        self.answer_at = Some(u64::MAX);
    }

    /// When the call may be answered.
    pub(crate) fn release(&self) -> Release {
        self.logged.upto(self.answer_at.unwrap_or(u64::MAX))
    }

    /// When the call may be answered, `read_index` (the sink's, taken once
    /// the call is decided) standing in for a call that logged nothing:
    /// its answer rests on the state it read, which may hold entries not
    /// yet kept (a get of a PutEnd, a refusal on a put still uncommitted).
    pub(crate) fn release_reading(&self, read_index: impl FnOnce() -> Release) -> Release {
        if self.logged == Release::Now && self.answer_at.is_none() {
            read_index()
        } else {
            self.release()
        }
    }
}
