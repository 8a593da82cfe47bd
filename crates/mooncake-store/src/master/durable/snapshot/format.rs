//! The snapshot format: the replicated state of a master at one log
//! position, in one checksummed frame.
//!
//! ```text
//! 0..4   magic "MCSN"
//! 4      format version (2; 1 is read too: it has no reserved space)
//! 5..8   zero
//! 8..16  payload length, u64 little-endian
//! 16..20 CRC-32C of bytes 4..16 and the payload
//! 20..   payload (varint-based wire encoding, `crate::proto::wire`):
//!        seq, term, now, segments (next id, mounted, unmounted ones
//!        replicas still name), clients, objects, tasks, retired ranges,
//!        SSD tiers, their copies, reserved space (version 2)
//! ```
//!
//! Placements are (segment id, offset), as in the log. Decoding checks
//! the frame before it reads anything, rebuilds the state into a fresh
//! [`MasterService`] reserving every range at its offset, and refuses a
//! state that does not hold together (a range taken twice, a segment that
//! is not there) rather than serving it.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode};

use super::progress::RestoreProgress;
use crate::master::durable::oplog::Placed;
use crate::master::state::fs_tier::SHARED_FS;
use crate::master::state::objects::{ObjectMeta, PendingKind, PendingPut, Replicas};
use crate::master::state::segments::{Placement, Segment};
use crate::master::state::service::MasterService;
use crate::master::state::ssd_tier::{DiskCopy, Tier};
use crate::master::state::tasks::TaskRecord;
use crate::proto::wire::{self, Decode, Encode, Reader};
use crate::types::{ClientId, SegmentInfo, TaskAssignment, TaskStatus};

pub const MAGIC: [u8; 4] = *b"MCSN";
pub const VERSION: u8 = 2;
/// The oldest version still read.
const OLDEST: u8 = 1;
pub const HEADER_LEN: usize = 20;

/// Where in the log a snapshot stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnapshotMeta {
    /// The last log entry it includes.
    pub seq: u64,
    /// The term of that entry.
    pub term: u64,
    /// The master clock (ms) of the latest mutation it includes.
    pub now: u64,
}

/// Why bytes are not a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    Truncated,
    BadMagic,
    UnknownVersion(u8),
    Checksum {
        stored: u32,
        computed: u32,
    },
    /// The checksum matches but the payload does not decode.
    Malformed(wire::DecodeError),
    /// It decodes, but its state does not hold together.
    Inconsistent(String),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Truncated => write!(f, "snapshot is truncated"),
            SnapshotError::BadMagic => write!(f, "not a snapshot (bad magic)"),
            SnapshotError::UnknownVersion(v) => write!(f, "unknown snapshot version {v}"),
            SnapshotError::Checksum { stored, computed } => write!(
                f,
                "snapshot checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            SnapshotError::Malformed(e) => write!(f, "malformed snapshot: {e}"),
            SnapshotError::Inconsistent(why) => write!(f, "inconsistent snapshot: {why}"),
        }
    }
}

impl std::error::Error for SnapshotError {}

impl From<SnapshotError> for Error {
    fn from(e: SnapshotError) -> Self {
        let code = match e {
            SnapshotError::UnknownVersion(_) => ErrorCode::INVALID_VERSION,
            _ => ErrorCode::DESERIALIZE_FAIL,
        };
        Error::new(code, e.to_string())
    }
}

impl From<wire::DecodeError> for SnapshotError {
    fn from(e: wire::DecodeError) -> Self {
        SnapshotError::Malformed(e)
    }
}

fn checksum(header: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header), payload)
}

fn placed(r: &[Placement]) -> Vec<Placed> {
    let v = r.iter();
    v.map(|p| Placed {
        segment: p.segment.id,
        offset: p.offset,
    })
    .collect()
}

