//! Sequential write and read throughput of the SSD tier against `dd` with
//! `O_DIRECT` in the same directory, same run.
//!
//!     cargo run --release -p mooncake-tier --example tier_bench -- \
//!         --dir /var/tmp/tier-bench --total-mib 2048 [--uring] [--backend file_per_key]
//!
//! Writes objects of 256 KiB-1 MiB (deterministic sizes) through
//! `DiskTier::stage` with the default bucket limits, committing once at the
//! end (buckets seal as they fill), so the time covers every `fdatasync` and
//! metadata commit. Then drops the page cache (`/proc/sys/vm/drop_caches`
//! when permitted, and `posix_fadvise(DONTNEED)` on every file read, which
//! needs no privilege), reopens the tier (a structure scan; checksums are
//! verified by every read), and reads every object back: one at a time, then
//! in batches of 16. The baselines are `dd if=/dev/zero bs=8M oflag=direct
//! conv=fdatasync` and `dd bs=8M iflag=direct` of a file of the same size,
//! run in each round right before the tier's pass they are compared with
//! (`--rounds N`: the disk is shared, so each round gives its own ratios).
//! A second baseline, "raw", does what dd does (8 MiB `O_DIRECT` requests,
//! one at a time) from a buffer on transparent huge pages, as the tier's
//! buffers are: on a virtual disk a request costs per page it spans, so dd's
//! small-page buffer understates what the disk can do.
//!
//! `--dfs` measures the shared-filesystem tier's writer instead: the same
//! objects written as files at their keys' paths (`shared_fs::object_file`)
//! by `fs_group::GroupWriter` in groups of 64 (a client writer's round),
//! its directories created first as a client does when it mounts the tier,
//! after the writer has deleted the previous round's files (`DIR/dfs` keeps
//! each round's files for the next round or run, as a tier at its quota
//! deletes as much as it writes; the deletes are outside the write rate),
//! against `dd oflag=direct conv=fdatasync` in the same directory: of the
//! whole size right before, and in slices of the next four groups' bytes
//! before every four groups (the disk is shared; slices see the load the
//! writes see); reads go through the tier's `read_object` (buffered, as
//! clients read the mount).

use mooncake_tier::fs_group::{GroupObject, GroupWriter};
use mooncake_tier::io::{engine, AlignedBuf, DiskFile};
use mooncake_tier::shared_fs;
use mooncake_tier::{DiskTier, StorageBackend, TierConfig, Verify};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

struct Args {
    dir: PathBuf,
    total: u64,
    uring: bool,
    backend: StorageBackend,
    rounds: usize,
    dfs: bool,
}

fn number(arg: Option<String>, usage: &str) -> u64 {
    arg.and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{usage}: a number"))
}

