use super::*;
use crate::bucket::{data_path, meta_path};
use crate::config::EvictionPolicy;
use crate::io::{temp_path, AlignedBuf};
use crate::scan::ScanProblem;
use std::path::Path;

fn config(dir: &Path, backend: StorageBackend, uring: bool) -> TierConfig {
    TierConfig {
        storage_path: dir.to_path_buf(),
        backend,
        use_uring: uring,
        ..TierConfig::default()
    }
}

fn value(i: usize, len: usize) -> Vec<u8> {
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

const SIZES: [usize; 13] = [
    0,
    1,
    3,
    4095,
    4096,
    4097,
    65535,
    65536,
    65537,
    1 << 20,
    (1 << 20) + 1,
    3_000_001,
    9 << 20,
];

fn stage_all(tier: &DiskTier, n: usize, sizes: &[usize]) -> Vec<(String, ObjectLocation)> {
    let mut committed = Vec::new();
    for i in 0..n {
        let v = value(i, sizes[i % sizes.len()]);
        let out = tier.stage(&format!("key-{i}"), i as u64, &[&v], 1).unwrap();
        assert!(out.evicted.is_empty());
        tier.finalize(out.evicted);
        if let Some(c) = out.committed {
            committed.extend(c.objects);
        }
    }
    if let Some(c) = tier.commit(1).unwrap() {
        committed.extend(c.objects);
    }
    committed
}

fn check_reads(tier: &DiskTier, n: usize, sizes: &[usize]) {
    for i in 0..n {
        let key = format!("key-{i}");
        let want = value(i, sizes[i % sizes.len()]);
        // An ordinary (rarely aligned) buffer.
        let mut got = vec![0u8; want.len()];
        tier.read(&key, &mut got, 2).unwrap();
        assert!(got == want, "{key}");
        // An aligned one: the direct path.
        let mut aligned = AlignedBuf::new(want.len());
        tier.read(&key, &mut aligned[..want.len()], 2).unwrap();
        assert!(aligned[..want.len()] == want[..], "{key} aligned");
        // Ranges, including an unaligned one at the end.
        if want.len() > 10 {
            let start = want.len() / 3;
            let mut part = vec![0u8; want.len() - start];
            tier.read_range(&key, start as u64, &mut part, 2).unwrap();
            assert!(part == want[start..]);
        }
        // The wrong length is refused.
        let mut wrong = vec![0u8; want.len() + 1];
        assert!(matches!(
            tier.read(&key, &mut wrong, 2),
            Err(TierError::BufferSize { .. })
        ));
    }
    let keys: Vec<String> = (0..n).map(|i| format!("key-{i}")).collect();
    let bufs = read_batch_ok(tier, &keys);
    for (i, b) in bufs.iter().enumerate() {
        assert!(b[..] == value(i, sizes[i % sizes.len()])[..]);
    }
}

/// One batch read of `keys`, each into a buffer of its length; every
/// read must succeed.
fn read_batch_ok(tier: &DiskTier, keys: &[String]) -> Vec<Vec<u8>> {
    let mut bufs: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| vec![0u8; tier.location(k).unwrap().len as usize])
        .collect();
    let mut reads: Vec<(&str, &mut [u8])> = keys
        .iter()
        .map(|k| k.as_str())
        .zip(bufs.iter_mut().map(|b| &mut b[..]))
        .collect();
    for r in tier.read_batch(&mut reads, 3) {
        r.unwrap();
    }
    bufs
}

