//! One shard's key → object table, laid out for 10^8 objects.
//!
//! Records (key and metadata) live in fixed-size chunks that are never
//! moved or reallocated, so the table grows by one chunk at a time rather
//! than doubling; the hash index holds only a 4-byte slot number per
//! bucket, so when it doubles it moves 5 bytes per object instead of the
//! whole record. Keys up to [`INLINE`] bytes are stored in the record
//! itself: no allocation per key.
//!
//! A snapshot round walks the live table (`walk`): a write to a record
//! the round has not written out yet saves that record's encoded form
//! first, so the round sees the table as it stood at its cut without a
//! copy of it.

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

use super::super::segments::Segment;
use super::walk::{Spec, Walk};
use super::ObjectMeta;

/// Records per chunk: a chunk is ~90 KB.
const CHUNK: usize = 1024;

/// Longest key stored inline.
pub(crate) const INLINE: usize = 22;

/// A key: inline up to [`INLINE`] bytes, else boxed. 24 bytes.
#[derive(Debug, Clone)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl Key {
    fn new(s: &str) -> Key {
        if s.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            Key::Inline {
                len: s.len() as u8,
                bytes,
            }
        } else {
            Key::Heap(s.into())
        }
    }

    fn as_str(&self) -> &str {
        match self {
            Key::Inline { len, bytes } => {
                // SAFETY: `bytes[..len]` was copied whole from a `&str` in
                // `Key::new` and never changed since.
                unsafe { std::str::from_utf8_unchecked(&bytes[..*len as usize]) }
            }
            Key::Heap(s) => s,
        }
    }
}

#[derive(Debug, Clone)]
struct Record {
    key: Key,
    obj: ObjectMeta,
}

/// `CHUNK` record slots.
type Chunk = Box<[Option<Record>]>;

/// Key → object, chunked records behind a slot index.
pub(crate) struct Table {
    index: HashTable<u32>,
    chunks: Vec<Chunk>,
    /// Slots emptied by removals, reused first.
    free: Vec<u32>,
    hasher: std::collections::hash_map::RandomState,
    /// The snapshot round under way over this table, if any.
    walk: Option<Box<Walk>>,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            index: HashTable::new(),
            chunks: Vec::new(),
            free: Vec::new(),
            hasher: Default::default(),
            walk: None,
        }
    }
}

fn split(slot: u32) -> (usize, usize) {
    (slot as usize / CHUNK, slot as usize % CHUNK)
}

impl Table {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    fn record(&self, slot: u32) -> &Record {
        let (c, i) = split(slot);
        self.chunks[c][i].as_ref().expect("indexed slots are full")
    }

    fn record_mut(&mut self, slot: u32) -> &mut Record {
        self.save(slot);
        let (c, i) = split(slot);
        self.chunks[c][i].as_mut().expect("indexed slots are full")
    }

    /// Before slot `slot` changes: saves its record for the round under
    /// way when the round still has to write it out.
    fn save(&mut self, slot: u32) {
        let Some(w) = self.walk.as_deref_mut().filter(|w| w.pending(slot)) else {
            return;
        };
        let (c, i) = split(slot);
        match &self.chunks[c][i] {
            Some(r) => w.save(slot, r.key.as_str(), &r.obj),
            // Empty at the cut: what is put there now is not the round's.
            None => w.settle(slot),
        }
    }

    /// Starts round `epoch`'s walk over the table as it stands (the cut).
    pub(crate) fn begin_walk(&mut self, epoch: u64, spec: Arc<Spec>) {
        let end = u32::try_from(self.chunks.len() * CHUNK).expect("fewer than 2^32 slots");
        let count = self.index.len() as u64;
        self.walk = Some(Box::new(Walk::new(epoch, spec, end, count)));
    }

    /// Round `epoch`'s walk, when this table is on it.
    pub(crate) fn walk(&self, epoch: u64) -> Option<&Walk> {
        self.walk.as_deref().filter(|w| w.epoch == epoch)
    }

    /// Leaves round `epoch` (dropped before it was done).
    pub(crate) fn end_walk(&mut self, epoch: u64) {
        if self.walk(epoch).is_some() {
            self.walk = None;
        }
    }

