//! One shard's key → object table, laid out for 10^8 objects.
//!
//! Records (key and metadata) live in fixed-size chunks that are never
//! moved or reallocated, so the table grows by one chunk at a time rather
//! than doubling; the hash index holds only a 4-byte slot number per
//! bucket, so when it doubles it moves 5 bytes per object instead of the
//! whole record. Keys up to [`INLINE`] bytes are stored in the record
//! itself: no allocation per key.
//!
//! Chunks are shared copy-on-write (`Arc`): [`Table::freeze`] hands out
//! the chunks as they stand, in O(chunks), and a later write to a chunk
//! still shared copies that one chunk first. A consistent view of the
//! table for a snapshot costs the chunks written while it is held, not a
//! second copy of the table.

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

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

/// `CHUNK` record slots, shared with frozen views until written.
type Chunk = Arc<[Option<Record>]>;

/// The chunk, copied first when a frozen view still holds it.
fn own(chunk: &mut Chunk) -> &mut [Option<Record>] {
    if Arc::get_mut(chunk).is_none() {
        *chunk = chunk.iter().cloned().collect();
    }
    Arc::get_mut(chunk).expect("just copied")
}

/// A table's records as they stood when it was frozen, in slot order.
#[derive(Default, Clone)]
pub(crate) struct Frozen(Vec<Chunk>);

impl Frozen {
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &ObjectMeta)> {
        self.0
            .iter()
            .flat_map(|c| c.iter())
            .flatten()
            .map(|r| (r.key.as_str(), &r.obj))
    }

    /// Visits every record, letting go of each chunk once visited: a write
    /// to the table after that no longer copies it, and a chunk the table
    /// copied is freed.
    pub(crate) fn drain(self, mut each: impl FnMut(&str, &ObjectMeta)) {
        for chunk in self.0 {
            for r in chunk.iter().flatten() {
                each(r.key.as_str(), &r.obj);
            }
        }
    }

    /// How many of its chunks the table has copied since (written while
    /// frozen) and how many chunks it holds.
    #[cfg(test)]
    pub(crate) fn copied(&self, table: &Table) -> (usize, usize) {
        let moved = self
            .0
            .iter()
            .zip(&table.chunks)
            .filter(|(a, b)| !Arc::ptr_eq(a, b))
            .count();
        (moved, self.0.len())
    }
}

/// Key → object, chunked records behind a slot index.
pub(crate) struct Table {
    index: HashTable<u32>,
    chunks: Vec<Chunk>,
    /// Slots emptied by removals, reused first.
    free: Vec<u32>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            index: HashTable::new(),
            chunks: Vec::new(),
            free: Vec::new(),
            hasher: Default::default(),
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
        let (c, i) = split(slot);
        own(&mut self.chunks[c])[i]
            .as_mut()
            .expect("indexed slots are full")
    }

    /// The records as they stand now; writes after this copy the chunks
    /// they touch rather than change what the view shows.
    pub(crate) fn freeze(&self) -> Frozen {
        Frozen(self.chunks.clone())
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
        let (c, i) = split(slot);
        own(&mut self.chunks[c])[i] = Some(Record {
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
        let (c, i) = split(slot);
        let r = own(&mut self.chunks[c])[i]
            .take()
            .expect("indexed slots are full");
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
        self.chunks
            .iter_mut()
            .flat_map(|c| own(c).iter_mut())
            .flatten()
            .map(|r| &mut r.obj)
    }

    /// Keeps the objects `keep` accepts.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str, &mut ObjectMeta) -> bool) {
        let mut gone = Vec::new();
        for (c, chunk) in self.chunks.iter_mut().enumerate() {
            for (i, r) in own(chunk).iter_mut().enumerate() {
                if let Some(r) = r {
                    if !keep(r.key.as_str(), &mut r.obj) {
                        gone.push((c * CHUNK + i) as u32);
                    }
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

    #[test]
    fn a_frozen_view_keeps_its_records_and_copies_only_written_chunks() {
        let mut t = Table::default();
        for i in 0..5 * CHUNK {
            let (o, _) = t.get_or_insert_with(&format!("key/{i}"), ObjectMeta::absent);
            o.size = i as u64;
        }
        let before: Vec<(String, u64)> = t.iter().map(|(k, o)| (k.into(), o.size)).collect();
        let view = t.freeze();
        assert_eq!(view.copied(&t), (0, 5));
        // Writes to records of one chunk, a removal, an insert and a
        // new chunk: the view still shows the records at the freeze.
        let slot = t.slot_of("key/3").unwrap();
        let (c, _) = split(slot);
        let same: Vec<String> = (0..5 * CHUNK)
            .map(|i| format!("key/{i}"))
            .filter(|k| split(t.slot_of(k).unwrap()).0 == c)
            .take(3)
            .collect();
        for k in &same {
            t.get_mut(k).unwrap().size += 1_000_000;
        }
        assert_eq!(view.copied(&t), (1, 5), "one chunk written, one copied");
        t.remove(&same[0]);
        t.insert_if_absent("new", ObjectMeta::absent());
        for i in 5 * CHUNK..6 * CHUNK + 1 {
            t.insert_if_absent(&format!("key/{i}"), ObjectMeta::absent());
        }
        let seen: Vec<(String, u64)> = view.iter().map(|(k, o)| (k.into(), o.size)).collect();
        assert_eq!(seen, before);
        assert!(t.get(&same[1]).unwrap().size >= 1_000_000);
        assert!(t.get(&same[0]).is_none());
        drop(view);
        // Unshared again: a write copies nothing.
        let p = Arc::as_ptr(&t.chunks[c]);
        t.get_mut(&same[1]).unwrap().size = 1;
        assert_eq!(Arc::as_ptr(&t.chunks[c]), p);
    }
}
