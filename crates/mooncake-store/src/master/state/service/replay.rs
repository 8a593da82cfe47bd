//! Applying logged mutations (`owned`) to a state machine: each logged
//! placement is reserved at exactly its offset in the segment of its id,
//! then the mutation is replayed (`MasterService::replay`, `apply`).

use mooncake_common::{Error, ErrorCode, Result};

use super::MasterService;
use crate::master::state::mutation::{
    ClientOp, Mutation, ObjectOp, SegmentOp, Segments, TaskOp, Write,
};
use crate::master::state::objects::Replicas;
use crate::master::state::owned::{
    OwnedClientOp, OwnedMutation, OwnedObjectOp, OwnedSegmentOp, OwnedSegments, OwnedTaskOp,
    OwnedWrite, Placed,
};
use crate::master::state::segments::Placement;

fn diverged(what: String) -> Error {
    Error::new(
        ErrorCode::INTERNAL_ERROR,
        format!("log entry does not fit this master's state: {what}"),
    )
}

impl MasterService {
    /// Applies one logged mutation.
    pub fn apply_logged(&self, m: &OwnedMutation) -> Result<()> {
        let (mutation, reserved) = match m {
            OwnedMutation::Object { key, op } => {
                let mut reserved = Vec::new();
                let op = self.object_op(key, op, &mut reserved)?;
                (Mutation::Object { key, op }, reserved)
            }
            OwnedMutation::Segment(op) => (
                Mutation::Segment(match op {
                    OwnedSegmentOp::Mount { id, owner, info } => SegmentOp::Mount {
                        id: *id,
                        owner: *owner,
                        info,
                    },
                    OwnedSegmentOp::Unmount { name } => SegmentOp::Unmount { name },
                }),
                Vec::new(),
            ),
            OwnedMutation::Client(op) => (
                Mutation::Client(match *op {
                    OwnedClientOp::Register { client, now } => ClientOp::Register { client, now },
                    OwnedClientOp::Expire { client } => ClientOp::Expire { client },
                }),
                Vec::new(),
            ),
            OwnedMutation::Task(op) => (
                Mutation::Task(match op {
                    OwnedTaskOp::Create {
                        task,
                        executor,
                        now,
                    } => TaskOp::Create {
                        task: task.clone(),
                        executor: *executor,
                        now: *now,
                    },
                    OwnedTaskOp::Start { ids, now } => TaskOp::Start { ids, now: *now },
                    OwnedTaskOp::Finish {
                        id,
                        status,
                        message,
                        now,
                    } => TaskOp::Finish {
                        id: *id,
                        status: *status,
                        message,
                        now: *now,
                    },
                }),
                Vec::new(),
            ),
            OwnedMutation::Disk(op) => (Mutation::Disk(op.as_op()), Vec::new()),
            OwnedMutation::FreeRetired { now } => (Mutation::FreeRetired { now: *now }, Vec::new()),
            OwnedMutation::Reserve {
                segment,
                offset,
                len,
            } => (
                Mutation::Reserve {
                    segment: *segment,
                    offset: *offset,
                    len: *len,
                },
                Vec::new(),
            ),
            OwnedMutation::Unreserve {
                segment,
                offset,
                len,
                free_at,
                now,
            } => (
                Mutation::Unreserve {
                    segment: *segment,
                    offset: *offset,
                    len: *len,
                    free_at: *free_at,
                    now: *now,
                },
                Vec::new(),
            ),
        };
        self.replay(mutation).inspect_err(|_| {
            for (p, size) in &reserved {
                p.segment.free(p.offset, *size);
            }
        })
    }

    /// The borrowed form of `op`, its placements reserved here (and noted
    /// in `reserved`, to be given back if the mutation does not fit).
    fn object_op<'a>(
        &self,
        key: &str,
        op: &'a OwnedObjectOp,
        reserved: &mut Vec<(Placement, u64)>,
    ) -> Result<ObjectOp<'a>> {
        Ok(match op {
            OwnedObjectOp::PutStart {
                client,
                size,
                pins,
                now,
                write,
            } => ObjectOp::PutStart {
                client: *client,
                size: *size,
                pins: *pins,
                now: *now,
                write: match write {
                    OwnedWrite::Fresh(p) => Write::Fresh(self.reserve_logged(p, *size, reserved)?),
                    OwnedWrite::InPlace => Write::InPlace,
                    OwnedWrite::Replacing(p) => {
                        Write::Replacing(self.reserve_logged(p, *size, reserved)?)
                    }
                },
            },
            OwnedObjectOp::PutEnd { now, readers_until } => ObjectOp::PutEnd {
                now: *now,
                readers_until: *readers_until,
            },
            OwnedObjectOp::PutRevoke => ObjectOp::PutRevoke,
            OwnedObjectOp::DiscardPut { free_at, now } => ObjectOp::DiscardPut {
                free_at: *free_at,
                now: *now,
            },
            OwnedObjectOp::Remove { now } => ObjectOp::Remove { now: *now },
            OwnedObjectOp::DropReplicas { on, free_at, now } => ObjectOp::DropReplicas {
                on: match on {
                    OwnedSegments::Named(n) => Segments::Named(n),
                    OwnedSegments::Unmounted => Segments::Unmounted,
                },
                free_at: *free_at,
                now: *now,
            },
            OwnedObjectOp::TransferStart {
                client,
                now,
                replicas,
                drop_source,
            } => {
                // Each new replica has the object's size.
                let size = self.objects.lock(key).get(key).map(|o| o.size);
                let size = size.ok_or_else(|| diverged(format!("object {key:?} is absent")))?;
                ObjectOp::TransferStart {
                    client: *client,
                    now: *now,
                    replicas: self.reserve_logged(replicas, size, reserved)?,
                    drop_source: drop_source.as_deref(),
                }
            }
            OwnedObjectOp::TransferEnd { now, readers_until } => ObjectOp::TransferEnd {
                now: *now,
                readers_until: *readers_until,
            },
            OwnedObjectOp::TransferRevoke => ObjectOp::TransferRevoke,
            OwnedObjectOp::Group { group } => ObjectOp::Group { group },
        })
    }

    /// Reserves `size` bytes at each logged place; on a range that is not
    /// free (or a segment not mounted) gives back what it took and fails.
    fn reserve_logged(
        &self,
        places: &[Placed],
        size: u64,
        reserved: &mut Vec<(Placement, u64)>,
    ) -> Result<Replicas> {
        let mut out = Vec::with_capacity(places.len());
        for p in places {
            // A range on a segment unmounted meanwhile is taken as the
            // leader took it: by an allocation that then saw it unmounted.
            let seg = self.segments.any_by_id(p.segment);
            let Some(seg) = seg.filter(|s| !s.is_mounted() || s.reserve(p.offset, size)) else {
                for (q, size) in reserved.drain(..) {
                    q.segment.free(q.offset, size);
                }
                return Err(diverged(format!(
                    "range {}+{size} of segment {} is not free",
                    p.offset, p.segment
                )));
            };
            let placement = Placement {
                segment: seg,
                offset: p.offset,
            };
            reserved.push((placement.clone(), size));
            out.push(placement);
        }
        Ok(Replicas::from_vec(out))
    }
}
