//! Log entries in owned form: what a [`Mutation`] says, with keys and
//! names copied and each placement as (segment id, offset), so an entry
//! outlives the call that made it and travels between masters.
//!
//! The wire form (`Encode`/`Decode` of [`crate::proto::wire`]) is the
//! payload of a frame (`codec`). Tags are part of the format: a new
//! variant takes a new tag, an old tag never changes meaning.

use crate::master::mutation::{
    ClientOp, DiskOp, Mutation, ObjectOp, SegmentOp, Segments, TaskOp, Write,
};
use crate::master::objects::Replicas;
use crate::proto::wire::{Decode, DecodeError, Encode, Reader};
use crate::types::{ClientId, SegmentInfo, TaskAssignment, TaskId, TaskStatus};

/// One log entry: a sequence number, the term of the leader that wrote
/// it, and the mutations it carries, in the order they were applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedEntry {
    pub seq: u64,
    pub term: u64,
    pub mutations: Vec<OwnedMutation>,
}

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
    Object { key: String, op: OwnedObjectOp },
    Segment(OwnedSegmentOp),
    Client(OwnedClientOp),
    Task(OwnedTaskOp),
    Disk(OwnedDiskOp),
    FreeRetired { now: u64 },
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
                OwnedObjectOp::PutRevoke | OwnedObjectOp::TransferRevoke => None,
            },
            OwnedMutation::Segment(_)
            | OwnedMutation::Disk(_)
            | OwnedMutation::Client(OwnedClientOp::Expire { .. }) => None,
            OwnedMutation::Client(OwnedClientOp::Register { now, .. }) => Some(*now),
            OwnedMutation::Task(
                OwnedTaskOp::Create { now, .. }
                | OwnedTaskOp::Start { now, .. }
                | OwnedTaskOp::Finish { now, .. },
            ) => Some(*now),
            OwnedMutation::FreeRetired { now } => Some(*now),
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
        }
    }
}

fn bad_tag(what: &'static str, tag: u8) -> DecodeError {
    DecodeError::BadTag {
        what,
        tag: tag.into(),
    }
}

impl Encode for Placed {
    fn encode(&self, out: &mut Vec<u8>) {
        self.segment.encode(out);
        self.offset.encode(out);
    }
}

impl<'de> Decode<'de> for Placed {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        Ok(Placed {
            segment: u32::decode(r)?,
            offset: u64::decode(r)?,
        })
    }
}

impl Encode for OwnedEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        self.seq.encode(out);
        self.term.encode(out);
        self.mutations.encode(out);
    }
}

impl<'de> Decode<'de> for OwnedEntry {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        Ok(OwnedEntry {
            seq: u64::decode(r)?,
            term: u64::decode(r)?,
            mutations: decode_mutations(r)?,
        })
    }
}

/// An entry's mutations. The count is checked against the input left,
/// and the vector grows as mutations actually decode, so what a hostile
/// count reserves stays small next to the input.
fn decode_mutations(r: &mut Reader<'_>) -> Result<Vec<OwnedMutation>, DecodeError> {
    // Every mutation takes at least two bytes (a tag and a field).
    let n = r.len(2)?;
    let mut v = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        v.push(OwnedMutation::decode(r)?);
    }
    Ok(v)
}

// Mutation tags: 1 object, 2 segment mount, 3 segment unmount, 4 client
// register, 5 client expire, 6 task create, 7 task start, 8 task finish,
// 9 free retired, 10 disk (then a disk op tag: 1 mount tier, 2 unmount
// tier, 3 add copy, 4 drop copy).
impl Encode for OwnedMutation {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            OwnedMutation::Object { key, op } => {
                out.push(1);
                key.encode(out);
                op.encode(out);
            }
            OwnedMutation::Segment(OwnedSegmentOp::Mount { id, owner, info }) => {
                out.push(2);
                id.encode(out);
                owner.encode(out);
                info.encode(out);
            }
            OwnedMutation::Segment(OwnedSegmentOp::Unmount { name }) => {
                out.push(3);
                name.encode(out);
            }
            OwnedMutation::Client(OwnedClientOp::Register { client, now }) => {
                out.push(4);
                client.encode(out);
                now.encode(out);
            }
            OwnedMutation::Client(OwnedClientOp::Expire { client }) => {
                out.push(5);
                client.encode(out);
            }
            OwnedMutation::Task(OwnedTaskOp::Create {
                task,
                executor,
                now,
            }) => {
                out.push(6);
                task.encode(out);
                executor.encode(out);
                now.encode(out);
            }
            OwnedMutation::Task(OwnedTaskOp::Start { ids, now }) => {
                out.push(7);
                ids.encode(out);
                now.encode(out);
            }
            OwnedMutation::Task(OwnedTaskOp::Finish {
                id,
                status,
                message,
                now,
            }) => {
                out.push(8);
                id.encode(out);
                status.encode(out);
                message.encode(out);
                now.encode(out);
            }
            OwnedMutation::FreeRetired { now } => {
                out.push(9);
                now.encode(out);
            }
            OwnedMutation::Disk(op) => {
                out.push(10);
                op.encode(out);
            }
        }
    }
}