    /// Writes the next `n` slots of round `epoch`'s walk to `out`, and the
    /// records writers saved so far; the walk ends once it has written
    /// every slot (with `n` > 0: `n` = 0 only takes the saved records). How many objects it wrote and whether it is done, or
    /// `None` when the table is not on that round.
    pub(crate) fn walk_on(&mut self, epoch: u64, n: u32, out: &mut Vec<u8>) -> Option<(u64, bool)> {
        let Table { chunks, walk, .. } = self;
        let w = walk.as_deref_mut().filter(|w| w.epoch == epoch)?;
        let to = w.end.min(w.next.saturating_add(n));
        let mut written = 0;
        for slot in w.next..to {
            let (c, i) = split(slot);
            match &chunks[c][i] {
                Some(r) if w.pending(slot) => {
                    (w.spec.encode)(out, r.key.as_str(), &r.obj);
                    written += 1;
                }
                _ => {}
            }
        }
        w.next = to;
        out.extend_from_slice(&std::mem::take(&mut w.saved));
        written += std::mem::take(&mut w.saved_n);
        let done = w.next == w.end;
        if done && n > 0 {
            *walk = None;
        }
        Some((written, done))
    }

    /// Adds to `found` the segments not mounted at round `epoch`'s cut
    /// that the cut's records in slots `from..from + n` name; once past
    /// the last slot, also those of the records saved so far. Where to go
    /// on from (`u32::MAX`: done), or `None` when the table is not on that
    /// round.
    pub(crate) fn walk_note(
        &mut self,
        epoch: u64,
        from: u32,
        n: u32,
        found: &mut Vec<Arc<Segment>>,
    ) -> Option<u32> {
        let Table { chunks, walk, .. } = self;
        let w = walk.as_deref_mut().filter(|w| w.epoch == epoch)?;
        let to = w.end.min(from.saturating_add(n));
        for slot in from.max(w.next)..to {
            let (c, i) = split(slot);
            match &chunks[c][i] {
                Some(r) if w.pending(slot) => w.spec.note(&r.obj, found),
                _ => {}
            }
        }
        if to < w.end {
            return Some(to);
        }
        found.append(&mut w.detached);
        Some(u32::MAX)
    }

    fn slot_of(&self, key: &str) -> Option<u32> {
        self.slot_at(self.hash(key), key)
    }

    fn slot_at(&self, hash: u64, key: &str) -> Option<u32> {
        let chunks = &self.chunks;
        self.index
            .find(hash, |&s| {
                let (c, i) = split(s);
                chunks[c][i].as_ref().is_some_and(|r| r.key.as_str() == key)
            })
            .copied()
    }

    pub(crate) fn get(&self, key: &str) -> Option<&ObjectMeta> {
        self.slot_of(key).map(|s| &self.record(s).obj)
    }

    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut ObjectMeta> {
        let s = self.slot_of(key)?;
        Some(&mut self.record_mut(s).obj)
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.slot_of(key).is_some()
    }

    /// `key`'s object, made with `make` when absent; true when made.
    pub(crate) fn get_or_insert_with(
        &mut self,
        key: &str,
        make: impl FnOnce() -> ObjectMeta,
    ) -> (&mut ObjectMeta, bool) {
        let hash = self.hash(key);
        match self.slot_at(hash, key) {
            Some(s) => (&mut self.record_mut(s).obj, false),
            None => {
                let s = self.insert_new(hash, key, make());
                (&mut self.record_mut(s).obj, true)
            }
        }
    }

    /// Adds `obj` under `key` unless the key is present; true when added.
    pub(crate) fn insert_if_absent(&mut self, key: &str, obj: ObjectMeta) -> bool {
        let hash = self.hash(key);
        if self.slot_at(hash, key).is_some() {
            return false;
        }
        self.insert_new(hash, key, obj);
        true
    }

    /// Makes room in the index for `n` more objects (a restore that knows
    /// how many come), so it does not grow step by step.
    pub(crate) fn reserve(&mut self, n: usize) {
        let (chunks, hasher) = (&self.chunks, &self.hasher);
        self.index.reserve(n, |&s| {
            let (c, i) = split(s);
            hasher.hash_one(chunks[c][i].as_ref().expect("full").key.as_str())
        });
    }