fn round_trip(backend: StorageBackend, uring: bool) {
    let dir = tempfile::tempdir().unwrap();
    let n = SIZES.len() * 2;
    {
        let (tier, report) =
            DiskTier::open(config(dir.path(), backend, uring), Verify::All).unwrap();
        assert!(report.units.is_empty() && report.problems.is_empty());
        let committed = stage_all(&tier, n, &SIZES);
        assert_eq!(committed.len(), n);
        check_reads(&tier, n, &SIZES);
        let mut missing = vec![0u8; 1];
        assert!(matches!(
            tier.read("nope", &mut missing, 0),
            Err(TierError::NotFound)
        ));
    }
    // Restart: everything comes back, verified.
    let (tier, report) = DiskTier::open(config(dir.path(), backend, uring), Verify::All).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.objects(), n);
    assert_eq!(tier.usage().keys, n as u64);
    check_reads(&tier, n, &SIZES);
    for (k, loc) in tier.objects() {
        let i: u64 = k.trim_start_matches("key-").parse().unwrap();
        assert_eq!(loc.tag, i);
    }
}

#[test]
fn buckets_round_trip_all_sizes() {
    round_trip(StorageBackend::Bucket, false);
}

#[test]
fn file_per_key_round_trips_all_sizes() {
    round_trip(StorageBackend::FilePerKey, false);
}

#[test]
fn io_uring_round_trips_or_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let (tier, _) = DiskTier::open(
        config(dir.path(), StorageBackend::Bucket, true),
        Verify::All,
    )
    .unwrap();
    match tier.engine_name() {
        "io_uring" => assert!(tier.engine_note().is_none()),
        _ => assert!(tier.engine_note().unwrap().contains("io_uring unavailable")),
    }
    drop(tier);
    round_trip(StorageBackend::Bucket, true);
    round_trip(StorageBackend::FilePerKey, true);
}

#[test]
fn one_object_is_durable_at_commit_with_default_bucket_limits() {
    let dir = tempfile::tempdir().unwrap();
    let (tier, _) = DiskTier::open(
        config(dir.path(), StorageBackend::Bucket, false),
        Verify::All,
    )
    .unwrap();
    let out = tier.stage("lonely", 7, &[b"value"], 1).unwrap();
    assert!(
        out.committed.is_none(),
        "default limits do not fill a bucket"
    );
    tier.finalize(out.evicted);
    // Not durable yet, so not readable.
    assert!(matches!(
        tier.read("lonely", &mut [0u8; 5], 1),
        Err(TierError::NotFound)
    ));
    let c = tier.commit(1).unwrap().unwrap();
    assert_eq!(c.objects.len(), 1);
    assert_eq!(c.objects[0].0, "lonely");
    let mut got = [0u8; 5];
    tier.read("lonely", &mut got, 1).unwrap();
    assert_eq!(&got, b"value");
    assert!(tier.commit(1).unwrap().is_none());
    // A "kill -9" right after the commit: the object is there after restart.
    std::mem::forget(tier);
    let (tier, report) = DiskTier::open(
        config(dir.path(), StorageBackend::Bucket, false),
        Verify::All,
    )
    .unwrap();
    assert_eq!(report.objects(), 1);
    tier.read("lonely", &mut got, 1).unwrap();
}

#[test]
fn full_buckets_seal_while_staging() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), StorageBackend::Bucket, false);
    c.bucket_keys_limit = 10;
    let (tier, _) = DiskTier::open(c, Verify::All).unwrap();
    let mut sealed = Vec::new();
    for i in 0..25 {
        let out = tier
            .stage(&format!("k{i}"), 0, &[&value(i, 1000)], 1)
            .unwrap();
        tier.finalize(out.evicted);
        if let Some(c) = out.committed {
            sealed.push(c.objects.len());
        }
    }
    assert_eq!(sealed, [10, 10]);
    assert_eq!(tier.commit(1).unwrap().unwrap().objects.len(), 5);
    assert_eq!(tier.usage().units, 3);
}

/// Three buckets of four objects of 10 000 bytes, then the tier is closed.
fn three_buckets(dir: &Path) -> Vec<u64> {
    let mut c = config(dir, StorageBackend::Bucket, false);
    c.bucket_keys_limit = 4;
    let (tier, _) = DiskTier::open(c, Verify::All).unwrap();
    stage_all(&tier, 12, &[10_000]);
    let mut ids: Vec<u64> = tier.objects().iter().map(|(_, l)| l.unit).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3);
    ids
}