impl<'de> Decode<'de> for OwnedMutation {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        Ok(match r.u8()? {
            1 => OwnedMutation::Object {
                key: String::decode(r)?,
                op: OwnedObjectOp::decode(r)?,
            },
            2 => OwnedMutation::Segment(OwnedSegmentOp::Mount {
                id: u32::decode(r)?,
                owner: ClientId::decode(r)?,
                info: SegmentInfo::decode(r)?,
            }),
            3 => OwnedMutation::Segment(OwnedSegmentOp::Unmount {
                name: String::decode(r)?,
            }),
            4 => OwnedMutation::Client(OwnedClientOp::Register {
                client: ClientId::decode(r)?,
                now: u64::decode(r)?,
            }),
            5 => OwnedMutation::Client(OwnedClientOp::Expire {
                client: ClientId::decode(r)?,
            }),
            6 => OwnedMutation::Task(OwnedTaskOp::Create {
                task: TaskAssignment::decode(r)?,
                executor: ClientId::decode(r)?,
                now: u64::decode(r)?,
            }),
            7 => OwnedMutation::Task(OwnedTaskOp::Start {
                ids: decode_ids(r)?,
                now: u64::decode(r)?,
            }),
            8 => OwnedMutation::Task(OwnedTaskOp::Finish {
                id: TaskId::decode(r)?,
                status: TaskStatus::decode(r)?,
                message: String::decode(r)?,
                now: u64::decode(r)?,
            }),
            9 => OwnedMutation::FreeRetired {
                now: u64::decode(r)?,
            },
            10 => OwnedMutation::Disk(OwnedDiskOp::decode(r)?),
            t => return Err(bad_tag("mutation", t)),
        })
    }
}

/// Task ids are 16 bytes each: the count is checked against that, so a
/// hostile count cannot reserve more than the input's size.
fn decode_ids(r: &mut Reader<'_>) -> Result<Vec<TaskId>, DecodeError> {
    let n = r.len(16)?;
    (0..n).map(|_| TaskId::decode(r)).collect()
}

// Object op tags: 1 put start, 2 put end, 3 put revoke, 4 discard put,
// 5 remove, 6 drop replicas, 7 transfer start, 8 transfer end, 9 transfer
// revoke. Write tags: 0 fresh, 1 in place, 2 replacing. Segments tags:
// 0 named, 1 unmounted.
impl Encode for OwnedObjectOp {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            OwnedObjectOp::PutStart {
                client,
                size,
                pins,
                now,
                write,
            } => {
                out.push(1);
                client.encode(out);
                size.encode(out);
                pins.encode(out);
                now.encode(out);
                match write {
                    OwnedWrite::Fresh(p) => {
                        out.push(0);
                        p.encode(out);
                    }
                    OwnedWrite::InPlace => out.push(1),
                    OwnedWrite::Replacing(p) => {
                        out.push(2);
                        p.encode(out);
                    }
                }
            }
            OwnedObjectOp::PutEnd { now, readers_until } => {
                out.push(2);
                now.encode(out);
                readers_until.encode(out);
            }
            OwnedObjectOp::PutRevoke => out.push(3),
            OwnedObjectOp::DiscardPut { free_at, now } => {
                out.push(4);
                free_at.encode(out);
                now.encode(out);
            }
            OwnedObjectOp::Remove { now } => {
                out.push(5);
                now.encode(out);
            }
            OwnedObjectOp::DropReplicas { on, free_at, now } => {
                out.push(6);
                match on {
                    OwnedSegments::Named(n) => {
                        out.push(0);
                        n.encode(out);
                    }
                    OwnedSegments::Unmounted => out.push(1),
                }
                free_at.encode(out);
                now.encode(out);
            }
            OwnedObjectOp::TransferStart {
                client,
                now,
                replicas,
                drop_source,
            } => {
                out.push(7);
                client.encode(out);
                now.encode(out);
                replicas.encode(out);
                drop_source.encode(out);
            }
            OwnedObjectOp::TransferEnd { now, readers_until } => {
                out.push(8);
                now.encode(out);
                readers_until.encode(out);
            }
            OwnedObjectOp::TransferRevoke => out.push(9),
        }
    }
}

