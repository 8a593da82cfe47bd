//! The index's eviction order and accounting, against a plain model of
//! an LRU (or FIFO) cache of objects.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap as Map;

fn unit(dir: &std::path::Path, id: UnitId, keys: &[&str], bytes: u64) -> NewUnit {
    let data = dir.join(format!("u{id}"));
    std::fs::write(&data, b"x").unwrap();
    NewUnit {
        id,
        data,
        meta: None,
        bytes,
        objects: keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                (
                    k.to_string(),
                    ObjectLocation {
                        unit: id,
                        offset: i as u64 * 10,
                        len: 10,
                        crc: 0,
                        tag: id,
                    },
                )
            })
            .collect(),
    }
}

fn evict_order(policy: EvictionPolicy, touches: &[(&str, u64)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(policy, 300, 1000, true);
    ix.insert(unit(dir.path(), 1, &["a"], 100), 1);
    ix.insert(unit(dir.path(), 2, &["b"], 100), 2);
    ix.insert(unit(dir.path(), 3, &["c"], 100), 3);
    for (k, t) in touches {
        ix.lookup(k, *t).unwrap();
    }
    let mut order = Vec::new();
    for round in 0..3u64 {
        let b = ix.admit(100, 1).unwrap();
        order.extend(b.keys.iter().cloned());
        ix.finalize(b);
        // The write that needed the room lands as a newer unit.
        ix.release(100, 1);
        ix.insert(
            unit(dir.path(), 10 + round, &[&format!("new{round}")], 100),
            50 + round,
        );
    }
    order
}

#[test]
fn fifo_evicts_oldest_first_whatever_was_read() {
    assert_eq!(
        evict_order(EvictionPolicy::Fifo, &[("a", 10)]),
        ["a", "b", "c"]
    );
}

#[test]
fn lru_evicts_least_recently_read_first() {
    assert_eq!(
        evict_order(EvictionPolicy::Lru, &[("a", 10), ("c", 11), ("b", 12)]),
        ["a", "c", "b"]
    );
    assert_eq!(
        evict_order(EvictionPolicy::Lru, &[("a", 10)]),
        ["b", "c", "a"]
    );
}

#[test]
fn none_refuses_instead_of_evicting() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(EvictionPolicy::None, 200, 1000, true);
    ix.insert(unit(dir.path(), 1, &["a"], 150), 0);
    assert!(matches!(ix.admit(100, 1), Err(TierError::Full(_))));
    assert!(ix.location("a").is_some());
    let b = ix.admit(50, 1).unwrap();
    assert!(b.is_empty());
    ix.finalize(b);
    assert_eq!(ix.usage().reserved_bytes, 50);
    // The key limit holds too.
    let mut ix = TierIndex::new(EvictionPolicy::None, 1 << 30, 1, true);
    ix.insert(unit(dir.path(), 2, &["b"], 1), 0);
    assert!(matches!(ix.admit(1, 1), Err(TierError::Full(_))));
}

#[test]
fn a_write_too_big_for_the_tier_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(EvictionPolicy::Fifo, 200, 1000, true);
    ix.insert(unit(dir.path(), 1, &["a"], 100), 0);
    assert!(matches!(ix.admit(500, 1), Err(TierError::Full(_))));
    assert!(ix.location("a").is_some());
    assert_eq!(ix.usage().bytes, 100);
}

#[test]
fn a_file_is_deleted_only_after_its_last_reader_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(EvictionPolicy::Fifo, 100, 1000, true);
    ix.insert(unit(dir.path(), 1, &["a", "b"], 100), 0);
    let path = dir.path().join("u1");
    let (_, reader) = ix.lookup("a", 1).unwrap();
    let batch = ix.admit(100, 1).unwrap();
    assert_eq!(batch.keys, ["a", "b"]);
    // Phase 1: the index no longer hands the objects out.
    assert!(ix.lookup("a", 2).is_none());
    assert!(path.exists());
    ix.finalize(batch);
    // Phase 2 waits for the reader.
    assert!(path.exists());
    assert_eq!(ix.usage().doomed_bytes, 100);
    drop(reader);
    assert!(!path.exists());
    assert_eq!(ix.usage().doomed_bytes, 0);
}

