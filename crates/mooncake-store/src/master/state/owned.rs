//! The state machine's mutations in owned form: what a [`Mutation`] says,
//! with keys and names copied and each placement as (segment id, offset),
//! so a mutation outlives the call that made it and travels between
//! masters (in log entries, `durable::oplog`).
//!
//! The wire form (`Encode`/`Decode` of [`crate::proto::wire`]) is part of
//! a log entry's payload. Tags are part of the format: a new variant takes
//! a new tag, an old tag never changes meaning.

use super::mutation::{ClientOp, DiskOp, Mutation, ObjectOp, SegmentOp, Segments, TaskOp, Write};
use super::objects::Replicas;
use crate::proto::wire::{wire_struct, wire_tagged, Decode, DecodeError, Reader};
use crate::types::{ClientId, SegmentInfo, TaskAssignment, TaskId, TaskStatus};

/// A replica's place as a log records it: the segment's id (unique for
/// the master's lifetime, replayed with its mount) and the offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub segment: u32,
    pub offset: u64,
}

/// The owned form of one mutation; see `master::mutation` for what each
/// variant means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedMutation {
    Object {
        key: String,
        op: OwnedObjectOp,
    },
    Segment(OwnedSegmentOp),
    Client(OwnedClientOp),
    Task(OwnedTaskOp),
    Disk(OwnedDiskOp),
    FreeRetired {
        now: u64,
    },
    Reserve {
        segment: u32,
        offset: u64,
        len: u64,
    },
    Unreserve {
        segment: u32,
        offset: u64,
        len: u64,
        free_at: u64,
        now: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedObjectOp {
    PutStart {
        client: ClientId,
        size: u64,
        pins: u8,
        now: u64,
        write: OwnedWrite,
    },
    PutEnd {
        now: u64,
        readers_until: u64,
    },
    PutRevoke,
    DiscardPut {
        free_at: Option<u64>,
        now: u64,
    },
    Remove {
        now: u64,
    },
    DropReplicas {
        on: OwnedSegments,
        free_at: u64,
        now: u64,
    },
    TransferStart {
        client: ClientId,
        now: u64,
        replicas: Vec<Placed>,
        drop_source: Option<String>,
    },
    TransferEnd {
        now: u64,
        readers_until: u64,
    },
    TransferRevoke,
    Group {
        group: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedWrite {
    Fresh(Vec<Placed>),
    InPlace,
    Replacing(Vec<Placed>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedSegments {
    Named(String),
    Unmounted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedSegmentOp {
    Mount {
        id: u32,
        owner: ClientId,
        info: SegmentInfo,
    },
    Unmount {
        name: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnedClientOp {
    Register { client: ClientId, now: u64 },
    Expire { client: ClientId },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedTaskOp {
    Create {
        task: TaskAssignment,
        executor: ClientId,
        now: u64,
    },
    Start {
        ids: Vec<TaskId>,
        now: u64,
    },
    Finish {
        id: TaskId,
        status: TaskStatus,
        message: String,
        now: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedDiskOp {
    MountTier {
        client: ClientId,
        tier_id: String,
        endpoint: String,
        capacity: u64,
    },
    UnmountTier {
        client: ClientId,
    },
    AddCopy {
        client: ClientId,
        key: String,
        size: u64,
    },
    DropCopy {
        key: String,
    },
}

impl OwnedDiskOp {
    /// The borrowed form, as the state machine replays it.
    pub(crate) fn as_op(&self) -> DiskOp<'_> {
        match self {
            OwnedDiskOp::MountTier {
                client,
                tier_id,
                endpoint,
                capacity,
            } => DiskOp::MountTier {
                client: *client,
                tier_id,
                endpoint,
                capacity: *capacity,
            },
            OwnedDiskOp::UnmountTier { client } => DiskOp::UnmountTier { client: *client },
            OwnedDiskOp::AddCopy { client, key, size } => DiskOp::AddCopy {
                client: *client,
                key,
                size: *size,
            },
            OwnedDiskOp::DropCopy { key } => DiskOp::DropCopy { key },
        }
    }

    fn from_op(op: &DiskOp<'_>) -> Self {
        match *op {
            DiskOp::MountTier {
                client,
                tier_id,
                endpoint,
                capacity,
            } => OwnedDiskOp::MountTier {
                client,
                tier_id: tier_id.to_owned(),
                endpoint: endpoint.to_owned(),
                capacity,
            },
            DiskOp::UnmountTier { client } => OwnedDiskOp::UnmountTier { client },
            DiskOp::AddCopy { client, key, size } => OwnedDiskOp::AddCopy {
                client,
                key: key.to_owned(),
                size,
            },
            DiskOp::DropCopy { key } => OwnedDiskOp::DropCopy {
                key: key.to_owned(),
            },
        }
    }
}

fn placed(r: &Replicas) -> Vec<Placed> {
    let v = r.as_slice().iter();
    v.map(|p| Placed {
        segment: p.segment.id,
        offset: p.offset,
    })
    .collect()
}

impl OwnedMutation {
    /// The master clock this mutation was decided at, if it carries one.
    pub fn now(&self) -> Option<u64> {
        match self {
            OwnedMutation::Object { op, .. } => match op {
                OwnedObjectOp::PutStart { now, .. }
                | OwnedObjectOp::PutEnd { now, .. }
                | OwnedObjectOp::DiscardPut { now, .. }
                | OwnedObjectOp::Remove { now }
                | OwnedObjectOp::DropReplicas { now, .. }
                | OwnedObjectOp::TransferStart { now, .. }
                | OwnedObjectOp::TransferEnd { now, .. } => Some(*now),
                OwnedObjectOp::PutRevoke
                | OwnedObjectOp::TransferRevoke
                | OwnedObjectOp::Group { .. } => None,
            },
            OwnedMutation::Segment(_)
            | OwnedMutation::Reserve { .. }
            | OwnedMutation::Disk(_)
            | OwnedMutation::Client(OwnedClientOp::Expire { .. }) => None,
            OwnedMutation::Client(OwnedClientOp::Register { now, .. }) => Some(*now),
            OwnedMutation::Task(
                OwnedTaskOp::Create { now, .. }
                | OwnedTaskOp::Start { now, .. }
                | OwnedTaskOp::Finish { now, .. },
            ) => Some(*now),
            OwnedMutation::FreeRetired { now } | OwnedMutation::Unreserve { now, .. } => Some(*now),
        }
    }

    /// Copies what `m` says (what a sink records).
    pub(crate) fn from_mutation(m: &Mutation<'_>) -> Self {
        match m {
            Mutation::Object { key, op } => OwnedMutation::Object {
                key: (*key).to_owned(),
                op: OwnedObjectOp::from_op(op),
            },
            Mutation::Segment(SegmentOp::Mount { id, owner, info }) => {
                OwnedMutation::Segment(OwnedSegmentOp::Mount {
                    id: *id,
                    owner: *owner,
                    info: (*info).clone(),
                })
            }
            Mutation::Segment(SegmentOp::Unmount { name }) => {
                OwnedMutation::Segment(OwnedSegmentOp::Unmount {
                    name: (*name).to_owned(),
                })
            }
            Mutation::Client(ClientOp::Register { client, now }) => {
                OwnedMutation::Client(OwnedClientOp::Register {
                    client: *client,
                    now: *now,
                })
            }
            Mutation::Client(ClientOp::Expire { client }) => {
                OwnedMutation::Client(OwnedClientOp::Expire { client: *client })
            }
            Mutation::Task(op) => OwnedMutation::Task(match op {
                TaskOp::Create {
                    task,
                    executor,
                    now,
                } => OwnedTaskOp::Create {
                    task: task.clone(),
                    executor: *executor,
                    now: *now,
                },
                TaskOp::Start { ids, now } => OwnedTaskOp::Start {
                    ids: ids.to_vec(),
                    now: *now,
                },
                TaskOp::Finish {
                    id,
                    status,
                    message,
                    now,
                } => OwnedTaskOp::Finish {
                    id: *id,
                    status: *status,
                    message: (*message).to_owned(),
                    now: *now,
                },
            }),
            Mutation::Disk(op) => OwnedMutation::Disk(OwnedDiskOp::from_op(op)),
            Mutation::FreeRetired { now } => OwnedMutation::FreeRetired { now: *now },
            Mutation::Reserve {
                segment,
                offset,
                len,
            } => OwnedMutation::Reserve {
                segment: *segment,
                offset: *offset,
                len: *len,
            },
            Mutation::Unreserve {
                segment,
                offset,
                len,
                free_at,
                now,
            } => OwnedMutation::Unreserve {
                segment: *segment,
                offset: *offset,
                len: *len,
                free_at: *free_at,
                now: *now,
            },
        }
    }
}

impl OwnedObjectOp {
    fn from_op(op: &ObjectOp<'_>) -> Self {
        match op {
            ObjectOp::PutStart {
                client,
                size,
                pins,
                now,
                write,
            } => OwnedObjectOp::PutStart {
                client: *client,
                size: *size,
                pins: *pins,
                now: *now,
                write: match write {
                    Write::Fresh(r) => OwnedWrite::Fresh(placed(r)),
                    Write::InPlace => OwnedWrite::InPlace,
                    Write::Replacing(r) => OwnedWrite::Replacing(placed(r)),
                },
            },
            ObjectOp::PutEnd { now, readers_until } => OwnedObjectOp::PutEnd {
                now: *now,
                readers_until: *readers_until,
            },
            ObjectOp::PutRevoke => OwnedObjectOp::PutRevoke,
            ObjectOp::DiscardPut { free_at, now } => OwnedObjectOp::DiscardPut {
                free_at: *free_at,
                now: *now,
            },
            ObjectOp::Remove { now } => OwnedObjectOp::Remove { now: *now },
            ObjectOp::DropReplicas { on, free_at, now } => OwnedObjectOp::DropReplicas {
                on: match on {
                    Segments::Named(n) => OwnedSegments::Named((*n).to_owned()),
                    Segments::Unmounted => OwnedSegments::Unmounted,
                },
                free_at: *free_at,
                now: *now,
            },
            ObjectOp::TransferStart {
                client,
                now,
                replicas,
                drop_source,
            } => OwnedObjectOp::TransferStart {
                client: *client,
                now: *now,
                replicas: placed(replicas),
                drop_source: drop_source.map(str::to_owned),
            },
            ObjectOp::TransferEnd { now, readers_until } => OwnedObjectOp::TransferEnd {
                now: *now,
                readers_until: *readers_until,
            },
            ObjectOp::TransferRevoke => OwnedObjectOp::TransferRevoke,
            ObjectOp::Group { group } => OwnedObjectOp::Group {
                group: (*group).to_owned(),
            },
        }
    }
}

wire_struct!(Placed { segment, offset });
// Tags are the format: see the module's doc.
wire_tagged!(OwnedMutation as "mutation" {
    1 => Object { key, op },
    2 => Segment(OwnedSegmentOp::Mount { id, owner, info }),
    3 => Segment(OwnedSegmentOp::Unmount { name }),
    4 => Client(OwnedClientOp::Register { client, now }),
    5 => Client(OwnedClientOp::Expire { client }),
    6 => Task(OwnedTaskOp::Create { task, executor, now }),
    7 => Task(OwnedTaskOp::Start { ids = decode_ids, now }),
    8 => Task(OwnedTaskOp::Finish { id, status, message, now }),
    9 => FreeRetired { now },
    10 => Disk(op),
    11 => Reserve { segment, offset, len },
    12 => Unreserve { segment, offset, len, free_at, now },
});

/// Task ids are 16 bytes each: the count is checked against that, so a
/// hostile count cannot reserve more than the input's size.
fn decode_ids(r: &mut Reader<'_>) -> Result<Vec<TaskId>, DecodeError> {
    let n = r.len(16)?;
    (0..n).map(|_| TaskId::decode(r)).collect()
}

wire_tagged!(OwnedObjectOp as "object op" {
    1 => PutStart { client, size, pins, now, write },
    2 => PutEnd { now, readers_until },
    3 => PutRevoke {},
    4 => DiscardPut { free_at, now },
    5 => Remove { now },
    6 => DropReplicas { on, free_at, now },
    7 => TransferStart { client, now, replicas, drop_source },
    8 => TransferEnd { now, readers_until },
    9 => TransferRevoke {},
    10 => Group { group },
});

wire_tagged!(OwnedWrite as "write" {
    0 => Fresh(replicas),
    1 => InPlace {},
    2 => Replacing(replicas),
});

wire_tagged!(OwnedSegments as "segments" {
    0 => Named(name),
    1 => Unmounted {},
});

wire_tagged!(OwnedDiskOp as "disk op" {
    1 => MountTier { client, tier_id, endpoint, capacity },
    2 => UnmountTier { client },
    3 => AddCopy { client, key, size },
    4 => DropCopy { key },
});
