//! Sequential write and read throughput of the SSD tier against `dd` with
//! `O_DIRECT` in the same directory, same run.
//!
//!     cargo run --release -p mooncake-store --example tier_bench -- \
//!         --dir /var/tmp/tier-bench --total-mib 2048 [--uring] [--backend file_per_key]
//!
//! Writes objects of 256 KiB-1 MiB (deterministic sizes) through
//! `DiskTier::stage` with the default bucket limits, committing once at the
//! end (buckets seal as they fill), so the time covers every `fdatasync` and
//! metadata commit. Then drops the page cache (`/proc/sys/vm/drop_caches`,
//! when permitted), reopens the tier (a structure scan; checksums are verified
//! by every read), and reads every object back: one at a time, then in
//! batches of 16. The baselines are `dd if=/dev/zero bs=8M oflag=direct
//! conv=fdatasync` and `dd bs=8M iflag=direct` of a file of the same size.

use mooncake_store::tier::io::AlignedBuf;
use mooncake_store::tier::{Backend, DiskTier, TierConfig, Verify};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

struct Args {
    dir: PathBuf,
    total: u64,
    uring: bool,
    backend: Backend,
}

fn parse_args() -> Args {
    let mut a = Args {
        dir: PathBuf::from("/var/tmp/tier-bench"),
        total: 2048 << 20,
        uring: false,
        backend: Backend::Bucket,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--dir" => a.dir = PathBuf::from(it.next().expect("--dir DIR")),
            "--total-mib" => {
                a.total = it
                    .next()
                    .expect("--total-mib N")
                    .parse::<u64>()
                    .expect("a number")
                    << 20
            }
            "--uring" => a.uring = true,
            "--backend" => {
                a.backend = match it.next().as_deref() {
                    Some("bucket") => Backend::Bucket,
                    Some("file_per_key") => Backend::FilePerKey,
                    other => panic!("--backend bucket|file_per_key, not {other:?}"),
                }
            }
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn drop_caches() -> bool {
    // SAFETY: sync() has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

/// Runs dd and returns its bytes/second (from its own summary line).
fn dd(args: &[String]) -> f64 {
    let out = Command::new("dd").args(args).output().expect("dd runs");
    let text = String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .find(|l| l.contains("copied"))
        .unwrap_or_else(|| panic!("dd said: {text}"));
    // "N bytes (...) copied, S s, R MB/s"
    let bytes: f64 = line.split_whitespace().next().unwrap().parse().unwrap();
    let secs: f64 = line
        .split(", ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
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

fn main() {
    let args = parse_args();
    std::fs::create_dir_all(&args.dir).expect("bench directory");
    let tier_dir = args.dir.join("tier");
    let _ = std::fs::remove_dir_all(&tier_dir);
    std::fs::create_dir_all(&tier_dir).unwrap();
    let dd_file = args.dir.join("dd.bin");
    let count = args.total.div_ceil(8 << 20);

    // Baselines.
    let dd_write = dd(&[
        "if=/dev/zero".into(),
        format!("of={}", dd_file.display()),
        "bs=8M".into(),
        format!("count={count}"),
        "oflag=direct".into(),
        "conv=fdatasync".into(),
    ]);
    let cache_dropped = drop_caches();
    let dd_read = dd(&[
        format!("if={}", dd_file.display()),
        "of=/dev/null".into(),
        "bs=8M".into(),
        "iflag=direct".into(),
    ]);
    let _ = std::fs::remove_file(&dd_file);

    let config = TierConfig {
        storage_path: tier_dir.clone(),
        backend: args.backend,
        use_uring: args.uring,
        ..TierConfig::default()
    };
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

    let cache_dropped = drop_caches() && cache_dropped;
    let t = Instant::now();
    let (tier, report) = DiskTier::open(config, Verify::Structure).expect("reopen");
    let scan_s = t.elapsed().as_secs_f64();
    assert_eq!(report.objects(), sizes.len());
    let mut buf = AlignedBuf::new(1 << 20);
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
    drop_caches();
    let mut bufs: Vec<AlignedBuf> = (0..16).map(|_| AlignedBuf::new(1 << 20)).collect();
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("obj-{i}")).collect();
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
    }
    let batch_s = t.elapsed().as_secs_f64();
    let usage = tier.usage();
    drop(tier);
    let _ = std::fs::remove_dir_all(&tier_dir);

    let w = mbps(total, write_s);
    let r = mbps(total, read_s);
    let rb = mbps(total, batch_s);
    println!(
        "directory        {} ({} objects, {:.0} MiB, engine {engine}, {:?})",
        args.dir.display(),
        sizes.len(),
        total as f64 / (1 << 20) as f64,
        args.backend
    );
    println!(
        "page cache       {}",
        if cache_dropped {
            "dropped before each read pass"
        } else {
            "not dropped (no permission); reads use O_DIRECT where the filesystem allows"
        }
    );
    println!("dd write direct  {:8.0} MB/s", dd_write / 1e6);
    println!(
        "tier write       {:8.0} MB/s  {:5.1}% of dd  (target >= 70%)",
        w,
        100.0 * w * 1e6 / dd_write
    );
    println!("dd read direct   {:8.0} MB/s", dd_read / 1e6);
    println!(
        "tier read        {:8.0} MB/s  {:5.1}% of dd  (target >= 80%)",
        r,
        100.0 * r * 1e6 / dd_read
    );
    println!(
        "tier read x16    {:8.0} MB/s  {:5.1}% of dd  (target >= 80%)",
        rb,
        100.0 * rb * 1e6 / dd_read
    );
    println!(
        "restart scan     {:8.3} s for {} units",
        scan_s, usage.units
    );
    println!(
        "{{\"dd_write_mbps\":{:.0},\"tier_write_mbps\":{w:.0},\"dd_read_mbps\":{:.0},\"tier_read_mbps\":{r:.0},\"tier_read_batch16_mbps\":{rb:.0},\"engine\":\"{engine}\",\"objects\":{},\"bytes\":{total},\"scan_s\":{scan_s:.3}}}",
        dd_write / 1e6,
        dd_read / 1e6,
        sizes.len()
    );
}