impl<'de> Decode<'de> for OwnedObjectOp {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        Ok(match r.u8()? {
            1 => OwnedObjectOp::PutStart {
                client: ClientId::decode(r)?,
                size: u64::decode(r)?,
                pins: u8::decode(r)?,
                now: u64::decode(r)?,
                write: match r.u8()? {
                    0 => OwnedWrite::Fresh(Vec::decode(r)?),
                    1 => OwnedWrite::InPlace,
                    2 => OwnedWrite::Replacing(Vec::decode(r)?),
                    t => return Err(bad_tag("write", t)),
                },
            },
            2 => OwnedObjectOp::PutEnd {
                now: u64::decode(r)?,
                readers_until: u64::decode(r)?,
            },
            3 => OwnedObjectOp::PutRevoke,
            4 => OwnedObjectOp::DiscardPut {
                free_at: Option::decode(r)?,
                now: u64::decode(r)?,
            },
            5 => OwnedObjectOp::Remove {
                now: u64::decode(r)?,
            },
            6 => OwnedObjectOp::DropReplicas {
                on: match r.u8()? {
                    0 => OwnedSegments::Named(String::decode(r)?),
                    1 => OwnedSegments::Unmounted,
                    t => return Err(bad_tag("segments", t)),
                },
                free_at: u64::decode(r)?,
                now: u64::decode(r)?,
            },
            7 => OwnedObjectOp::TransferStart {
                client: ClientId::decode(r)?,
                now: u64::decode(r)?,
                replicas: Vec::decode(r)?,
                drop_source: Option::decode(r)?,
            },
            8 => OwnedObjectOp::TransferEnd {
                now: u64::decode(r)?,
                readers_until: u64::decode(r)?,
            },
            9 => OwnedObjectOp::TransferRevoke,
            t => return Err(bad_tag("object op", t)),
        })
    }
}

impl Encode for OwnedDiskOp {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            OwnedDiskOp::MountTier {
                client,
                tier_id,
                endpoint,
                capacity,
            } => {
                out.push(1);
                client.encode(out);
                tier_id.encode(out);
                endpoint.encode(out);
                capacity.encode(out);
            }
            OwnedDiskOp::UnmountTier { client } => {
                out.push(2);
                client.encode(out);
            }
            OwnedDiskOp::AddCopy { client, key, size } => {
                out.push(3);
                client.encode(out);
                key.encode(out);
                size.encode(out);
            }
            OwnedDiskOp::DropCopy { key } => {
                out.push(4);
                key.encode(out);
            }
        }
    }
}

impl<'de> Decode<'de> for OwnedDiskOp {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        Ok(match r.u8()? {
            1 => OwnedDiskOp::MountTier {
                client: ClientId::decode(r)?,
                tier_id: String::decode(r)?,
                endpoint: String::decode(r)?,
                capacity: u64::decode(r)?,
            },
            2 => OwnedDiskOp::UnmountTier {
                client: ClientId::decode(r)?,
            },
            3 => OwnedDiskOp::AddCopy {
                client: ClientId::decode(r)?,
                key: String::decode(r)?,
                size: u64::decode(r)?,
            },
            4 => OwnedDiskOp::DropCopy {
                key: String::decode(r)?,
            },
            t => return Err(bad_tag("disk op", t)),
        })
    }
}