fn reopen(dir: &Path, verify: Verify) -> (DiskTier, ScanReport) {
    DiskTier::open(config(dir, StorageBackend::Bucket, false), verify).unwrap()
}

fn readable(tier: &DiskTier) -> Vec<usize> {
    (0..12)
        .filter(|&i| {
            let mut b = vec![0u8; 10_000];
            match tier.read(&format!("key-{i}"), &mut b, 1) {
                Ok(()) => {
                    assert!(b == value(i, 10_000));
                    true
                }
                Err(_) => false,
            }
        })
        .collect()
}

#[test]
fn scan_drops_the_objects_of_a_truncated_bucket_file() {
    let dir = tempfile::tempdir().unwrap();
    let ids = three_buckets(dir.path());
    // Cut the middle bucket inside its third object (objects at 0, 10000, 20000, 30000).
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(data_path(dir.path(), ids[1]))
        .unwrap();
    f.set_len(25_000).unwrap();
    let (tier, report) = reopen(dir.path(), Verify::All);
    let truncated: Vec<_> = report
        .problems
        .iter()
        .filter_map(|p| match p {
            ScanProblem::Truncated { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(truncated, ["key-6", "key-7"]);
    assert_eq!(readable(&tier), [0, 1, 2, 3, 4, 5, 8, 9, 10, 11]);
    drop(tier);
    let (_, again) = reopen(dir.path(), Verify::All);
    assert!(
        again.problems.is_empty(),
        "reported once: {:?}",
        again.problems
    );
}

#[test]
fn scan_drops_an_object_with_a_flipped_byte() {
    let dir = tempfile::tempdir().unwrap();
    let ids = three_buckets(dir.path());
    let path = data_path(dir.path(), ids[2]);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10_000 + 4321] ^= 0x01; // inside key-9
    std::fs::write(&path, bytes).unwrap();
    let (tier, report) = reopen(dir.path(), Verify::All);
    assert!(
        matches!(&report.problems[..], [ScanProblem::Corrupt { key, .. }] if key == "key-9"),
        "{:?}",
        report.problems
    );
    assert_eq!(readable(&tier), [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11]);
}

#[test]
fn a_flipped_byte_missed_by_a_structure_scan_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let ids = three_buckets(dir.path());
    let path = data_path(dir.path(), ids[0]);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[5] ^= 0x80; // inside key-0
    std::fs::write(&path, bytes).unwrap();
    let (tier, report) = reopen(dir.path(), Verify::Structure);
    assert!(report.problems.is_empty());
    let mut b = vec![0u8; 10_000];
    assert!(matches!(
        tier.read("key-0", &mut b, 1),
        Err(TierError::Corrupt { .. })
    ));
    assert!(matches!(
        tier.read("key-0", &mut b, 1),
        Err(TierError::NotFound)
    ));
    assert_eq!(readable(&tier), (1..12).collect::<Vec<_>>());
}

/// Reads in write order are served from readahead windows, each verified
/// against its checksum: a flipped byte further on in the bucket is caught
/// when its object is read, and only that object is lost.
#[test]
fn readahead_serves_sequential_reads_and_never_a_flipped_byte() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [300_000, 65_536, 1 << 20, 100_001];
    {
        let (tier, _) = DiskTier::open(
            config(dir.path(), StorageBackend::Bucket, false),
            Verify::All,
        )
        .unwrap();
        stage_all(&tier, 24, &sizes);
    }
    let loc = |tier: &DiskTier, k: &str| tier.location(k).unwrap();
    let (tier, _) = reopen(dir.path(), Verify::Structure);
    let l = loc(&tier, "key-9");
    let path = data_path(dir.path(), l.unit);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(l.offset + l.len / 2) as usize] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
    let before = tier.readahead_hits();
    for i in 0..24 {
        let want = value(i, sizes[i % sizes.len()]);
        let mut got = vec![0u8; want.len()];
        let r = tier.read(&format!("key-{i}"), &mut got, 2);
        if i == 9 {
            assert!(matches!(r, Err(TierError::Corrupt { .. })), "{r:?}");
        } else {
            r.unwrap();
            assert!(got == want, "key-{i}");
        }
    }
    assert!(
        tier.readahead_hits() > before + 12,
        "{} of 23 reads from windows",
        tier.readahead_hits() - before
    );
    assert!(matches!(
        tier.read("key-9", &mut [0u8; 1], 2),
        Err(TierError::NotFound)
    ));
    // Batches in write order are sequential readers too.
    drop(tier);
    let (tier, _) = reopen(dir.path(), Verify::Structure);
    let keys: Vec<String> = (0..24)
        .filter(|&i| i != 9)
        .map(|i| format!("key-{i}"))
        .collect();
    for chunk in keys.chunks(4) {
        let bufs = read_batch_ok(&tier, chunk);
        for (k, b) in chunk.iter().zip(&bufs) {
            let i: usize = k["key-".len()..].parse().unwrap();
            assert!(b[..] == value(i, sizes[i % sizes.len()])[..], "{k}");
        }
    }
    assert!(
        tier.readahead_hits() > 12,
        "{} of 23",
        tier.readahead_hits()
    );
}

