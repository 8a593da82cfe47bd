//! Cuts through the object map for snapshots (`ObjectMap::cut`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Mutex, MutexGuard, RwLock};

use super::super::segments::Segment;
use super::table::Table;
use super::walk::{Encode, Spec};
use super::{ObjectMap, Shard};

/// Slots a round writes out per hold of a shard's lock: a write waiting
/// for the lock waits for at most this many records' encoding.
const SLICE: u32 = 128;

/// Cuts through the object map: consistent views of every shard at one
/// moment of the log, without a copy of the tables (`ObjectMap::cut`).
///
/// Every write to a table holds `gate` (read) from before it touches the
/// table until the change, and the mutation it logs, are done; a cut holds
/// it (write) for an instant and opens a new `epoch`. The first write to a
/// shard after a cut starts that shard's walk first (`walk`), so the round
/// writes out exactly what was applied before the cut; shards no one
/// writes join when the round starts.
#[derive(Default)]
pub(super) struct Cuts {
    pub(super) gate: RwLock<()>,
    pub(super) epoch: AtomicU64,
    /// What the latest cut's round needs.
    pub(super) spec: Mutex<Option<Arc<Spec>>>,
}

impl Cuts {
    /// Makes `map`, which joined cut `walked_at` last, join the latest
    /// cut's round when it has not yet (call with the gate held, or right
    /// after the cut, before the shard's next write).
    pub(super) fn join(&self, map: &mut Table, walked_at: &mut u64) {
        let epoch = self.epoch.load(Ordering::Acquire);
        if *walked_at < epoch {
            *walked_at = epoch;
            if let Some(spec) = self.spec.lock().clone() {
                map.begin_walk(epoch, spec);
            }
        }
    }
}

/// The objects at one cut, written out from the live tables
/// (`ObjectMap::cut`). Dropped, it leaves the tables.
pub(crate) struct Round<'a> {
    map: &'a ObjectMap,
    epoch: u64,
}

fn superseded() -> Error {
    Error::new(
        ErrorCode::INTERNAL_ERROR,
        "snapshot round superseded by a later cut or a reset",
    )
}

impl Round<'_> {
    fn shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.map.shards[i].0.lock()
    }

    /// How many objects the map held at the cut.
    pub(crate) fn objects(&self) -> Result<u64> {
        let mut n = 0;
        for i in 0..self.map.shards.len() {
            n += self
                .shard(i)
                .map
                .walk(self.epoch)
                .ok_or_else(superseded)?
                .count;
        }
        Ok(n)
    }

    /// The segments not mounted at the cut that objects then named, by
    /// id; only looked for when the cut's `Spec::mounted` says some may.
    pub(crate) fn detached(&self) -> Result<Vec<Arc<Segment>>> {
        let mut found = Vec::new();
        for i in 0..self.map.shards.len() {
            let mut from = 0;
            while from != u32::MAX {
                let mut s = self.shard(i);
                if s.map
                    .walk(self.epoch)
                    .is_some_and(|w| w.spec.mounted.is_none())
                {
                    return Ok(Vec::new());
                }
                from = s
                    .map
                    .walk_note(self.epoch, from, SLICE * 8, &mut found)
                    .ok_or_else(superseded)?;
                MutexGuard::unlock_fair(s);
            }
        }
        found.sort_by_key(|s| s.id);
        found.dedup_by_key(|s| s.id);
        Ok(found)
    }

    /// Appends every object of the cut to `out` in the snapshot's form,
    /// handing `out` to `flush` whenever it holds more than `chunk` bytes
    /// (`flush` empties it); returns how many it wrote. Shard by shard,
    /// a few slots per hold of its lock; whenever it flushes, it takes the
    /// records writers saved in every shard, so those stay few.
    pub(crate) fn write(
        &self,
        out: &mut Vec<u8>,
        chunk: usize,
        flush: &mut dyn FnMut(&mut Vec<u8>) -> Result<()>,
    ) -> Result<u64> {
        let mut written = 0;
        let shards = self.map.shards.len();
        for i in 0..shards {
            loop {
                let mut s = self.shard(i);
                let (n, done) = s
                    .map
                    .walk_on(self.epoch, SLICE, out)
                    .ok_or_else(superseded)?;
                MutexGuard::unlock_fair(s);
                written += n;
                if out.len() >= chunk {
                    flush(out)?;
                    for j in i + 1..shards {
                        let mut s = self.shard(j);
                        written += s.map.walk_on(self.epoch, 0, out).ok_or_else(superseded)?.0;
                    }
                }
                if done {
                    break;
                }
            }
        }
        Ok(written)
    }
}