#[test]
fn restore_undoes_phase_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(EvictionPolicy::Fifo, 100, 1000, true);
    ix.insert(unit(dir.path(), 1, &["a"], 100), 0);
    let batch = ix.admit(100, 1).unwrap();
    ix.release(100, 1);
    assert!(ix.location("a").is_none());
    ix.restore(batch);
    assert!(ix.location("a").is_some());
    assert_eq!(ix.usage().bytes, 100);
    assert!(dir.path().join("u1").exists());
}

#[test]
fn replaced_and_removed_objects_free_their_units() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(EvictionPolicy::Fifo, 1000, 1000, true);
    ix.insert(unit(dir.path(), 1, &["a", "b"], 100), 0);
    ix.insert(unit(dir.path(), 2, &["a"], 100), 0);
    assert_eq!(ix.location("a").unwrap().unit, 2);
    assert!(dir.path().join("u1").exists(), "b still lives in unit 1");
    assert_eq!(ix.remove(&["b".to_string(), "zz".to_string()]), 1);
    assert!(!dir.path().join("u1").exists());
    assert_eq!(ix.usage().bytes, 100);
    // Duplicates inside one unit: the later entry wins.
    ix.insert(unit(dir.path(), 3, &["d", "d"], 100), 0);
    assert_eq!(ix.location("d").unwrap().offset, 10);
    assert_eq!(ix.usage().keys, 2);
}

#[test]
fn proactive_eviction_frees_what_it_is_asked_in_policy_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(EvictionPolicy::Fifo, 1000, 1000, true);
    for id in 1..=10 {
        ix.insert(unit(dir.path(), id, &[&format!("k{id}")], 95), id);
    }
    assert!(ix.evict_bytes(0).is_empty());
    let b = ix.evict_bytes(400);
    assert_eq!(b.keys, ["k1", "k2", "k3", "k4", "k5"]);
    ix.finalize(b);
    assert_eq!(ix.usage().bytes, 475);
    let b = ix.evict_bytes(10_000);
    assert_eq!(b.keys.len(), 5, "everything, and no more");
    ix.finalize(b);
    assert_eq!(ix.usage().bytes, 0);

    let mut none = TierIndex::new(EvictionPolicy::None, 1000, 1000, true);
    none.insert(unit(dir.path(), 11, &["n"], 95), 1);
    assert!(none.evict_bytes(95).is_empty());
}

const B: u64 = 4096;

/// A bucket of `keys`, one block each, back to back, with a real data file
/// (hole punching needs one).
fn bucket(dir: &std::path::Path, id: UnitId, keys: &[String], blocks_each: u64) -> NewUnit {
    let data = dir.join(format!("b{id}"));
    let f = std::fs::File::create(&data).unwrap();
    std::io::Write::write_all(
        &mut &f,
        &vec![1u8; (keys.len() as u64 * blocks_each * B) as usize],
    )
    .unwrap();
    NewUnit {
        id,
        data,
        meta: None,
        bytes: keys.len() as u64 * blocks_each * B,
        objects: keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                (
                    k.clone(),
                    ObjectLocation {
                        unit: id,
                        offset: i as u64 * blocks_each * B,
                        len: blocks_each * B,
                        crc: 0,
                        tag: 0,
                    },
                )
            })
            .collect(),
    }
}

fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn hole_at(path: &std::path::Path, offset: u64, len: u64) -> bool {
    let f = std::fs::File::open(path).unwrap();
    crate::io::holes::has_hole(std::os::fd::AsRawFd::as_raw_fd(&f), offset, len)
}