#[test]
fn scan_removes_metadata_without_data_orphan_data_temp_files_and_bad_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let ids = three_buckets(dir.path());
    std::fs::remove_file(data_path(dir.path(), ids[0])).unwrap();
    std::fs::remove_file(meta_path(dir.path(), ids[1])).unwrap();
    std::fs::write(meta_path(dir.path(), ids[2]), b"MCTIERBM garbage").unwrap();
    // A commit cut short, and a data file of a bucket that never committed.
    std::fs::write(temp_path(&meta_path(dir.path(), 99)), b"half").unwrap();
    std::fs::write(data_path(dir.path(), 99), vec![1u8; 8192]).unwrap();
    // Files that are not ours stay.
    std::fs::write(dir.path().join("12345.bucket"), b"reference's").unwrap();
    let (tier, report) = reopen(dir.path(), Verify::All);
    let kinds: Vec<&str> = report
        .problems
        .iter()
        .map(|p| match p {
            ScanProblem::MetaWithoutData(_) => "meta-without-data",
            ScanProblem::OrphanData(_) => "orphan-data",
            ScanProblem::BadMeta { .. } => "bad-meta",
            ScanProblem::TempFile(_) => "temp",
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "meta-without-data",
            "orphan-data",
            "bad-meta",
            "temp",
            "orphan-data"
        ]
    );
    assert!(readable(&tier).is_empty());
    assert!(report.next_id > 99);
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["12345.bucket"]);
}

#[test]
fn a_kill_during_offload_keeps_only_committed_objects() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (tier, _) = reopen(dir.path(), Verify::All);
        for i in 0..3 {
            let out = tier
                .stage(&format!("key-{i}"), 0, &[&value(i, 10_000)], 1)
                .unwrap();
            tier.finalize(out.evicted);
        }
        tier.commit(1).unwrap().unwrap();
        for i in 3..6 {
            let out = tier
                .stage(&format!("key-{i}"), 0, &[&value(i, 3 << 20)], 1)
                .unwrap();
            tier.finalize(out.evicted);
        }
        std::mem::forget(tier); // no seal, no cleanup: the data file is half written
    }
    let (tier, report) = reopen(dir.path(), Verify::All);
    assert!(
        matches!(&report.problems[..], [ScanProblem::OrphanData(_)]),
        "{:?}",
        report.problems
    );
    assert_eq!(readable(&tier), [0, 1, 2]);
}