    /// Adds a record for `key`, absent, whose hash is `hash`.
    fn insert_new(&mut self, hash: u64, key: &str, obj: ObjectMeta) -> u32 {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let n = self.chunks.len() * CHUNK;
                let s = u32::try_from(n).expect("fewer than 2^32 objects per shard");
                self.chunks
                    .push(std::iter::repeat_with(|| None).take(CHUNK).collect());
                self.free.extend((s + 1..s + CHUNK as u32).rev());
                s
            }
        };
        self.save(slot);
        let (c, i) = split(slot);
        self.chunks[c][i] = Some(Record {
            key: Key::new(key),
            obj,
        });
        let (chunks, hasher) = (&self.chunks, &self.hasher);
        self.index.insert_unique(hash, slot, |&s| {
            let (c, i) = split(s);
            hasher.hash_one(chunks[c][i].as_ref().expect("full").key.as_str())
        });
        slot
    }

    /// Removes `key`'s object.
    pub(crate) fn remove(&mut self, key: &str) -> Option<ObjectMeta> {
        let hash = self.hash(key);
        let chunks = &self.chunks;
        let entry = self
            .index
            .find_entry(hash, |&s| {
                let (c, i) = split(s);
                chunks[c][i].as_ref().is_some_and(|r| r.key.as_str() == key)
            })
            .ok()?;
        let (slot, _) = entry.remove();
        Some(self.vacate(slot).obj)
    }

    fn vacate(&mut self, slot: u32) -> Record {
        self.save(slot);
        let (c, i) = split(slot);
        let r = self.chunks[c][i].take().expect("indexed slots are full");
        self.free.push(slot);
        r
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &ObjectMeta)> {
        self.chunks
            .iter()
            .flat_map(|c| c.iter())
            .flatten()
            .map(|r| (r.key.as_str(), &r.obj))
    }

    #[cfg(test)]
    pub(crate) fn values(&self) -> impl Iterator<Item = &ObjectMeta> {
        self.iter().map(|(_, o)| o)
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut ObjectMeta> {
        // Every record may change: the round's are saved first.
        if let Some((from, to)) = self.walk.as_ref().map(|w| (w.next, w.end)) {
            for slot in from..to {
                self.save(slot);
            }
        }
        self.chunks
            .iter_mut()
            .flat_map(|c| c.iter_mut())
            .flatten()
            .map(|r| &mut r.obj)
    }

    /// Keeps the objects `keep` accepts.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str, &mut ObjectMeta) -> bool) {
        let mut gone = Vec::new();
        let Table { chunks, walk, .. } = self;
        for (c, chunk) in chunks.iter_mut().enumerate() {
            for (i, r) in chunk.iter_mut().enumerate() {
                let Some(r) = r else { continue };
                let slot = (c * CHUNK + i) as u32;
                // Most records a sweep visits stay as they are: saved only
                // when they change.
                let w = walk.as_deref_mut().filter(|w| w.pending(slot));
                let at = w.map(|w| w.save_maybe(r.key.as_str(), &r.obj));
                let kept = keep(r.key.as_str(), &mut r.obj);
                if let (Some(w), Some(at)) = (walk.as_deref_mut(), at) {
                    w.kept(slot, at, r.key.as_str(), kept.then_some(&r.obj));
                }
                if !kept {
                    gone.push(slot);
                }
            }
        }
        for slot in gone {
            let hash = self.hash(self.record(slot).key.as_str());
            if let Ok(e) = self.index.find_entry(hash, |&s| s == slot) {
                e.remove();
            }
            self.vacate(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_compact() {
        assert_eq!(std::mem::size_of::<Key>(), 24);
    }

    #[test]
    fn inserts_finds_removes_and_reuses_slots() {
        let mut t = Table::default();
        let long = "k".repeat(INLINE + 5);
        let keys: Vec<String> = (0..3000)
            .map(|i| format!("key/{i}"))
            .chain([long.clone(), "x".repeat(INLINE)])
            .collect();
        for k in &keys {
            assert!(t.insert_if_absent(k, ObjectMeta::absent()));
            assert!(!t.insert_if_absent(k, ObjectMeta::absent()));
        }
        assert_eq!(t.len(), keys.len());
        assert!(t.contains_key(&long) && t.get(&"x".repeat(INLINE)).is_some());
        t.get_mut("key/7").unwrap().size = 7;
        assert_eq!(t.get("key/7").unwrap().size, 7);
        assert!(t.remove("key/7").is_some() && t.remove("key/7").is_none());
        t.retain(|k, _| !k.ends_with('3'));
        let left: Vec<&str> = t.iter().map(|(k, _)| k).collect();
        assert_eq!(left.len(), t.len());
        assert!(left.iter().all(|k| !k.ends_with('3') && *k != "key/7"));
        assert!(t.get("key/13").is_none() && t.get("key/12").is_some());
        let chunks = t.chunks.len();
        let (o, made) = t.get_or_insert_with("key/13", ObjectMeta::absent);
        o.size = 13;
        assert!(made);
        assert_eq!(t.chunks.len(), chunks, "a freed slot is reused");
        assert_eq!(t.get("key/13").unwrap().size, 13);
        assert_eq!(t.values_mut().count(), t.len());
    }

    fn encode(out: &mut Vec<u8>, key: &str, o: &ObjectMeta) {
        out.push(key.len() as u8);
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&o.size.to_le_bytes());
    }

    fn decode(mut b: &[u8]) -> Vec<(String, u64)> {
        let mut all = Vec::new();
        while let Some(&len) = b.first() {
            let len = len as usize;
            let key = std::str::from_utf8(&b[1..1 + len]).unwrap().into();
            all.push((
                key,
                u64::from_le_bytes(b[1 + len..9 + len].try_into().unwrap()),
            ));
            b = &b[9 + len..];
        }
        all.sort();
        all
    }

    /// Everything `walk_on` writes, `n` slots at a time, with `between`
    /// run after each step.
    fn walk_all(t: &mut Table, n: u32, mut between: impl FnMut(&mut Table)) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let (_, done) = t.walk_on(1, n, &mut out).expect("on the walk");
            if done {
                return out;
            }
            between(t);
        }
    }

    #[test]
    fn a_walk_writes_the_records_at_its_cut_and_saves_only_changed_ones() {
        let mut t = Table::default();
        for i in 0..5 * CHUNK {
            let (o, _) = t.get_or_insert_with(&format!("key/{i}"), ObjectMeta::absent);
            o.size = i as u64;
        }
        t.remove("key/4");
        let mut before: Vec<(String, u64)> = t.iter().map(|(k, o)| (k.into(), o.size)).collect();
        before.sort();
        let spec = Arc::new(Spec {
            encode,
            mounted: None,
        });
        t.begin_walk(1, spec.clone());
        assert_eq!(t.walk(1).unwrap().count, before.len() as u64);
        assert!(t.walk(2).is_none());
        // A sweep that changes nothing saves nothing.
        t.retain(|_, _| true);
        assert_eq!(t.walk(1).unwrap().saved_n, 0);
        // Writes to records, a removal, an insert into the freed slot and
        // one into a new chunk, a sweep that changes and removes some:
        // the walk still writes the records at the cut.
        for k in ["key/3", "key/2000", "key/5000"] {
            t.get_mut(k).unwrap().size += 1_000_000;
        }
        assert_eq!(t.walk(1).unwrap().saved_n, 3, "one record each");
        t.remove("key/7");
        t.insert_if_absent("new", ObjectMeta::absent());
        for i in 5 * CHUNK..6 * CHUNK + 1 {
            t.insert_if_absent(&format!("key/{i}"), ObjectMeta::absent());
        }
        t.retain(|k, o| {
            if k.ends_with("11") {
                o.size += 1;
            }
            !k.ends_with("99")
        });
        let mut step = 0;
        let out = walk_all(&mut t, 300, |t| {
            // While it walks: records behind it and ahead of it change.
            step += 1;
            let k = format!("key/{}", (step * 977) % (5 * CHUNK));
            if let Some(o) = t.get_mut(&k) {
                o.size += 7;
            }
            t.remove(&format!("key/{}", (step * 613) % (5 * CHUNK)));
            t.insert_if_absent(&format!("later/{step}"), ObjectMeta::absent());
            for o in t.values_mut().take(3) {
                o.size += 1;
            }
        });
        assert_eq!(decode(&out), before);
        assert!(t.walk(1).is_none(), "done: the walk ends");
        assert!(t.get("key/3").unwrap().size >= 1_000_000);
        assert!(t.get("key/7").is_none() && t.get("key/199").is_none());

        // A walk dropped before its end saves nothing more.
        t.begin_walk(1, spec);
        t.end_walk(2);
        assert!(t.walk(1).is_some(), "another round's end leaves it");
        t.end_walk(1);
        t.get_mut("key/3").unwrap().size = 1;
        assert!(t.walk(1).is_none());
    }
}