fn parse_args() -> Args {
    let mut a = Args {
        dir: PathBuf::from("/var/tmp/tier-bench"),
        total: 2048 << 20,
        uring: false,
        backend: StorageBackend::Bucket,
        rounds: 1,
        dfs: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--dir" => a.dir = PathBuf::from(it.next().expect("--dir DIR")),
            "--total-mib" => a.total = number(it.next(), "--total-mib N") << 20,
            "--uring" => a.uring = true,
            "--dfs" => a.dfs = true,
            "--rounds" => a.rounds = number(it.next(), "--rounds N").max(1) as usize,
            "--backend" => {
                a.backend = match it.next().as_deref() {
                    Some("bucket") => StorageBackend::Bucket,
                    Some("file_per_key") => StorageBackend::FilePerKey,
                    other => panic!("--backend bucket|file_per_key, not {other:?}"),
                }
            }
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// Drops the page cache of `files` (and everything, when permitted).
/// Returns whether the global drop worked; the per-file one needs no
/// privilege and always runs.
fn drop_caches(files: &[PathBuf]) -> bool {
    // SAFETY: sync() has no preconditions.
    unsafe { libc::sync() };
    for f in files {
        if let Ok(file) = std::fs::File::open(f) {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid descriptor; fadvise touches no memory of ours.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

/// Every file under `dir` (one level: the bucket layout).
fn files_in(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Runs dd and returns its bytes/second (from its own summary line).
fn dd(args: &[String]) -> f64 {
    let out = Command::new("dd").args(args).output().expect("dd runs");
    let text = String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .find(|l| l.contains("copied"))
        .unwrap_or_else(|| panic!("dd said: {text}"));
    // "N bytes (2.1 GB, 2.0 GiB) copied, S s, R MB/s": the seconds follow
    // "copied, " (the sizes in parentheses hold ", " too).
    let bytes: f64 = line.split_whitespace().next().unwrap().parse().unwrap();
    let secs: f64 = line
        .split_once("copied, ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no seconds in {line:?}"))
        .replace(',', ".")
        .parse()
        .unwrap();
    bytes / secs
}

fn mbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

fn sizes(total: u64) -> Vec<usize> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut out = Vec::new();
    let mut sum = 0u64;
    while sum < total {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = (256 << 10) + (x % (768 << 10)) as usize;
        sum += n as u64;
        out.push(n);
    }
    out
}

struct Round {
    dd_write: f64,
    raw_write: f64,
    write: f64,
    dd_read: f64,
    raw_read: f64,
    readahead_hits: u64,
    batch_hits: u64,
    read: f64,
    read16: f64,
    scan_s: f64,
    units: u64,
    global_drop: bool,
    engine: &'static str,
}

/// Writes then reads `total` bytes at `path` in 8 MiB `O_DIRECT` requests
/// from one huge-page buffer, one request at a time; bytes/second of each
/// (the write's time includes its `fdatasync`).
fn raw(path: &std::path::Path, total: u64, uring: bool) -> (f64, f64) {
    let (io, _) = engine(uring);
    let mut buf = AlignedBuf::new(8 << 20);
    buf.fill(0x5a);
    let count = total.div_ceil(8 << 20);
    let f = DiskFile::create(path).expect("raw file");
    let t = Instant::now();
    for i in 0..count {
        io.write_all_at(&f, &buf, i * (8 << 20)).expect("raw write");
    }
    io.sync_data(&f).expect("raw fdatasync");
    let w = (count << 23) as f64 / t.elapsed().as_secs_f64();
    drop(f);
    drop_caches(&[path.to_path_buf()]);
    let f = DiskFile::open_read(path).expect("raw file");
    let t = Instant::now();
    for i in 0..count {
        io.read_at(&f, &mut buf, i * (8 << 20)).expect("raw read");
    }
    let r = (count << 23) as f64 / t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(path);
    (w, r)
}

fn round(args: &Args, sizes: &[usize], pool: &[u8]) -> Round {
    let tier_dir = args.dir.join("tier");
    let _ = std::fs::remove_dir_all(&tier_dir);
    std::fs::create_dir_all(&tier_dir).unwrap();
    let dd_file = args.dir.join("dd.bin");
    let total: u64 = sizes.iter().map(|&n| n as u64).sum();
    let config = TierConfig {
        storage_path: tier_dir.clone(),
        backend: args.backend,
        use_uring: args.uring,
        ..TierConfig::default()
    };

    let (raw_write, raw_read) = raw(&args.dir.join("raw.bin"), total, args.uring);
    let (dd_write, _) = dd_write(&dd_file, total);
    let (tier, _) = DiskTier::open(config.clone(), Verify::All).expect("open tier");
    let engine = tier.engine_name();
    let t = Instant::now();
    for (i, &n) in sizes.iter().enumerate() {
        let start = (i * 4099) % (pool.len() - n);
        let out = tier
            .stage(&format!("obj-{i}"), i as u64, &[&pool[start..start + n]], 1)
            .expect("stage");
        tier.finalize(out.evicted);
    }
    tier.commit(1).expect("commit");
    let write_s = t.elapsed().as_secs_f64();
    drop(tier);

    let mut global_drop = drop_caches(std::slice::from_ref(&dd_file));
    let dd_read = dd_read(&dd_file);
    let _ = std::fs::remove_file(&dd_file);

    global_drop &= drop_caches(&files_in(&tier_dir));
    let t = Instant::now();
    let (tier, report) = DiskTier::open(config, Verify::Structure).expect("reopen");
    let scan_s = t.elapsed().as_secs_f64();
    assert_eq!(report.objects(), sizes.len());
    let mut buf = AlignedBuf::new(1 << 20);
    let hits_before = tier.readahead_hits();
    let t = Instant::now();
    for (i, &n) in sizes.iter().enumerate() {
        tier.read(&format!("obj-{i}"), &mut buf[..n], 2)
            .expect("read");
        let start = (i * 4099) % (pool.len() - n);
        if i % 97 == 0 {
            assert!(buf[..n] == pool[start..start + n], "obj-{i} bytes");
        }
    }
    let read_s = t.elapsed().as_secs_f64();
    let readahead_hits = tier.readahead_hits() - hits_before;
    global_drop &= drop_caches(&files_in(&tier_dir));
    let mut bufs: Vec<AlignedBuf> = (0..16).map(|_| AlignedBuf::new(1 << 20)).collect();
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("obj-{i}")).collect();
    let hits_before = tier.readahead_hits();
    let t = Instant::now();
    for chunk in (0..sizes.len()).collect::<Vec<_>>().chunks(16) {
        let mut reads: Vec<(&str, &mut [u8])> = chunk
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&i, b)| (keys[i].as_str(), &mut b[..sizes[i]]))
            .collect();
        for r in tier.read_batch(&mut reads, 3) {
            r.expect("batch read");
        }
        if chunk[0] % 97 == 0 {
            let (i, n) = (chunk[0], sizes[chunk[0]]);
            let start = (i * 4099) % (pool.len() - n);
            assert!(bufs[0][..n] == pool[start..start + n], "obj-{i} bytes");
        }
    }
    let batch_s = t.elapsed().as_secs_f64();
    let batch_hits = tier.readahead_hits() - hits_before;
    let usage = tier.usage();
    drop(tier);
    let _ = std::fs::remove_dir_all(&tier_dir);
    Round {
        dd_write: dd_write / 1e6,
        raw_write: raw_write / 1e6,
        write: mbps(total, write_s),
        dd_read: dd_read / 1e6,
        raw_read: raw_read / 1e6,
        readahead_hits,
        batch_hits,
        read: mbps(total, read_s),
        read16: mbps(total, batch_s),
        scan_s,
        units: usage.units,
        global_drop,
        engine,
    }
}

fn pct(a: f64, b: f64) -> f64 {
    100.0 * a / b
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Objects of a client writer's round: the group size of `client/file_tier.rs`.
const DFS_GROUP: usize = 64;

/// Groups written between two slices of dd in the write pass.
const DFS_SLICE_GROUPS: usize = 4;

/// One round of the shared-filesystem tier against dd, bytes/second.
struct DfsRound {
    /// dd of the whole size, right before the tier's writes.
    dd_write: f64,
    /// dd slices interleaved with the tier's writes (each slice the bytes of
    /// the groups after it, a new file each): both see the same load.
    dd_slices: f64,
    write: f64,
    dd_read: f64,
    read: f64,
    /// Seconds the writer took to create the tier's directories (a
    /// client does it once, when it mounts the tier).
    prepare_s: f64,
    /// Files of the previous round deleted before dd, and the seconds it
    /// took (not in the write rate).
    removed: usize,
    remove_s: f64,
}

/// `dd`'s direct sequential read of `path` (MB/s), the read yardstick.
fn dd_read(path: &std::path::Path) -> f64 {
    dd(&[
        format!("if={}", path.display()),
        "of=/dev/null".into(),
        "bs=8M".into(),
        "iflag=direct".into(),
    ])
}

/// dd writing `bytes` (whole 8 MiB blocks) to a new file `path`, as the
/// tier's baseline: `O_DIRECT`, `fdatasync` at the end. Bytes/second and
/// the bytes written.
fn dd_write(path: &std::path::Path, bytes: u64) -> (f64, u64) {
    let count = bytes.div_ceil(8 << 20);
    let rate = dd(&[
        "if=/dev/zero".into(),
        format!("of={}", path.display()),
        "bs=8M".into(),
        format!("count={count}"),
        "oflag=direct".into(),
        "conv=fdatasync".into(),
    ]);
    (rate, count * (8 << 20))
}

/// The shared-filesystem tier's writer against dd, same directory, same
/// round.
fn dfs_round(args: &Args, sizes: &[usize], pool: &[u8]) -> DfsRound {
    let fsdir = args.dir.join("dfs");
    std::fs::create_dir_all(&fsdir).unwrap();
    let fsdir_s = fsdir.to_str().expect("a UTF-8 directory");
    // As a client does when it mounts the tier: every directory created
    // once, before the first group.
    let mut writer = GroupWriter::default();
    let t = Instant::now();
    writer.prepare(fsdir_s).expect("dfs directories");
    let prepare_s = t.elapsed().as_secs_f64();
    // The previous round's files (kept by it, or by the previous run) are
    // deleted through the writer, as the master's deletes reach a client's
    // writer when its files are evicted or replaced: they become its
    // spares, which the new files take over.
    let t = Instant::now();
    let old = files_in(&fsdir);
    for f in &old {
        writer.remove(f).expect("dfs delete");
    }
    let remove_s = t.elapsed().as_secs_f64();
    let dd_file = args.dir.join("dd.bin");
    let total: u64 = sizes.iter().map(|&n| n as u64).sum();
    let (dd_write_rate, _) = dd_write(&dd_file, total);
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("obj-{i}")).collect();
    let value = |i: usize| {
        let start = (i * 4099) % (pool.len() - sizes[i]);
        &pool[start..start + sizes[i]]
    };
    let order: Vec<usize> = (0..sizes.len()).collect();
    let (mut write_s, mut dd_s, mut dd_bytes) = (0.0, 0.0, 0u64);
    let slices_dir = args.dir.join("dd-slices");
    let _ = std::fs::remove_dir_all(&slices_dir);
    std::fs::create_dir_all(&slices_dir).unwrap();
    for (n, slice) in order.chunks(DFS_GROUP * DFS_SLICE_GROUPS).enumerate() {
        let bytes: u64 = slice.iter().map(|&i| sizes[i] as u64).sum();
        let (rate, written) = dd_write(&slices_dir.join(format!("s{n}")), bytes);
        dd_s += written as f64 / rate;
        dd_bytes += written;
        let t = Instant::now();
        for chunk in slice.chunks(DFS_GROUP) {
            let group: Vec<GroupObject<'_>> = chunk
                .iter()
                .map(|&i| GroupObject {
                    key: &keys[i],
                    path: shared_fs::path_of(&shared_fs::object_file(fsdir_s, &keys[i])),
                    value: value(i),
                })
                .collect();
            for r in writer.write_group(&group) {
                r.expect("dfs write");
            }
        }
        write_s += t.elapsed().as_secs_f64();
    }
    let _ = std::fs::remove_dir_all(&slices_dir);

    drop_caches(std::slice::from_ref(&dd_file));
    let dd_read = dd_read(&dd_file);
    let _ = std::fs::remove_file(&dd_file);
    drop_caches(&files_in(&fsdir));
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    for (i, &n) in sizes.iter().enumerate() {
        let path = shared_fs::path_of(&shared_fs::object_file(fsdir_s, &keys[i]));
        shared_fs::read_object(&path, &keys[i], &mut buf[..n]).expect("dfs read");
        if i % 97 == 0 {
            assert!(buf[..n] == *value(i), "obj-{i} bytes");
        }
    }
    let read_s = t.elapsed().as_secs_f64();
    // The files stay for the next round (or run) to delete.
    DfsRound {
        dd_write: dd_write_rate,
        dd_slices: dd_bytes as f64 / dd_s,
        write: total as f64 / write_s,
        dd_read,
        read: total as f64 / read_s,
        prepare_s,
        removed: old.len(),
        remove_s,
    }
}

fn dfs_main(args: &Args, sizes: &[usize], pool: &[u8]) {
    let total: u64 = sizes.iter().map(|&n| n as u64).sum();
    println!(
        "directory   {} (shared-filesystem tier, {} objects, {:.0} MiB, groups of {DFS_GROUP})",
        args.dir.display(),
        sizes.len(),
        total as f64 / (1 << 20) as f64,
    );
    println!(
        "MB/s; % = tier / dd; dd slices: interleaved with the tier's writes, \
         {DFS_SLICE_GROUPS} groups a slice"
    );
    println!(
        "round  dd write  dd slices  tier write  (% dd, % slices)   dd read  tier read  mount ms  deleted (ms)"
    );
    let mut ratios = Vec::new();
    for i in 0..args.rounds {
        let r = dfs_round(args, sizes, pool);
        println!(
            "{:5}  {:8.0}  {:9.0}  {:10.0}  ({:4.0}%, {:4.0}%)     {:7.0}  {:5.0} {:4.0}%  {:8.0}  {:7} ({:.0})",
            i + 1,
            r.dd_write / 1e6,
            r.dd_slices / 1e6,
            r.write / 1e6,
            pct(r.write, r.dd_write),
            pct(r.write, r.dd_slices),
            r.dd_read / 1e6,
            r.read / 1e6,
            pct(r.read, r.dd_read),
            r.prepare_s * 1e3,
            r.removed,
            r.remove_s * 1e3
        );
        println!(
            "{{\"dd_write_mbps\":{:.0},\"dd_slices_mbps\":{:.0},\"dfs_write_mbps\":{:.0},\"dd_read_mbps\":{:.0},\"dfs_read_mbps\":{:.0},\"objects\":{},\"bytes\":{total}}}",
            r.dd_write / 1e6, r.dd_slices / 1e6, r.write / 1e6, r.dd_read / 1e6, r.read / 1e6, sizes.len()
        );
        ratios.push((pct(r.write, r.dd_write), pct(r.write, r.dd_slices)));
    }
    println!(
        "median write ratio to dd: {:.0}% before, {:.0}% interleaved (target >= 70%)",
        median(ratios.iter().map(|r| r.0).collect()),
        median(ratios.iter().map(|r| r.1).collect())
    );
}

fn main() {
    let args = parse_args();
    std::fs::create_dir_all(&args.dir).expect("bench directory");
    let sizes = sizes(args.total);
    let total: u64 = sizes.iter().map(|&n| n as u64).sum();
    // Source bytes: one random pool, objects are windows of it.
    let mut pool = vec![0u8; 2 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in pool.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    if args.dfs {
        return dfs_main(&args, &sizes, &pool);
    }
    let rounds: Vec<Round> = (0..args.rounds)
        .map(|_| round(&args, &sizes, &pool))
        .collect();
    println!(
        "directory   {} ({} objects, {:.0} MiB, engine {}, {:?}, {} units)",
        args.dir.display(),
        sizes.len(),
        total as f64 / (1 << 20) as f64,
        rounds[0].engine,
        args.backend,
        rounds[0].units,
    );
    println!(
        "page cache  dropped before each read pass: posix_fadvise(DONTNEED) on every file read{}; \
         dd and the tier read with O_DIRECT",
        if rounds.iter().all(|r| r.global_drop) {
            " and /proc/sys/vm/drop_caches"
        } else {
            " (/proc/sys/vm/drop_caches not permitted)"
        }
    );
    println!(
        "values served from readahead windows: {} of {} single reads, {} in batches (first round)",
        rounds[0].readahead_hits,
        sizes.len(),
        rounds[0].batch_hits
    );
    println!("MB/s; % = tier / dd (tier / raw)");
    println!(
        "round  dd write  raw write  tier write          dd read  raw read  tier read           tier read x16       scan"
    );
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "{:5}  {:8.0}  {:9.0}  {:5.0} {:5.0}% ({:3.0}%)  {:7.0}  {:8.0}  {:5.0} {:5.0}% ({:3.0}%)  {:5.0} {:5.0}% ({:3.0}%)  {:.3} s",
            i + 1,
            r.dd_write,
            r.raw_write,
            r.write,
            pct(r.write, r.dd_write),
            pct(r.write, r.raw_write),
            r.dd_read,
            r.raw_read,
            r.read,
            pct(r.read, r.dd_read),
            pct(r.read, r.raw_read),
            r.read16,
            pct(r.read16, r.dd_read),
            pct(r.read16, r.raw_read),
            r.scan_s
        );
    }
    let med = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    println!(
        "median of the rounds' ratios to dd (to raw): write {:.0}% ({:.0}%) (target >= 70%), \
         read {:.0}% ({:.0}%), read x16 {:.0}% ({:.0}%) (targets >= 80%)",
        med(&|r| pct(r.write, r.dd_write)),
        med(&|r| pct(r.write, r.raw_write)),
        med(&|r| pct(r.read, r.dd_read)),
        med(&|r| pct(r.read, r.raw_read)),
        med(&|r| pct(r.read16, r.dd_read)),
        med(&|r| pct(r.read16, r.raw_read)),
    );
    for r in &rounds {
        println!(
            "{{\"dd_write_mbps\":{:.0},\"raw_write_mbps\":{:.0},\"tier_write_mbps\":{:.0},\"dd_read_mbps\":{:.0},\"raw_read_mbps\":{:.0},\"tier_read_mbps\":{:.0},\"tier_read_batch16_mbps\":{:.0},\"readahead_hits\":{},\"engine\":\"{}\",\"objects\":{},\"bytes\":{total},\"scan_s\":{:.3}}}",
            r.dd_write, r.raw_write, r.write, r.dd_read, r.raw_read, r.read, r.read16, r.readahead_hits, r.engine, sizes.len(), r.scan_s
        );
    }
}
