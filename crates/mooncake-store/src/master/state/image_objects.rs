//! Loading the objects of an image on more than one core: the calling
//! thread decodes them and groups them by shard, worker threads add each
//! group to its shard under one lock. Decoding and inserting then overlap,
//! and shards fill in parallel when the image's objects alternate between
//! them. The result is the one a load object by object would give,
//! errors included: the first object (in image order) that does not
//! decode or does not fit is the one reported.

use std::collections::HashMap;
use std::sync::{mpsc, Arc};

use parking_lot::Mutex;

use super::image::{ImageError, LoadProgress};
use super::objects::{ObjectMeta, PendingKind, PendingPut, Replicas};
use super::owned::Placed;
use super::segments::{Placement, Segment};
use super::service::MasterService;
use crate::proto::wire::{Decode, DecodeError, Reader, MAX_SEQUENCE_LEN};
use crate::types::ClientId;

/// Objects handed to a worker at once (all of one shard). Large, so that
/// the probes of one batch into its shard's index (about a quarter of a
/// MiB of control bytes at 10^7 objects) find most of it in cache: with
/// 4 096 nearly every probe missed. Tests use small chunks and threads
/// from a few objects on, so their images take the threaded path.
const CHUNK: usize = if cfg!(test) { 16 } else { 16 * 1024 };
/// Chunks queued per worker before the decoder waits.
const QUEUED: usize = 4;
/// Below this many objects the caller's thread does everything.
const PARALLEL_FROM: u64 = if cfg!(test) { 64 } else { 64 * 1024 };

// A worker's failed shards are bits of a u64.
const _: () = assert!(super::objects::SHARDS <= 64);

/// Objects decoded for one shard, in image order: each with its position
/// in the image, where its key lies in `keys`, and its metadata. The keys
/// are copied out of the image so that the worker adding them reads only
/// this batch, in order, and not the image far behind the decoder (a
/// cache miss per key); batches go back to the decoder to be filled again,
/// so their memory is faulted in once.
#[derive(Default)]
struct Batch {
    items: Vec<(u64, u32, u32, ObjectMeta)>,
    keys: String,
}

impl Batch {
    fn push(&mut self, at: u64, key: &str, obj: ObjectMeta) {
        let off = self.keys.len();
        self.keys.push_str(key);
        // A batch holds `CHUNK` keys: far from 4 GiB.
        self.items.push((at, off as u32, key.len() as u32, obj));
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The ranges the objects take on each mounted segment, to be reserved at
/// once after them (`Segment::reserve_all`).
pub(super) type Ranges = HashMap<u32, Vec<(u64, u64)>>;

/// The segment an object names, and its range noted when it is mounted.
struct Placer<'s> {
    segs: &'s HashMap<u32, Arc<Segment>>,
    ranges: Ranges,
    /// The segment of the previous placement: most objects share it.
    last: Option<(u32, &'s Arc<Segment>, bool)>,
}

impl<'s> Placer<'s> {
    fn segment(&mut self, id: u32) -> Result<(&'s Arc<Segment>, bool), ImageError> {
        if let Some((last, seg, mounted)) = self.last {
            if last == id {
                return Ok((seg, mounted));
            }
        }
        let seg = self
            .segs
            .get(&id)
            .ok_or_else(|| ImageError::Inconsistent(format!("no segment {id}")))?;
        let mounted = seg.is_mounted();
        self.last = Some((id, seg, mounted));
        Ok((seg, mounted))
    }

    /// The placement `p` of `size` bytes; its range noted when mounted.
    fn add(&mut self, p: Placed, size: u64) -> Result<Placement, ImageError> {
        let (seg, mounted) = self.segment(p.segment)?;
        if mounted {
            self.ranges
                .entry(p.segment)
                .or_default()
                .push((p.offset, size));
        }
        Ok(Placement {
            segment: seg.clone(),
            offset: p.offset,
        })
    }

    /// Decodes a list of placements of `size` bytes each (as
    /// `Vec::<Placed>::decode` would, without a vector for one).
    fn place(&mut self, r: &mut Reader<'_>, size: u64) -> Result<Replicas, ImageError> {
        let n = r.len(1)?;
        if n > MAX_SEQUENCE_LEN {
            return Err(DecodeError::TooMany(n as u64).into());
        }
        if n == 1 {
            let p = Placed::decode(r)?;
            return Ok(Replicas::One(self.add(p, size)?));
        }
        let mut places = Vec::with_capacity(n.min(16));
        for _ in 0..n {
            places.push(Placed::decode(r)?);
        }
        self.place_all(places, size)
    }

    fn place_all(&mut self, places: Vec<Placed>, size: u64) -> Result<Replicas, ImageError> {
        let mut out = Vec::with_capacity(places.len());
        for p in places {
            out.push(self.add(p, size)?);
        }
        Ok(Replicas::from_vec(out))
    }

    fn object<'a>(&mut self, r: &mut Reader<'a>) -> Result<(&'a str, ObjectMeta), ImageError> {
        let key = <&str>::decode(r)?;
        let size = u64::decode(r)?;
        let lease_until = u64::decode(r)?;
        let soft_pin_until = u64::decode(r)?;
        let flags = u8::decode(r)?;
        let replicas = self.place(r, size)?;
        let tag = r.u8()?;
        let pending = match tag {
            0 => None,
            1..=4 => {
                let client = ClientId::decode(r)?;
                let started = u64::decode(r)?;
                let kind = match tag {
                    1 => PendingKind::Fresh,
                    2 => PendingKind::InPlace,
                    3 => {
                        let places = Vec::<Placed>::decode(r)?;
                        let psize = u64::decode(r)?;
                        PendingKind::Replacing {
                            replicas: self.place_all(places, psize)?,
                            size: psize,
                            flags: u8::decode(r)?,
                        }
                    }
                    _ => PendingKind::Replicating {
                        replicas: self.place(r, size)?,
                        drop_source: Option::<String>::decode(r)?.map(Box::from),
                    },
                };
                Some(Box::new(PendingPut {
                    client,
                    started,
                    kind,
                }))
            }
            t => {
                return Err(ImageError::Malformed(DecodeError::BadTag {
                    what: "pending put",
                    tag: t.into(),
                }))
            }
        };
        let obj = ObjectMeta {
            size,
            lease_until,
            soft_pin_until,
            replicas,
            pending,
            flags,
            used: 0,
            reads: 0,
        };
        Ok((key, obj))
    }
}

/// The first failure seen, by position in the image.
#[derive(Default)]
struct FirstError(Mutex<Option<(u64, ImageError)>>);

impl FirstError {
    fn note(&self, at: u64, e: ImageError) {
        let mut first = self.0.lock();
        if first.as_ref().is_none_or(|(f, _)| at < *f) {
            *first = Some((at, e));
        }
    }
}

/// Adds `batch` (objects of shard `shard`, in image order); false, with the key seen twice noted, when one was already there.
fn insert(
    s: &MasterService,
    shard: usize,
    now: u64,
    batch: &mut Batch,
    failed: &FirstError,
) -> bool {
    let Batch { items, keys } = batch;
    // `restore_shard` stops at the object it could not add: the last
    // one it took.
    let mut last = None;
    let keys: &str = keys;
    let objects = items.drain(..).map(|(at, off, len, obj)| {
        let key = &keys[off as usize..(off + len) as usize];
        last = Some((at, key));
        (key, obj)
    });
    match s.objects.restore_shard(shard, now, objects) {
        Ok(()) => true,
        Err(_) => {
            let (at, key) = last.expect("a failed batch took an object");
            failed.note(
                at,
                ImageError::Inconsistent(format!("object {key:?} twice")),
            );
            false
        }
    }
}

/// Adds the chunks it is handed; a shard stops at its first key seen
/// twice (the later objects of that shard come after it in the image),
/// the others go on, so an earlier one in another shard is still found.
struct Inserter<'m> {
    s: &'m MasterService,
    now: u64,
    failed_shards: u64,
}

