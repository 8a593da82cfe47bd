//! The state machine's image: its replicated state as bytes and back (the
//! payload of a snapshot, `durable::snapshot::format`, which frames it
//! with its position and a checksum), and the reset that empties it for an
//! image to replace it. Nothing outside `state` reads or writes the tables.
//!
//! ```text
//! segments (next id, mounted, unmounted ones replicas still name),
//! clients, objects, tasks, retired ranges, SSD tiers, their copies,
//! reserved space (from version 2), object groups (from version 3: each
//! group's name and member keys)
//! ```
//!
//! Placements are (segment id, offset), as in the log. Decoding rebuilds
//! the state into a fresh state machine, reserving every range at its
//! offset, and refuses a state that does not hold together (a range taken
//! twice, a segment that is not there) rather than serving it.

use std::collections::HashMap;
use std::sync::Arc;

use super::fs_tier::SHARED_FS;
use super::objects::{ObjectMeta, PendingKind, PendingPut, Replicas};
use super::owned::Placed;
use super::segments::{Placement, Segment};
use super::service::MasterService;
use super::ssd_tier::{DiskCopy, Tier};
use super::tasks::TaskRecord;
use crate::proto::wire::{Decode, DecodeError, Encode, Reader};
use crate::types::{ClientId, SegmentInfo, TaskAssignment, TaskStatus};

/// Why bytes are not an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageError {
    /// The bytes do not decode.
    Malformed(DecodeError),
    /// They decode, but the state does not hold together.
    Inconsistent(String),
}

impl From<DecodeError> for ImageError {
    fn from(e: DecodeError) -> Self {
        ImageError::Malformed(e)
    }
}

/// Told how far the objects of an image being loaded are.
pub(crate) trait LoadProgress {
    /// Before the first object: how many there are.
    fn begin(&self, objects: u64);
    /// After each object: how many are done.
    fn restored(&self, done: u64);
}

fn inconsistent(why: String) -> ImageError {
    ImageError::Inconsistent(why)
}

fn placed(r: &[Placement]) -> Vec<Placed> {
    let v = r.iter();
    v.map(|p| Placed {
        segment: p.segment.id,
        offset: p.offset,
    })
    .collect()
}

impl MasterService {
    /// Appends the image of this state machine to `out`: the state at a
    /// cut (`view`), taken while it runs.
    pub(crate) fn encode_image(&self, out: &mut Vec<u8>) {
        let (view, ()) = self
            .cut_view(|| ())
            .expect("a state machine no one else holds is cut at once");
        view.encode(out, usize::MAX, &mut |_| Ok(()))
            .expect("encoding into memory");
    }