#[test]
fn lru_evicts_single_objects_out_of_a_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let punch = crate::io::holes::supports_punch(dir.path());
    let mut ix = TierIndex::new(EvictionPolicy::Lru, 8 * B, 1000, punch);
    ix.insert(bucket(dir.path(), 1, &keys(&["a", "b", "c", "d"]), 2), 1);
    drop(ix.lookup("a", 5));
    drop(ix.lookup("c", 6));
    let batch = ix.admit(2 * B, 1).unwrap();
    if !punch {
        // Whole units only: the bucket goes.
        assert_eq!(batch.keys.len(), 4);
        ix.finalize(batch);
        return;
    }
    assert_eq!(batch.keys, ["b"]);
    assert_eq!(batch.bytes(), 2 * B);
    assert_eq!(ix.usage().bytes, 6 * B);
    ix.finalize(batch);
    let data = dir.path().join("b1");
    assert!(hole_at(&data, 2 * B, 2 * B), "b's blocks are freed");
    assert!(!hole_at(&data, 0, 2 * B), "a's are not");
    ix.release(2 * B, 1);
    // The next victim is the next least recently used object, d.
    let batch = ix.admit(4 * B, 1).unwrap();
    assert_eq!(batch.keys, ["d"]);
    ix.finalize(batch);
    assert!(ix.location("a").is_some() && ix.location("c").is_some());
}

#[test]
fn an_evicted_objects_blocks_wait_for_the_readers_of_its_bucket() {
    let dir = tempfile::tempdir().unwrap();
    if !crate::io::holes::supports_punch(dir.path()) {
        return;
    }
    let mut ix = TierIndex::new(EvictionPolicy::Fifo, 2 * B, 1000, true);
    ix.insert(bucket(dir.path(), 1, &keys(&["a", "b"]), 1), 1);
    let (_, reader) = ix.lookup("a", 2).unwrap();
    let batch = ix.admit(B, 1).unwrap();
    assert_eq!(batch.keys, ["a"]);
    ix.finalize(batch);
    let data = dir.path().join("b1");
    assert!(!hole_at(&data, 0, B), "a reader still holds the bucket");
    assert_eq!(ix.usage().doomed_bytes, B);
    drop(reader);
    assert!(hole_at(&data, 0, B));
    assert_eq!(ix.usage().doomed_bytes, 0);
}

#[test]
fn restore_puts_a_punched_object_back_unpunched() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(EvictionPolicy::Fifo, 2 * B, 1000, true);
    ix.insert(bucket(dir.path(), 1, &keys(&["a", "b"]), 1), 1);
    let batch = ix.admit(B, 1).unwrap();
    ix.release(B, 1);
    ix.restore(batch);
    assert!(ix.location("a").is_some());
    assert_eq!(ix.usage().bytes, 2 * B);
    assert!(!hole_at(&dir.path().join("b1"), 0, 2 * B));
    // And it is still the first to go.
    let batch = ix.admit(B, 1).unwrap();
    assert_eq!(batch.keys, ["a"]);
    ix.finalize(batch);
}

#[test]
fn removed_objects_give_their_blocks_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(EvictionPolicy::Lru, 100 * B, 1000, true);
    ix.insert(bucket(dir.path(), 1, &keys(&["a", "b", "c"]), 1), 1);
    assert_eq!(ix.remove(&keys(&["b"])), 1);
    assert_eq!(ix.usage().bytes, 2 * B);
    ix.insert(bucket(dir.path(), 2, &keys(&["a"]), 1), 2);
    assert_eq!(ix.usage().bytes, 2 * B, "a's old copy is freed too");
}

#[test]
fn an_idle_object_written_late_ranks_by_its_idle_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(EvictionPolicy::Lru, 3 * B, 1000, true);
    ix.insert(bucket(dir.path(), 1, &keys(&["a", "b"]), 1), 10);
    ix.insert(bucket(dir.path(), 2, &keys(&["old"]), 1), 20);
    ix.set_last_use("old", 5);
    let batch = ix.admit(B, 1).unwrap();
    assert_eq!(batch.keys, ["old"]);
    ix.finalize(batch);
}