fn limited(dir: &Path, policy: EvictionPolicy, limit: u64) -> DiskTier {
    let mut c = config(dir, StorageBackend::Bucket, false);
    c.bucket_keys_limit = 1;
    c.bucket_max_total_size = limit;
    c.eviction_policy = policy;
    DiskTier::open(c, Verify::All).unwrap().0
}

#[test]
fn fifo_eviction_keeps_the_tier_under_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    // Each object: one bucket of 12 KiB data + a 4 KiB metadata block.
    let tier = limited(dir.path(), EvictionPolicy::Fifo, 5 * 16384);
    let mut evicted = Vec::new();
    for i in 0..12 {
        let out = tier
            .stage(&format!("key-{i}"), 0, &[&value(i, 10_000)], i as u64)
            .unwrap();
        evicted.extend(out.evicted.keys.clone());
        tier.finalize(out.evicted);
        tier.commit(i as u64).unwrap().unwrap();
        assert!(tier.usage().bytes <= 5 * 16384);
    }
    assert_eq!(
        evicted,
        (0..7).map(|i| format!("key-{i}")).collect::<Vec<_>>()
    );
    assert_eq!(readable(&tier), [7, 8, 9, 10, 11]);
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(files, 10, "evicted buckets' files are gone");
}

#[test]
fn lru_eviction_spares_what_was_read() {
    let dir = tempfile::tempdir().unwrap();
    let tier = limited(dir.path(), EvictionPolicy::Lru, 3 * 16384);
    let mut evicted = Vec::new();
    for i in 0..6 {
        let out = tier
            .stage(&format!("key-{i}"), 0, &[&value(i, 10_000)], 10 + i as u64)
            .unwrap();
        evicted.extend(out.evicted.keys.clone());
        tier.finalize(out.evicted);
        tier.commit(10 + i as u64).unwrap();
        // key-0 is read after every write.
        tier.read("key-0", &mut vec![0u8; 10_000], 100 + i as u64)
            .unwrap();
    }
    assert_eq!(evicted, ["key-1", "key-2", "key-3"]);
}

#[test]
fn none_policy_refuses_writes_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tier = limited(dir.path(), EvictionPolicy::None, 2 * 16384);
    for i in 0..2 {
        let out = tier
            .stage(&format!("key-{i}"), 0, &[&value(i, 10_000)], 1)
            .unwrap();
        tier.finalize(out.evicted);
        tier.commit(1).unwrap();
    }
    let err = tier.stage("key-2", 0, &[&value(2, 10_000)], 1).unwrap_err();
    assert!(matches!(err.error, TierError::Full(_)));
    assert_eq!(
        err.error.code(),
        mooncake_common::ErrorCode::NO_AVAILABLE_HANDLE
    );
    assert!(err.discarded.is_empty());
    assert_eq!(readable(&tier), [0, 1]);
    // Room again after a removal.
    assert_eq!(tier.remove(&["key-0".to_string()]), 1);
    let out = tier.stage("key-2", 0, &[&value(2, 10_000)], 1).unwrap();
    tier.finalize(out.evicted);
    tier.commit(1).unwrap().unwrap();
    assert_eq!(readable(&tier), [1, 2]);
}

#[test]
fn restore_after_a_failed_master_report_keeps_the_victims() {
    let dir = tempfile::tempdir().unwrap();
    let tier = limited(dir.path(), EvictionPolicy::Fifo, 2 * 16384);
    for i in 0..2 {
        let out = tier
            .stage(&format!("key-{i}"), 0, &[&value(i, 10_000)], 1)
            .unwrap();
        tier.finalize(out.evicted);
        tier.commit(1).unwrap();
    }
    let out = tier.stage("key-2", 0, &[&value(2, 10_000)], 1).unwrap();
    assert_eq!(out.evicted.keys, ["key-0"]);
    assert!(matches!(
        tier.read("key-0", &mut vec![0u8; 10_000], 1),
        Err(TierError::NotFound)
    ));
    tier.restore(out.evicted);
    assert_eq!(readable(&tier), [0, 1]);
    tier.commit(1).unwrap();
    assert_eq!(readable(&tier), [0, 1, 2]);
}