impl Drop for Round<'_> {
    fn drop(&mut self) {
        for mut s in self.map.shards() {
            s.map.end_walk(self.epoch);
        }
    }
}

impl ObjectMap {
    /// Cuts the map at one moment: waits for the writes under way to end,
    /// then runs `at_cut` while no write can start (it should be quick:
    /// read the log position and the small tables; every mutation logged
    /// up to then is applied and none after is). When it returns `Some`,
    /// with the segments mounted then when an unmounted one may still be
    /// named (`Spec::mounted`), so does this, with the round that writes
    /// the objects at the cut out in `encode`'s form; `None` leaves the
    /// map as it was. A later cut ends the round.
    pub(crate) fn cut<T>(
        &self,
        encode: Encode,
        at_cut: impl FnOnce() -> Option<(T, Option<std::collections::HashSet<u32>>)>,
    ) -> Option<(T, Round<'_>)> {
        let (t, epoch) = {
            let _closed = self.cuts.gate.write();
            let (t, mounted) = at_cut()?;
            *self.cuts.spec.lock() = Some(Arc::new(Spec { encode, mounted }));
            (t, self.cuts.epoch.fetch_add(1, Ordering::AcqRel) + 1)
        };
        // Shards no one has written since the cut hold what they held.
        for mut s in self.shards() {
            let s = &mut *s;
            let _gate = self.cuts.gate.read_recursive();
            self.cuts.join(&mut s.map, &mut s.walked_at);
        }
        Some((t, Round { map: self, epoch }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::super::{ObjectMap, ObjectMeta};

    /// A round's form of an object, for the test: key and size.
    fn encode(out: &mut Vec<u8>, key: &str, o: &ObjectMeta) {
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&o.size.to_le_bytes());
    }

    fn decode(mut b: &[u8]) -> Vec<(String, u64)> {
        let mut all = Vec::new();
        while !b.is_empty() {
            let len = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
            let key = std::str::from_utf8(&b[4..4 + len]).unwrap().to_string();
            let size = u64::from_le_bytes(b[4 + len..12 + len].try_into().unwrap());
            all.push((key, size));
            b = &b[12 + len..];
        }
        all
    }

    /// A log of (seq, key, size or none for a removal), seq assigned in
    /// order under its lock, as the write-ahead log does.
    #[derive(Default)]
    struct Log(Mutex<Vec<(u64, String, Option<u64>)>>);

    impl Log {
        fn append(&self, key: &str, size: Option<u64>) -> u64 {
            let mut l = self.0.lock();
            let seq = l.len() as u64 + 1;
            l.push((seq, key.to_string(), size));
            seq
        }

        fn position(&self) -> u64 {
            self.0.lock().len() as u64
        }
    }

    #[test]
    fn a_cut_sees_exactly_the_writes_logged_before_it() {
        let map = Arc::new(ObjectMap::default());
        let log = Arc::new(Log::default());
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let (map, log, stop) = (map.clone(), log.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        i = i
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let key = format!("k/{}", (i >> 33) % 20_000);
                        let mut shard = map.lock(&key);
                        // Logged and applied under the shard lock, as a
                        // mutation is; some removals, some reads in place,
                        // some sweeps of a whole shard that change a few.
                        if (i >> 28) % 97 == 0 {
                            map.retain(&mut shard, |k, o| {
                                let h = k.len() as u64 + o.size;
                                if h.is_multiple_of(13) {
                                    log.append(k, None);
                                    return false;
                                }
                                if h.is_multiple_of(11) {
                                    o.size += 1;
                                    log.append(k, Some(o.size));
                                }
                                true
                            });
                            continue;
                        }
                        let remove = (i >> 20) % 7 == 0 && shard.contains_key(&key);
                        if (i >> 24) % 5 == 0 {
                            if let Some(mut o) = shard.get_mut(&key) {
                                log.append(&key, Some(i >> 40));
                                o.size = i >> 40;
                            }
                            continue;
                        }
                        map.update(&mut shard, &key, true, |o| {
                            let seq = log.append(&key, (!remove).then_some(i >> 40));
                            o.size = i >> 40;
                            o.lease_until = seq;
                            !remove
                        });
                    }
                })
            })
            .collect();
        // Each round is written out while the writers go on, a few bytes
        // at a time, so it meets writes to objects it has yet to reach.
        let mut views = Vec::new();
        for _ in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(60));
            let (at, round) = map.cut(encode, || Some((log.position(), None))).unwrap();
            let n = round.objects().unwrap();
            let (mut out, mut all) = (Vec::new(), Vec::new());
            let written = round
                .write(&mut out, 256, &mut |o| {
                    all.append(o);
                    Ok(())
                })
                .unwrap();
            all.append(&mut out);
            let objects = decode(&all);
            assert_eq!((written, objects.len() as u64), (n, n), "cut at {at}");
            views.push((at, objects));
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        let log = log.0.lock();
        for (at, objects) in views {
            assert!(
                at > 0 && at < log.len() as u64,
                "writes on both sides of the cut"
            );
            let mut want: HashMap<&str, u64> = HashMap::new();
            for (_, key, size) in &log[..at as usize] {
                match size {
                    Some(s) => want.insert(key, *s),
                    None => want.remove(key.as_str()),
                };
            }
            let got: HashMap<&str, u64> = objects.iter().map(|(k, s)| (k.as_str(), *s)).collect();
            assert_eq!(got.len(), objects.len(), "each object once, cut at {at}");
            assert_eq!(got.len(), want.len(), "cut at {at}");
            assert!(
                got == want,
                "cut at {at}: the view differs from the log up to it"
            );
        }
    }

    #[test]
    fn a_round_lists_the_unmounted_segments_its_cut_names() {
        use super::super::super::segments::{Placement, SegmentTable};
        use super::super::Replicas;
        use crate::master::state::service::tests::segment;
        let segs = SegmentTable::default();
        let a = segs.mount(1, &segment("a")).unwrap().unwrap();
        let b = segs.mount(1, &segment("b")).unwrap().unwrap();
        let map = ObjectMap::default();
        let place = |key: &str, seg: &Arc<super::super::super::segments::Segment>| {
            let mut shard = map.lock(key);
            map.update(&mut shard, key, true, |o| {
                o.replicas = Replicas::One(Placement {
                    segment: seg.clone(),
                    offset: 0,
                });
                true
            });
        };
        for i in 0..3000 {
            place(&format!("k/{i}"), &a);
        }
        // `b` is not mounted at these cuts.
        let detached = |map: &ObjectMap, after: &dyn Fn()| {
            let mounted = Some([a.id].into_iter().collect());
            let (_, round) = map.cut(encode, || Some(((), mounted))).unwrap();
            after();
            let found = round.detached().unwrap();
            found.iter().map(|s| s.id).collect::<Vec<_>>()
        };
        assert!(
            detached(&map, &|| place("k/7", &b)).is_empty(),
            "not at the cut"
        );
        place("k/7", &a);
        // Named at the cut and changed before the round looks: saved.
        place("k/2500", &b);
        assert_eq!(detached(&map, &|| place("k/2500", &a)), [b.id]);
        // Named at the cut and unchanged: found in the table.
        place("k/2900", &b);
        assert_eq!(detached(&map, &|| ()), [b.id]);
        // Not looked for when the cut says no object can name one.
        let (_, round) = map.cut(encode, || Some(((), None))).unwrap();
        assert!(round.detached().unwrap().is_empty());
    }
}