/// Encodes the state of `s` (which nothing changes meanwhile) as a
/// snapshot at `meta`.
pub fn encode(s: &MasterService, meta: SnapshotMeta) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&[VERSION, 0, 0, 0]);
    out.extend_from_slice(&[0; 12]);
    meta.seq.encode(&mut out);
    meta.term.encode(&mut out);
    meta.now.encode(&mut out);

    let mounted = s.segments.all();
    let w = s.segments.write();
    w.next_id().encode(&mut out);
    drop(w);
    out_segments(&mut out, mounted.iter());
    // Unmounted segments that replicas (or retired ranges) still name.
    let mut detached: HashMap<u32, Arc<Segment>> = HashMap::new();
    let mut note = |p: &Placement| {
        if !p.segment.is_mounted() {
            detached.entry(p.segment.id).or_insert(p.segment.clone());
        }
    };
    let mut objects = 0u64;
    for shard in s.objects.shards() {
        for obj in shard.values() {
            objects += 1;
            obj.replicas.as_slice().iter().for_each(&mut note);
            if let Some(p) = &obj.pending {
                match &p.kind {
                    PendingKind::Replacing { replicas, .. }
                    | PendingKind::Replicating { replicas, .. } => {
                        replicas.as_slice().iter().for_each(&mut note)
                    }
                    PendingKind::Fresh | PendingKind::InPlace => {}
                }
            }
        }
    }
    let mut detached: Vec<_> = detached.into_values().collect();
    detached.sort_by_key(|s| s.id);
    out_segments(&mut out, detached.iter());

    let clients: Vec<(ClientId, u64)> = s.clients.lock().iter().collect();
    clients.len().encode(&mut out);
    for (c, t) in clients {
        c.encode(&mut out);
        t.encode(&mut out);
    }

    objects.encode(&mut out);
    for shard in s.objects.shards() {
        for (key, obj) in shard.iter() {
            encode_object(&mut out, key, obj);
        }
    }

    let tasks = s.tasks.lock().export();
    tasks.len().encode(&mut out);
    for t in &tasks {
        t.assignment.encode(&mut out);
        t.status.encode(&mut out);
        t.client.encode(&mut out);
        t.created.encode(&mut out);
        t.updated.encode(&mut out);
        t.message.encode(&mut out);
    }

    let retired = s.retired.export();
    let retired: Vec<_> = retired
        .iter()
        .filter(|(p, _, _)| p.segment.is_mounted())
        .collect();
    retired.len().encode(&mut out);
    for (p, size, free_at) in retired {
        p.segment.id.encode(&mut out);
        p.offset.encode(&mut out);
        size.encode(&mut out);
        free_at.encode(&mut out);
    }

    let tiers = s.disk.export_tiers();
    tiers.len().encode(&mut out);
    for (client, tier_id, endpoint, capacity) in &tiers {
        client.encode(&mut out);
        tier_id.encode(&mut out);
        endpoint.encode(&mut out);
        capacity.encode(&mut out);
    }
    let copies = s.disk.export_copies();
    copies.len().encode(&mut out);
    for (key, copy) in &copies {
        key.encode(&mut out);
        copy.owner.encode(&mut out);
        copy.size.encode(&mut out);
    }

    let reserved = crate::master::state::segments::space::all_reserved(&mounted);
    reserved.len().encode(&mut out);
    for (seg, offset, len) in &reserved {
        seg.id.encode(&mut out);
        offset.encode(&mut out);
        len.encode(&mut out);
    }

    let len = (out.len() - HEADER_LEN) as u64;
    out[8..16].copy_from_slice(&len.to_le_bytes());
    let crc = checksum(&out[4..16], &out[HEADER_LEN..]);
    out[16..20].copy_from_slice(&crc.to_le_bytes());
    out
}

fn out_segments<'a>(out: &mut Vec<u8>, segs: impl ExactSizeIterator<Item = &'a Arc<Segment>>) {
    segs.len().encode(out);
    for seg in segs {
        seg.id.encode(out);
        seg.owner.encode(out);
        seg.info.encode(out);
    }
}