#[test]
fn reads_racing_eviction_get_the_bytes_or_not_found_never_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let tier = Arc::new(limited(dir.path(), EvictionPolicy::Fifo, 4 * 16384));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (tier, stop) = (tier.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut served = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for i in 0..40 {
                    let mut b = vec![0u8; 10_000];
                    match tier.read(&format!("key-{i}"), &mut b, 0) {
                        Ok(()) => {
                            assert!(b == value(i, 10_000));
                            served += 1;
                        }
                        Err(TierError::NotFound) => {}
                        Err(e) => panic!("key-{i}: {e}"),
                    }
                }
            }
            served
        })
    };
    for i in 0..40 {
        let out = tier
            .stage(&format!("key-{i}"), 0, &[&value(i, 10_000)], 1)
            .unwrap();
        tier.finalize(out.evicted);
        tier.commit(1).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    reader.join().unwrap();
    assert_eq!(tier.usage().keys, 4);
}

#[test]
fn watermark_excess_is_what_brings_the_disk_to_the_low_mark() {
    assert_eq!(super::watermark_excess(900, 1000, 0, 0.9, 0.8), 0);
    assert_eq!(super::watermark_excess(950, 1000, 0, 0.9, 0.8), 150);
    assert_eq!(super::watermark_excess(950, 1000, 100, 0.9, 0.8), 50);
    assert_eq!(super::watermark_excess(950, 1000, 500, 0.9, 0.8), 0);
    assert_eq!(super::watermark_excess(5, 0, 0, 0.9, 0.8), 0);
}

/// The tier fills to its configured size without a sweep taking anything;
/// a disk above the high mark gives back what brings it to the low one,
/// coldest first.
#[test]
fn watermark_eviction_follows_the_disk_not_the_tier_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), StorageBackend::Bucket, false);
    c.bucket_keys_limit = 1;
    // A one-key bucket of 10,000 bytes takes 16 KiB: data and metadata.
    c.bucket_max_total_size = 6 * 16384;
    c.disk_eviction_high_watermark_ratio = 0.5;
    c.disk_eviction_low_watermark_ratio = 0.2;
    let (tier, _) = DiskTier::open(c, Verify::All).unwrap();
    for i in 0..6 {
        let out = tier
            .stage(&format!("key-{i}"), 0, &[&value(i, 10_000)], 1)
            .unwrap();
        tier.finalize(out.evicted);
        tier.commit(1).unwrap();
    }
    assert_eq!(tier.usage().bytes, 6 * 16384, "full to its size");
    assert!(tier.evict_for_disk_usage(50_000, 100_000).is_empty());
    // 70% used: 50,000 bytes to free, four objects.
    let batch = tier.evict_for_disk_usage(70_000, 100_000);
    assert_eq!(batch.keys, ["key-0", "key-1", "key-2", "key-3"]);
    tier.finalize(batch);
    assert_eq!(readable(&tier), [4, 5]);
}

#[test]
fn the_identity_survives_a_restart_and_damage_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (tier, _) = DiskTier::open(
        config(dir.path(), StorageBackend::Bucket, false),
        Verify::All,
    )
    .unwrap();
    let id = tier.identity().unwrap();
    assert_eq!(id.len(), 32);
    drop(tier);
    let (tier, report) = DiskTier::open(
        config(dir.path(), StorageBackend::Bucket, false),
        Verify::All,
    )
    .unwrap();
    assert!(
        report.problems.is_empty(),
        "the identity file is not a bucket file"
    );
    assert_eq!(tier.identity().unwrap(), id);
    std::fs::write(dir.path().join(super::IDENTITY_FILE), b"junk").unwrap();
    assert!(matches!(tier.identity(), Err(TierError::Corrupt { .. })));
}