    /// Loads the image at `r` into this state machine, a fresh one (with
    /// the policy the image was taken under); `now` is the clock of the
    /// image's latest mutation, `version` the snapshot format's (which
    /// sections the image has, see the module docs). On an error the state holds part of it and must be thrown
    /// away (or reset).
    pub(crate) fn decode_image(
        &self,
        r: &mut Reader<'_>,
        now: u64,
        version: u8,
        progress: &dyn LoadProgress,
    ) -> Result<(), ImageError> {
        let next_id = u32::decode(r)?;
        let mut segs: HashMap<u32, Arc<Segment>> = HashMap::new();
        {
            let mut w = self.segments.write();
            for _ in 0..r.len(3)? {
                let (id, owner, info) = (
                    u32::decode(r)?,
                    ClientId::decode(r)?,
                    SegmentInfo::decode(r)?,
                );
                if segs.contains_key(&id) || w.get(&info.name).is_some() || id >= next_id {
                    return Err(inconsistent(format!("segment {id} ({:?})", info.name)));
                }
                segs.insert(id, w.insert(id, owner, &info));
            }
            w.set_next_id(next_id);
        }
        for _ in 0..r.len(3)? {
            let (id, owner, info) = (
                u32::decode(r)?,
                ClientId::decode(r)?,
                SegmentInfo::decode(r)?,
            );
            if segs.contains_key(&id) {
                return Err(inconsistent(format!("segment {id} twice")));
            }
            self.segments.add_unmounted(id, owner, info);
            segs.insert(id, self.segments.any_by_id(id).expect("just added"));
        }
        {
            let mut clients = self.clients.lock();
            for _ in 0..r.len(17)? {
                let c = ClientId::decode(r)?;
                clients.insert(c, u64::decode(r)?);
            }
        }
        let reserve =
            |places: Vec<Placed>, size: u64| -> std::result::Result<Replicas, ImageError> {
                let mut out = Vec::with_capacity(places.len());
                for p in places {
                    let seg = segs
                        .get(&p.segment)
                        .ok_or_else(|| inconsistent(format!("no segment {}", p.segment)))?;
                    if seg.is_mounted() && !seg.reserve(p.offset, size) {
                        return Err(inconsistent(format!(
                            "range {}+{size} of segment {} taken twice",
                            p.offset, p.segment
                        )));
                    }
                    out.push(Placement {
                        segment: seg.clone(),
                        offset: p.offset,
                    });
                }
                Ok(Replicas::from_vec(out))
            };
        // Objects' ranges are taken all at once after the objects, per
        // segment (`Segment::reserve_all`): one at a time, in the order
        // of the image, they would fragment the free lists on the way.
        let ranges = self.load_objects(r, now, &segs, progress)?;
        for (id, mut ranges) in ranges {
            let seg = segs.get(&id).expect("placed on a known segment");
            seg.reserve_all(&mut ranges).map_err(|b| {
                inconsistent(format!(
                    "range {}+{} of segment {id} taken twice",
                    b.offset, b.len
                ))
            })?;
        }
        {
            let mut tasks = self.tasks.lock();
            for _ in 0..r.len(20)? {
                let rec = TaskRecord {
                    assignment: TaskAssignment::decode(r)?,
                    status: TaskStatus::decode(r)?,
                    client: ClientId::decode(r)?,
                    created: u64::decode(r)?,
                    updated: u64::decode(r)?,
                    message: String::decode(r)?,
                };
                if tasks.contains(rec.assignment.id) {
                    return Err(inconsistent(format!("task {} twice", rec.assignment.id)));
                }
                tasks.restore(rec);
            }
        }
        for _ in 0..r.len(4)? {
            let id = u32::decode(r)?;
            let offset = u64::decode(r)?;
            let size = u64::decode(r)?;
            let free_at = u64::decode(r)?;
            let replicas = reserve(
                vec![Placed {
                    segment: id,
                    offset,
                }],
                size,
            )?;
            self.retired.retire(replicas.as_slice(), size, free_at);
        }
        // A tier: a 16-byte owner, two strings and a varint, 19 bytes at least.
        for _ in 0..r.len(19)? {
            let client = ClientId::decode(r)?;
            let tier = Tier {
                tier_id: <&str>::decode(r)?.into(),
                endpoint: String::decode(r)?,
                capacity: u64::decode(r)?,
            };
            if self.disk.has_tier(client) {
                return Err(inconsistent(format!("SSD tier of {client:032x} twice")));
            }
            self.disk.mount(client, tier);
        }
        for _ in 0..r.len(18)? {
            let key = <&str>::decode(r)?;
            let copy = DiskCopy {
                owner: ClientId::decode(r)?,
                size: u64::decode(r)?,
            };
            if copy.owner != SHARED_FS && !self.disk.has_tier(copy.owner) {
                return Err(inconsistent(format!("copy of {key:?} in no tier")));
            }
            self.disk.add(key, copy);
        }
        if version >= 2 {
            for _ in 0..r.len(3)? {
                let (id, offset, len) = (u32::decode(r)?, u64::decode(r)?, u64::decode(r)?);
                let seg = segs.get(&id).filter(|s| s.is_mounted());
                if !seg.is_some_and(|s| s.add_reserved(offset, len)) {
                    return Err(inconsistent(format!(
                        "reserved range {offset}+{len} of segment {id}"
                    )));
                }
            }
        }
        if version >= 3 {
            // A group: its name and member count, two bytes at least.
            for _ in 0..r.len(2)? {
                let name = <&str>::decode(r)?;
                let members = r.len(1)?;
                if name.is_empty() || members == 0 {
                    return Err(inconsistent(format!("group {name:?}")));
                }
                for _ in 0..members {
                    let key = <&str>::decode(r)?;
                    if !self.objects.lock(key).contains_key(key)
                        || self.objects.groups.group_of(key).is_some()
                    {
                        return Err(inconsistent(format!("group member {key:?}")));
                    }
                    self.objects.groups.join(key, name);
                }
            }
        }
        Ok(())
    }

    /// Empties the replicated state and the volatile tables (a standby
    /// whose state a snapshot replaces).
    pub(crate) fn reset(&self) {
        self.objects.clear();
        self.segments.clear();
        self.retired.clear();
        self.disk.clear();
        self.files.clear();
        *self.clients.lock() = Default::default();
        *self.tasks.lock() = Default::default();
    }
}

pub(super) fn out_segments<'a>(
    out: &mut Vec<u8>,
    segs: impl ExactSizeIterator<Item = &'a Arc<Segment>>,
) {
    segs.len().encode(out);
    for seg in segs {
        seg.id.encode(out);
        seg.owner.encode(out);
        seg.info.encode(out);
    }
}

pub(super) fn encode_object(out: &mut Vec<u8>, key: &str, o: &ObjectMeta) {
    key.encode(out);
    o.size.encode(out);
    o.lease_until.encode(out);
    o.soft_pin_until.encode(out);
    o.flags.encode(out);
    placed(o.replicas.as_slice()).encode(out);
    match o.pending.as_deref() {
        None => out.push(0),
        Some(PendingPut {
            client,
            started,
            kind,
        }) => {
            match kind {
                PendingKind::Fresh => out.push(1),
                PendingKind::InPlace => out.push(2),
                PendingKind::Replacing { .. } => out.push(3),
                PendingKind::Replicating { .. } => out.push(4),
            }
            client.encode(out);
            started.encode(out);
            match kind {
                PendingKind::Fresh | PendingKind::InPlace => {}
                PendingKind::Replacing {
                    replicas,
                    size,
                    flags,
                } => {
                    placed(replicas.as_slice()).encode(out);
                    size.encode(out);
                    flags.encode(out);
                }
                PendingKind::Replicating {
                    replicas,
                    drop_source,
                } => {
                    placed(replicas.as_slice()).encode(out);
                    drop_source.as_deref().map(str::to_owned).encode(out);
                }
            }
        }
    }
}