#[derive(Debug, Clone)]
enum Op {
    /// A bucket of these key numbers.
    Write(Vec<u8>),
    Read(u8),
    Remove(u8),
    /// Last use set to this many ticks ago.
    Idle(u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => proptest::collection::vec(0u8..40, 1..6).prop_map(Op::Write),
        4 => (0u8..40).prop_map(Op::Read),
        1 => (0u8..40).prop_map(Op::Remove),
        1 => (0u8..40, 0u8..50).prop_map(|(k, a)| Op::Idle(k, a)),
    ]
}

/// A cache of `capacity` one-block objects evicting the smallest
/// (last use, write sequence): what the index must match object for object.
struct Model {
    lru: bool,
    capacity: usize,
    objects: Map<String, (u64, u64)>,
    seq: u64,
}

impl Model {
    fn evict_one(&mut self) -> Option<String> {
        let k = self.objects.iter().min_by_key(|(_, r)| **r)?.0.clone();
        self.objects.remove(&k);
        Some(k)
    }
}

fn replay(policy: EvictionPolicy, capacity: usize, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = TierIndex::new(policy, capacity as u64 * B, 1000, true);
    let mut m = Model {
        lru: policy == EvictionPolicy::Lru,
        capacity,
        objects: Map::new(),
        seq: 0,
    };
    let mut next_unit = 1;
    for (now, op) in (100u64..).zip(ops) {
        match op {
            Op::Write(ks) => {
                let mut names: Vec<String> = ks.iter().map(|k| format!("k{k}")).collect();
                names.sort();
                names.dedup();
                let mut evicted = Vec::new();
                for (i, _) in names.iter().enumerate() {
                    let b = ix.admit(B, 1).unwrap();
                    evicted.extend(b.keys.iter().cloned());
                    ix.finalize(b);
                    let mut want = Vec::new();
                    while m.objects.len() + i + 1 > m.capacity {
                        want.push(m.evict_one().unwrap());
                    }
                    evicted.sort();
                    want.sort();
                    let got: Vec<String> = std::mem::take(&mut evicted);
                    prop_assert_eq!(got, want);
                }
                ix.release(names.len() as u64 * B, names.len() as u64);
                ix.insert(bucket(dir.path(), next_unit, &names, 1), now);
                next_unit += 1;
                for n in names {
                    m.seq += 1;
                    let t = if m.lru { now } else { 0 };
                    m.objects.insert(n, (t, m.seq));
                }
            }
            Op::Read(k) => {
                let k = format!("k{k}");
                let found = ix.lookup(&k, now).is_some();
                prop_assert_eq!(found, m.objects.contains_key(&k));
                if let (true, Some(r)) = (m.lru, m.objects.get_mut(&k)) {
                    r.0 = now;
                }
            }
            Op::Remove(k) => {
                let k = format!("k{k}");
                prop_assert_eq!(
                    ix.remove(std::slice::from_ref(&k)),
                    m.objects.remove(&k).map_or(0, |_| 1)
                );
            }
            Op::Idle(k, ago) => {
                let k = format!("k{k}");
                ix.set_last_use(&k, now - u64::from(ago));
                if let (true, Some(r)) = (m.lru, m.objects.get_mut(&k)) {
                    r.0 = now - u64::from(ago);
                }
            }
        }
        let mut have: Vec<&String> = ix.keys().map(|(k, _)| k).collect();
        let mut want: Vec<&String> = m.objects.keys().collect();
        have.sort();
        want.sort();
        prop_assert_eq!(have, want);
        prop_assert_eq!(ix.usage().bytes, m.objects.len() as u64 * B);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn lru_eviction_matches_an_lru_cache(ops in proptest::collection::vec(op(), 1..120)) {
        replay(EvictionPolicy::Lru, 12, ops)?;
    }

    #[test]
    fn fifo_eviction_matches_a_fifo_cache(ops in proptest::collection::vec(op(), 1..120)) {
        replay(EvictionPolicy::Fifo, 12, ops)?;
    }
}
