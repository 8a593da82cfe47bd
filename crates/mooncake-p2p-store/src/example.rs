//! `p2p-store-example`, as the reference's: a simulated trainer publishes a
//! model file, simulated inferencers pull it from whoever holds it. The
//! trainer's bytes are a pattern each inferencer checks, so a run proves
//! the copies byte-exact.
//!
//! Lines for scripts and tests (stdout): the trainer prints
//! `Object registration done: ...`; an inferencer prints
//! `Object retrieval done: duration (ms) D throughput (GB/s) T`, then
//! `verified BYTES bytes`, `bytes_from SEGMENT=BYTES ...`,
//! `failed_holders SEGMENT ...`, `serving` while it holds its replica, and
//! `ALL DONE`.

use std::time::{Duration, Instant};

use clap::Parser;
use memmap2::MmapMut;
use mooncake_transfer::EngineConfig;

use crate::record::DEFAULT_SHARD_SIZE;
use crate::store::P2PStore;

#[derive(Parser, Debug)]
#[command(
    name = "p2p-store-example",
    about = "Publish a simulated model file, or pull it from peers"
)]
pub struct Args {
    /// trainer | inferencer
    #[arg(long = "cmd", default_value = "trainer")]
    pub cmd: String,
    /// etcd, `host:port` or `etcd://host:port`: segments and the catalog
    #[arg(long = "metadata_server", default_value = "localhost:2379")]
    pub metadata_server: String,
    /// This node's `host:port`, unique in the cluster (default: the host name)
    #[arg(long = "local_server_name", default_value = "")]
    pub local_server_name: String,
    /// RDMA NIC name, handed to the engine (which runs TCP here)
    #[arg(long = "device_name", default_value = "")]
    pub device_name: String,
    /// Size of the simulated file in MiB
    #[arg(long = "file_size_mb", default_value_t = 2048)]
    pub file_size_mb: u64,
    /// Shard size in MiB (a power of two)
    #[arg(long = "shard_size_mb", default_value_t = DEFAULT_SHARD_SIZE >> 20)]
    pub shard_size_mb: u64,
    /// Name the file is published under
    #[arg(long = "name", default_value = "foo/bar")]
    pub name: String,
    /// Trainer: how long it stays published before it unregisters
    #[arg(long = "idle_seconds", default_value_t = 100)]
    pub idle_seconds: u64,
    /// Inferencer: how long it serves its replica before deleting it
    #[arg(long = "hold_seconds", default_value_t = 0)]
    pub hold_seconds: u64,
    /// Shards one inferencer reads at once
    #[arg(long = "parallel", default_value_t = crate::store::DEFAULT_PARALLEL_FETCHES)]
    pub parallel: usize,
    /// Seed of the file's byte pattern (trainer and inferencers must agree)
    #[arg(long = "seed", default_value_t = 1)]
    pub seed: u64,
}

/// The byte pattern's 8-byte word at word index `i`.
fn word(seed: u64, i: u64) -> u64 {
    (i ^ seed.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed
}

fn fill(buf: &mut [u8], seed: u64) {
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let w = word(seed, i as u64).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// Offset of the first byte that differs from the pattern.
fn first_mismatch(buf: &[u8], seed: u64) -> Option<usize> {
    buf.chunks(8).enumerate().find_map(|(i, chunk)| {
        let w = word(seed, i as u64).to_le_bytes();
        (chunk != &w[..chunk.len()]).then(|| i * 8)
    })
}

/// Runs the program; the error is what it prints before exiting 1.
pub fn run(args: Args) -> Result<(), String> {
    let size = usize::try_from(args.file_size_mb << 20)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| format!("--file_size_mb {} is not a usable size", args.file_size_mb))?;
    let name = if args.local_server_name.is_empty() {
        gethostname()
    } else {
        args.local_server_name.clone()
    };
    let mut config = EngineConfig::new(&args.metadata_server, &name);
    config.device_name = args.device_name.clone();
    let mut store = P2PStore::with_config(&args.metadata_server, config)
        .map_err(|e| format!("P2PStore: initialization failed: {e}"))?;
    store.set_parallel_fetches(args.parallel);
    let mut buf = MmapMut::map_anon(size).map_err(|e| format!("Mmap failed: {e}"))?;
    let buffers = [(buf.as_mut_ptr() as u64, size as u64)];
    match args.cmd.as_str() {
        "trainer" => {
            println!("Simulated training process started");
            fill(&mut buf, args.seed);
            let start = Instant::now();
            store
                .register(
                    &args.name,
                    &buffers,
                    args.shard_size_mb << 20,
                    "cpu:0",
                    true,
                )
                .map_err(|e| format!("Object registration failed: {e}"))?;
            let ms = start.elapsed().as_millis().max(1);
            println!(
                "Object registration done: duration (ms) {ms} throughput (GB/s) {:.2}",
                args.file_size_mb as f64 / ms as f64
            );
            let listed = store
                .list(&args.name)
                .map_err(|e| format!("List failed: {e}"))?;
            println!("{listed:?}");
            println!(
                "Idle for {} seconds, now you can start another terminal to simulate inference",
                args.idle_seconds
            );
            std::thread::sleep(Duration::from_secs(args.idle_seconds));
            store
                .unregister(&args.name)
                .map_err(|e| format!("Unregister failed: {e}"))?;
            store.close();
            println!("Simulated training process stopped gracefully");
        }
        "inferencer" => {
            println!("Simulated inference process started");
            println!("Object retrieval started: name {}", args.name);
            let start = Instant::now();
            let report = store
                .get_replica(&args.name, &buffers)
                .map_err(|e| format!("Object retrieval failed: {e}"))?;
            let ms = start.elapsed().as_millis().max(1);
            println!(
                "Object retrieval done: duration (ms) {ms} throughput (GB/s) {:.2}",
                args.file_size_mb as f64 / ms as f64
            );
            if let Some(at) = first_mismatch(&buf, args.seed) {
                return Err(format!("data differs from the trainer's at byte {at}"));
            }
            println!("verified {size} bytes");
            let from: Vec<String> = report
                .bytes_from
                .iter()
                .map(|(seg, n)| format!("{seg}={n}"))
                .collect();
            println!("bytes_from {}", from.join(" "));
            println!("failed_holders {}", report.failed_holders.join(" "));
            if args.hold_seconds > 0 {
                println!("serving");
                std::thread::sleep(Duration::from_secs(args.hold_seconds));
            }
            store
                .delete_replica(&args.name)
                .map_err(|e| format!("DeleteReplica failed: {e}"))?;
            store.close();
            println!("Simulated inference process stopped gracefully");
            println!("ALL DONE");
        }
        other => {
            return Err(format!(
                "You must specify a command, either 'trainer' or 'inferencer' (got {other:?})"
            ))
        }
    }
    Ok(())
}

fn gethostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_checks_every_byte() {
        let mut buf = vec![0u8; 4099];
        fill(&mut buf, 7);
        assert_eq!(first_mismatch(&buf, 7), None);
        assert_eq!(first_mismatch(&buf, 8), Some(0));
        buf[4098] ^= 1;
        assert_eq!(first_mismatch(&buf, 7), Some(4096));
    }

    #[test]
    fn reference_flags_parse() {
        let a = Args::try_parse_from([
            "p2p-store-example",
            "--cmd=inferencer",
            "--metadata_server=10.0.0.1:2379",
            "--local_server_name=10.0.0.3:12346",
        ])
        .unwrap();
        assert_eq!(a.cmd, "inferencer");
        assert_eq!(a.file_size_mb, 2048);
        assert_eq!(a.shard_size_mb, 64);
    }
}