impl Inserter<'_> {
    fn take(&mut self, shard: usize, batch: &mut Batch, failed: &FirstError) {
        let bit = 1u64 << shard;
        if self.failed_shards & bit == 0 && !insert(self.s, shard, self.now, batch, failed) {
            self.failed_shards |= bit;
        }
        batch.items.clear();
        batch.keys.clear();
    }
}

impl MasterService {
    /// Loads the object section of an image (its count, then each object)
    /// into this fresh state machine; returns the ranges to reserve.
    pub(super) fn load_objects<'a>(
        &self,
        r: &mut Reader<'a>,
        now: u64,
        segs: &HashMap<u32, Arc<Segment>>,
        progress: &dyn LoadProgress,
    ) -> Result<Ranges, ImageError> {
        let objects = u64::decode(r)?;
        if objects > r.remaining() as u64 {
            return Err(ImageError::Malformed(DecodeError::BadLength(objects)));
        }
        progress.begin(objects);
        self.objects.reserve(objects);
        let mut placer = Placer {
            segs,
            ranges: HashMap::new(),
            last: None,
        };
        let failed = FirstError::default();
        let workers = if objects < PARALLEL_FROM {
            0
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 8))
        };
        // Emptied batches on their way back to be filled again.
        let (back, returned) = mpsc::channel::<Batch>();
        std::thread::scope(|sc| {
            // A worker that cannot start leaves its shards to this thread.
            let queues: Vec<_> = (0..workers)
                .map(|_| {
                    let (tx, rx) = mpsc::sync_channel::<(usize, Batch)>(QUEUED);
                    let (failed, back) = (&failed, back.clone());
                    let mut w = Inserter {
                        s: self,
                        now,
                        failed_shards: 0,
                    };
                    std::thread::Builder::new()
                        .name("mc-restore".into())
                        .spawn_scoped(sc, move || {
                            for (shard, mut batch) in rx {
                                w.take(shard, &mut batch, failed);
                                // The decoder may be done and gone.
                                let _ = back.send(batch);
                            }
                        })
                        .ok()
                        .map(|_| tx)
                })
                .collect();
            let mut own = Inserter {
                s: self,
                now,
                failed_shards: 0,
            };
            // Hands `batch` over; returns it emptied when added here.
            let mut hand = |shard: usize, mut batch: Batch| -> Option<Batch> {
                if batch.is_empty() {
                    return Some(batch);
                }
                if let Some(q) = queues.get(shard % workers.max(1)).and_then(Option::as_ref) {
                    match q.send((shard, batch)) {
                        Ok(()) => return None,
                        Err(mpsc::SendError((_, b))) => batch = b,
                    }
                }
                own.take(shard, &mut batch, &failed);
                Some(batch)
            };
            // Objects decoded and not yet handed over, by shard.
            let mut pending: Vec<Batch> = (0..super::objects::SHARDS)
                .map(|_| Batch::default())
                .collect();
            for done in 0..objects {
                match placer.object(r) {
                    Ok((key, obj)) => {
                        let shard = self.objects.shard_index(key);
                        let group = &mut pending[shard];
                        // A new batch grows as it fills rather than
                        // taking a whole chunk up front: the image's count
                        // of objects is not yet checked against its bytes,
                        // and a short or forged image must not cost
                        // megabytes.
                        if group.items.capacity() == 0 {
                            if let Ok(b) = returned.try_recv() {
                                *group = b;
                            }
                        }
                        group.push(done, key, obj);
                        if group.len() == CHUNK {
                            let full = std::mem::take(group);
                            if let Some(empty) = hand(shard, full) {
                                *group = empty;
                            }
                        }
                    }
                    Err(e) => {
                        failed.note(done, e);
                        break;
                    }
                }
                progress.restored(done + 1);
            }
            // What was decoded before a failure is still added: a key
            // seen twice earlier in the image is the error to report.
            for (shard, group) in pending.into_iter().enumerate() {
                hand(shard, group);
            }
        });
        match failed.0.into_inner() {
            Some((_, e)) => Err(e),
            None => Ok(placer.ranges),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::config::policy::AllocationStrategy;
    use crate::master::state::objects::SHARDS;
    use crate::master::state::service::tests::{assert_same, service};
    use crate::types::{ReplicaPolicy, SegmentInfo};

    struct Quiet;

    impl LoadProgress for Quiet {
        fn begin(&self, _: u64) {}
        fn restored(&self, _: u64) {}
    }

    /// A master with `n` objects on two segments: some with two replicas,
    /// some still being put.
    fn filled(n: usize) -> MasterService {
        let s = service(AllocationStrategy::FreeRatioFirst);
        for (name, owner) in [("big1", 1), ("big2", 2)] {
            let info = SegmentInfo {
                name: name.into(),
                base: 1 << 40,
                size: 1 << 30,
                transport_endpoint: format!("{name}:1"),
            };
            s.mount_segment(owner, &info, 0).unwrap();
        }
        for i in 0..n {
            let key = format!("obj/{i}");
            let cfg = ReplicaPolicy {
                replica_num: (1 + i % 2) as _,
                ..ReplicaPolicy::default()
            };
            s.put_start(7, &key, 64 + i as u64 % 100, &cfg, false, 1)
                .unwrap();
            if i % 5 != 0 {
                s.put_end(7, &key, 2).unwrap();
            }
        }
        s
    }

    fn image(s: &MasterService) -> Vec<u8> {
        let mut out = Vec::new();
        s.encode_image(&mut out);
        out
    }

    #[test]
    fn a_threaded_load_restores_every_object() {
        let leader = filled(5_000);
        let bytes = image(&leader);
        let restored = service(AllocationStrategy::FreeRatioFirst);
        let mut r = Reader::new(&bytes);
        restored.decode_image(&mut r, 2, 3, &Quiet).unwrap();
        r.finish().unwrap();
        assert_same(&leader, &restored, &[], "threaded load");
    }

    #[test]
    fn the_first_key_seen_twice_in_image_order_is_reported() {
        let leader = filled(3_000);
        let bytes = image(&leader);
        // The image lists objects shard by shard.
        let order: Vec<String> = (0..SHARDS)
            .flat_map(|i| {
                let shard = leader.objects.lock_shard(i);
                shard.iter().map(|(k, _)| k.to_string()).collect::<Vec<_>>()
            })
            .collect();
        let (early, late) = (&order[100], &order[2_500]);
        let target = service(AllocationStrategy::FreeRatioFirst);
        // The later one first: the error must still name the earlier.
        for key in [late, early] {
            let obj = ObjectMeta {
                size: 1,
                lease_until: 0,
                soft_pin_until: 0,
                replicas: Replicas::Many(Box::new([])),
                pending: None,
                flags: 0,
                used: 0,
                reads: 0,
            };
            let shard = target.objects.shard_index(key);
            target
                .objects
                .restore_shard(shard, 0, [(key.as_str(), obj)])
                .unwrap();
        }
        let err = target
            .decode_image(&mut Reader::new(&bytes), 2, 3, &Quiet)
            .unwrap_err();
        assert_eq!(
            err,
            ImageError::Inconsistent(format!("object {early:?} twice"))
        );
    }
}