fn encode_object(out: &mut Vec<u8>, key: &str, o: &ObjectMeta) {
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

/// The checked payload of a snapshot (frame checks only).
pub fn payload(buf: &[u8]) -> std::result::Result<&[u8], SnapshotError> {
    let seen = buf.len().min(4);
    if buf[..seen] != MAGIC[..seen] {
        return Err(SnapshotError::BadMagic);
    }
    if let Some(&v) = buf.get(4) {
        if !(OLDEST..=VERSION).contains(&v) {
            return Err(SnapshotError::UnknownVersion(v));
        }
    }
    if buf.len() < HEADER_LEN {
        return Err(SnapshotError::Truncated);
    }
    let len = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
    let rest = (buf.len() - HEADER_LEN) as u64;
    if len > rest {
        return Err(SnapshotError::Truncated);
    }
    if len < rest {
        return Err(SnapshotError::Malformed(wire::DecodeError::TrailingBytes(
            (rest - len) as usize,
        )));
    }
    let stored = u32::from_le_bytes(buf[16..20].try_into().expect("4 bytes"));
    let payload = &buf[HEADER_LEN..];
    let computed = checksum(&buf[4..16], payload);
    if stored != computed {
        return Err(SnapshotError::Checksum { stored, computed });
    }
    Ok(payload)
}

/// The position a snapshot stands at, from its frame alone.
pub fn read_meta(buf: &[u8]) -> std::result::Result<SnapshotMeta, SnapshotError> {
    let mut r = Reader::new(payload(buf)?);
    Ok(SnapshotMeta {
        seq: u64::decode(&mut r)?,
        term: u64::decode(&mut r)?,
        now: u64::decode(&mut r)?,
    })
}

fn inconsistent(why: String) -> SnapshotError {
    SnapshotError::Inconsistent(why)
}

/// Rebuilds the state a snapshot holds into `s`, a fresh master (with
/// the policy the snapshot was taken under). On an error `s` holds part
/// of it and must be thrown away.
pub fn decode_into(
    buf: &[u8],
    s: &MasterService,
    progress: &RestoreProgress,
) -> std::result::Result<SnapshotMeta, SnapshotError> {
    let mut r = Reader::new(payload(buf)?);
    let meta = SnapshotMeta {
        seq: u64::decode(&mut r)?,
        term: u64::decode(&mut r)?,
        now: u64::decode(&mut r)?,
    };
    let next_id = u32::decode(&mut r)?;
    let mut segs: HashMap<u32, Arc<Segment>> = HashMap::new();
    {
        let mut w = s.segments.write();
        for _ in 0..r.len(3)? {
            let (id, owner, info) = (
                u32::decode(&mut r)?,
                ClientId::decode(&mut r)?,
                SegmentInfo::decode(&mut r)?,
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
            u32::decode(&mut r)?,
            ClientId::decode(&mut r)?,
            SegmentInfo::decode(&mut r)?,
        );
        if segs.contains_key(&id) {
            return Err(inconsistent(format!("segment {id} twice")));
        }
        s.segments.add_unmounted(id, owner, info);
        segs.insert(id, s.segments.any_by_id(id).expect("just added"));
    }
    {
        let mut clients = s.clients.lock();
        for _ in 0..r.len(17)? {
            let c = ClientId::decode(&mut r)?;
            clients.insert(c, u64::decode(&mut r)?);
        }
    }
    let reserve =
        |places: Vec<Placed>, size: u64| -> std::result::Result<Replicas, SnapshotError> {
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
    let objects = u64::decode(&mut r)?;
    if objects > r.remaining() as u64 {
        return Err(SnapshotError::Malformed(wire::DecodeError::BadLength(
            objects,
        )));
    }
    progress.begin(meta.seq, objects);
    for done in 1..=objects {
        let key = <&str>::decode(&mut r)?;
        let size = u64::decode(&mut r)?;
        let lease_until = u64::decode(&mut r)?;
        let soft_pin_until = u64::decode(&mut r)?;
        let flags = u8::decode(&mut r)?;
        let replicas = reserve(Vec::decode(&mut r)?, size)?;
        let tag = r.u8()?;
        let pending = match tag {
            0 => None,
            1..=4 => {
                let client = ClientId::decode(&mut r)?;
                let started = u64::decode(&mut r)?;
                let kind = match tag {
                    1 => PendingKind::Fresh,
                    2 => PendingKind::InPlace,
                    3 => {
                        let places = Vec::decode(&mut r)?;
                        let psize = u64::decode(&mut r)?;
                        PendingKind::Replacing {
                            replicas: reserve(places, psize)?,
                            size: psize,
                            flags: u8::decode(&mut r)?,
                        }
                    }
                    _ => {
                        let places = Vec::decode(&mut r)?;
                        PendingKind::Replicating {
                            replicas: reserve(places, size)?,
                            drop_source: Option::<String>::decode(&mut r)?.map(Box::from),
                        }
                    }
                };
                Some(Box::new(PendingPut {
                    client,
                    started,
                    kind,
                }))
            }
            t => {
                return Err(SnapshotError::Malformed(wire::DecodeError::BadTag {
                    what: "pending put",
                    tag: t.into(),
                }))
            }
        };
        let mut shard = s.objects.lock(key);
        shard.clock(meta.now);
        if let Some(p) = &pending {
            shard.note_pending(p.started);
        }
        let obj = ObjectMeta {
            size,
            lease_until,
            soft_pin_until,
            replicas,
            pending,
            flags,
        };
        if !s.objects.restore(&mut shard, key, obj) {
            return Err(inconsistent(format!("object {key:?} twice")));
        }
        drop(shard);
        progress.restored(done);
    }
    {
        let mut tasks = s.tasks.lock();
        for _ in 0..r.len(20)? {
            let rec = TaskRecord {
                assignment: TaskAssignment::decode(&mut r)?,
                status: TaskStatus::decode(&mut r)?,
                client: ClientId::decode(&mut r)?,
                created: u64::decode(&mut r)?,
                updated: u64::decode(&mut r)?,
                message: String::decode(&mut r)?,
            };
            if tasks.contains(rec.assignment.id) {
                return Err(inconsistent(format!("task {} twice", rec.assignment.id)));
            }
            tasks.restore(rec);
        }
    }
    for _ in 0..r.len(4)? {
        let id = u32::decode(&mut r)?;
        let offset = u64::decode(&mut r)?;
        let size = u64::decode(&mut r)?;
        let free_at = u64::decode(&mut r)?;
        let replicas = reserve(
            vec![Placed {
                segment: id,
                offset,
            }],
            size,
        )?;
        s.retired.retire(replicas.as_slice(), size, free_at);
    }
    // A tier: a 16-byte owner, two strings and a varint, 19 bytes at least.
    for _ in 0..r.len(19)? {
        let client = ClientId::decode(&mut r)?;
        let tier = Tier {
            tier_id: <&str>::decode(&mut r)?.into(),
            endpoint: String::decode(&mut r)?,
            capacity: u64::decode(&mut r)?,
        };
        if s.disk.has_tier(client) {
            return Err(inconsistent(format!("SSD tier of {client:032x} twice")));
        }
        s.disk.mount(client, tier);
    }
    for _ in 0..r.len(18)? {
        let key = <&str>::decode(&mut r)?;
        let copy = DiskCopy {
            owner: ClientId::decode(&mut r)?,
            size: u64::decode(&mut r)?,
        };
        if copy.owner != SHARED_FS && !s.disk.has_tier(copy.owner) {
            return Err(inconsistent(format!("copy of {key:?} in no tier")));
        }
        s.disk.add(key, copy);
    }
    if buf[4] >= 2 {
        for _ in 0..r.len(3)? {
            let (id, offset, len) = (
                u32::decode(&mut r)?,
                u64::decode(&mut r)?,
                u64::decode(&mut r)?,
            );
            let seg = segs.get(&id).filter(|s| s.is_mounted());
            if !seg.is_some_and(|s| s.add_reserved(offset, len)) {
                return Err(inconsistent(format!(
                    "reserved range {offset}+{len} of segment {id}"
                )));
            }
        }
    }
    r.finish()?;
    Ok(meta)
}
