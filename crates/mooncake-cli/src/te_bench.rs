//! `transfer_engine_bench`: the reference's throughput tool, same flags.
//!
//! - `--mode=target` publishes a `--buffer_size` managed buffer (filled with a
//!   known pattern), prints `transfer_engine_bench target ready: segment_id=NAME`
//!   and serves until SIGINT/SIGTERM.
//! - `--mode=initiator` opens `--segment_id`, then `--threads` threads each
//!   submit batches of `--batch_size` requests of `--block_size` bytes
//!   (`--operation=read|write`) for `--duration` seconds, and prints
//!   `Test completed: duration D, batch count N, throughput X GB/s`.
//!   With `--check_consistency` it verifies the bytes moved afterwards.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use mooncake_common::gflags;
use mooncake_transfer::{EngineConfig, Opcode, TransferEngine, TransferRequest, TransferState};

#[derive(Parser, Debug, Clone, PartialEq)]
#[command(
    name = "transfer_engine_bench",
    about = "Transfer engine throughput benchmark",
    rename_all = "snake_case"
)]
pub struct BenchArgs {
    /// `initiator` issues transfers; `target` exposes a buffer to them.
    #[arg(long, default_value = "initiator")]
    pub mode: String,
    /// `tcp`; `rdma` is refused (no RDMA transport in this build).
    #[arg(long, default_value = "tcp")]
    pub protocol: String,
    /// RDMA NIC (ignored by tcp).
    #[arg(long, default_value = "")]
    pub device_name: String,
    /// `P2PHANDSHAKE`, `http://h:p/metadata`, `etcd://h:p`, `redis://h:p`.
    #[arg(long, default_value = "P2PHANDSHAKE")]
    pub metadata_server: String,
    /// This process's name; defaults to the host name.
    #[arg(long, default_value = "")]
    pub local_server_name: String,
    /// The target's segment name (`host:port` in P2P mode, as the target prints).
    #[arg(long, default_value = "")]
    pub segment_id: String,
    /// `read` or `write`.
    #[arg(long, default_value = "read")]
    pub operation: String,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    #[arg(long, default_value_t = 12)]
    pub threads: usize,
    #[arg(long, default_value_t = 65536)]
    pub block_size: usize,
    #[arg(long, default_value_t = 128)]
    pub batch_size: usize,
    /// Bytes of local (initiator) or exposed (target) memory.
    #[arg(long, default_value_t = 1 << 30)]
    pub buffer_size: usize,
    /// `GB`, `GiB`, `Gb`, `MB`, `MiB`, `Mb`, `KB`, `KiB`, `Kb` (per second).
    #[arg(long, default_value = "GB")]
    pub report_unit: String,
    #[arg(long, default_value_t = 2)]
    pub report_precision: usize,
    /// Verify the bytes moved (the target's pattern on read, a read-back on write).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub check_consistency: bool,
    /// Accepted for compatibility; topology discovery has no effect on tcp.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub auto_discovery: bool,
    /// File holding the cluster token (default: `$MOONCAKE_CLUSTER_TOKEN`).
    #[arg(long, default_value = "")]
    pub cluster_token_file: String,
}

const BOOL_FLAGS: &[&str] = &["check_consistency", "auto_discovery"];

/// What an initiator run measured.
#[derive(Debug, Clone)]
pub struct BenchReport {
    pub bytes: u64,
    pub batches: u64,
    pub elapsed: Duration,
    /// `Some(true)` when `--check_consistency` passed.
    pub verified: Option<bool>,
}

impl BenchReport {
    /// Throughput in `unit` per second.
    pub fn rate(&self, unit: &str) -> anyhow::Result<f64> {
        let per = unit_bytes(unit)?;
        Ok(self.bytes as f64 / per / self.elapsed.as_secs_f64().max(1e-9))
    }
}

fn unit_bytes(unit: &str) -> anyhow::Result<f64> {
    Ok(match unit {
        "GB" => 1e9,
        "GiB" => (1u64 << 30) as f64,
        "Gb" => 1e9 / 8.0,
        "MB" => 1e6,
        "MiB" => (1u64 << 20) as f64,
        "Mb" => 1e6 / 8.0,
        "KB" => 1e3,
        "KiB" => 1024.0,
        "Kb" => 1e3 / 8.0,
        other => bail!("unknown --report_unit {other:?}"),
    })
}

/// The byte at `offset` of the target's buffer.
fn target_byte(offset: usize) -> u8 {
    (offset as u8).wrapping_mul(13) ^ (offset >> 9) as u8
}

/// The byte at `offset` of the initiator's buffer.
fn initiator_byte(offset: usize) -> u8 {
    (offset as u8).wrapping_mul(7).wrapping_add(101) ^ (offset >> 11) as u8
}

fn engine(args: &BenchArgs) -> anyhow::Result<TransferEngine> {
    let name = if args.local_server_name.is_empty() {
        gethostname::gethostname().to_string_lossy().into_owned()
    } else {
        args.local_server_name.clone()
    };
    let mut config = EngineConfig::new(&args.metadata_server, &name);
    config.protocol = args.protocol.clone();
    config.device_name = args.device_name.clone();
    if !args.cluster_token_file.is_empty() {
        config.cluster_token =
            mooncake_common::auth::ClusterToken::resolve(&args.cluster_token_file)?;
    }
    TransferEngine::new(config).context("starting the transfer engine")
}

/// A managed buffer as bytes; lives as long as `engine`.
fn managed(engine: &TransferEngine, len: usize) -> anyhow::Result<&'static mut [u8]> {
    let addr = engine.allocate_managed_buffer(len)?;
    // SAFETY: the engine keeps `len` bytes mapped at `addr` until the buffer is
    // freed or the engine dropped; `run` uses the slice only while it holds
    // the engine.
    Ok(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) })
}

/// Runs the benchmark until it is done or `stop` is set. Returns the
/// initiator's report (`None` in target mode).
pub fn run(args: &BenchArgs, stop: &AtomicBool) -> anyhow::Result<Option<BenchReport>> {
    unit_bytes(&args.report_unit)?;
    match args.mode.as_str() {
        "target" => {
            let engine = engine(args)?;
            let buf = managed(&engine, args.buffer_size)?;
            for (i, b) in buf.iter_mut().enumerate() {
                *b = target_byte(i);
            }
            println!(
                "transfer_engine_bench target ready: segment_id={}",
                engine.local_server_name()
            );
            use std::io::Write;
            let _ = std::io::stdout().flush();
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(50));
            }
            engine.shutdown();
            Ok(None)
        }
        "initiator" => initiator(args, stop).map(Some),
        other => bail!("unknown --mode {other:?} (initiator or target)"),
    }
}

fn initiator(args: &BenchArgs, stop: &AtomicBool) -> anyhow::Result<BenchReport> {
    let opcode = match args.operation.as_str() {
        "read" => Opcode::Read,
        "write" => Opcode::Write,
        other => bail!("unknown --operation {other:?} (read or write)"),
    };
    if args.segment_id.is_empty() {
        bail!("--segment_id is required in initiator mode");
    }
    if !(args.duration.is_finite() && (0.0..=1e7).contains(&args.duration)) {
        bail!("--duration must be between 0 and 1e7 seconds");
    }
    if args.threads == 0 || args.batch_size == 0 || args.block_size == 0 {
        bail!("--threads, --batch_size and --block_size must be positive");
    }
    let span = args
        .threads
        .checked_mul(args.batch_size)
        .and_then(|n| n.checked_mul(args.block_size))
        .context("--threads x --batch_size x --block_size overflows")?;
    if span > args.buffer_size {
        bail!(
            "--buffer_size {} is smaller than threads x batch_size x block_size = {span}",
            args.buffer_size
        );
    }
    let engine = engine(args)?;
    let local = managed(&engine, args.buffer_size)?;
    for (i, b) in local[..span].iter_mut().enumerate() {
        *b = initiator_byte(i);
    }
    let segment = engine.open_segment(&args.segment_id)?;
    let desc = engine.segment_descriptor(segment)?;
    let remote = desc.first_buffer_address();
    let remote_len = desc.buffers.first().map_or(0, |b| b.length) as usize;
    if remote == 0 || remote_len < span {
        bail!(
            "segment {} exposes {remote_len} bytes; the run needs {span}",
            args.segment_id
        );
    }

    let bytes = Arc::new(AtomicU64::new(0));
    let batches = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(args.duration.max(0.0));
    let local_base = local.as_ptr() as usize;
    std::thread::scope(|s| {
        for t in 0..args.threads {
            let (engine, bytes, batches, failed) = (&engine, &bytes, &batches, &failed);
            s.spawn(move || {
                let base = t * args.batch_size * args.block_size;
                let reqs: Vec<TransferRequest> = (0..args.batch_size)
                    .map(|j| {
                        let off = base + j * args.block_size;
                        TransferRequest {
                            opcode,
                            source: local_base + off,
                            target_id: segment,
                            target_offset: remote + off as u64,
                            length: args.block_size,
                        }
                    })
                    .collect();
                while Instant::now() < deadline
                    && !stop.load(Ordering::Relaxed)
                    && !failed.load(Ordering::Relaxed)
                {
                    let done = engine.allocate_batch(reqs.len()).and_then(|b| {
                        engine.submit(b, &reqs)?;
                        let status = engine.wait_batch(b)?;
                        engine.free_batch(b)?;
                        Ok(status)
                    });
                    match done {
                        Ok(s) if s.state == TransferState::Completed => {
                            bytes.fetch_add(s.transferred_bytes, Ordering::Relaxed);
                            batches.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(s) => {
                            eprintln!(
                                "transfer_engine_bench: batch ended {:?} ({:?})",
                                s.state, s.error
                            );
                            failed.store(true, Ordering::Relaxed);
                        }
                        Err(e) => {
                            eprintln!("transfer_engine_bench: {e}");
                            failed.store(true, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let elapsed = start.elapsed();
    if failed.load(Ordering::Relaxed) {
        bail!("transfers failed");
    }
    let verified = args
        .check_consistency
        .then(|| verify(&engine, opcode, local, segment, remote, span));
    let verified = verified.transpose()?;
    Ok(BenchReport {
        bytes: bytes.load(Ordering::Relaxed),
        batches: batches.load(Ordering::Relaxed),
        elapsed,
        verified,
    })
}

/// Read: the local bytes are the target's pattern. Write: reading the
/// target's range back gives the initiator's pattern.
fn verify(
    engine: &TransferEngine,
    opcode: Opcode,
    local: &mut [u8],
    segment: u64,
    remote: u64,
    span: usize,
) -> anyhow::Result<bool> {
    if opcode == Opcode::Write {
        local[..span].fill(0);
        engine.transfer_sync(&[TransferRequest {
            opcode: Opcode::Read,
            source: local.as_ptr() as usize,
            target_id: segment,
            target_offset: remote,
            length: span,
        }])?;
    }
    let want: fn(usize) -> u8 = if opcode == Opcode::Write {
        initiator_byte
    } else {
        target_byte
    };
    Ok(
        match local[..span]
            .iter()
            .enumerate()
            .find(|&(i, &b)| b != want(i))
        {
            None => true,
            Some((i, &b)) => {
                eprintln!(
                    "transfer_engine_bench: byte {i} is {b:#04x}, expected {:#04x}",
                    want(i)
                );
                false
            }
        },
    )
}

/// Entry point (see [`crate::entry`]): argv in, exit code out.
pub fn main(argv: Vec<String>) -> i32 {
    let args = match BenchArgs::try_parse_from(gflags::normalize(argv, BOOL_FLAGS)) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    crate::logging::init();
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = stop.clone();
    // Signals are awaited on a small runtime of their own thread.
    std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(crate::signals::shutdown_signal());
            stopper.store(true, Ordering::Release);
        }
    });
    match run(&args, &stop) {
        Ok(Some(report)) => {
            let rate = report.rate(&args.report_unit).unwrap_or(0.0);
            println!(
                "Test completed: duration {:.2}, batch count {}, throughput {:.*} {}/s",
                report.elapsed.as_secs_f64(),
                report.batches,
                args.report_precision,
                rate,
                args.report_unit
            );
            match report.verified {
                Some(true) => println!("Data consistency check passed"),
                Some(false) => {
                    println!("Data consistency check FAILED");
                    return 1;
                }
                None => {}
            }
            0
        }
        Ok(None) => 0,
        Err(e) => {
            eprintln!("transfer_engine_bench: {e:#}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        BenchArgs::try_parse_from(gflags::normalize(args.iter().copied(), BOOL_FLAGS))
    }

    #[test]
    fn reference_flags_and_defaults() {
        let a = parse(&["prog"]).unwrap();
        assert_eq!(
            (a.mode.as_str(), a.operation.as_str(), a.protocol.as_str()),
            ("initiator", "read", "tcp")
        );
        assert_eq!(
            (a.threads, a.block_size, a.batch_size, a.buffer_size),
            (12, 65536, 128, 1 << 30)
        );
        assert_eq!((a.duration, a.report_unit.as_str()), (10.0, "GB"));
        let a = parse(&[
            "prog",
            "--mode=target",
            "-protocol=tcp",
            "--metadata_server=P2PHANDSHAKE",
            "--local_server_name=127.0.0.1:12345",
            "--segment_id",
            "h:1",
            "--operation=write",
            "--duration=2",
            "--threads=2",
            "--block_size=1048576",
            "--batch_size=16",
            "--buffer_size=67108864",
            "--report_unit=MiB",
            "--check_consistency",
            "--device_name=mlx5_0",
        ])
        .unwrap();
        assert_eq!(a.mode, "target");
        assert_eq!(a.local_server_name, "127.0.0.1:12345");
        assert_eq!(a.segment_id, "h:1");
        assert_eq!(
            (a.threads, a.block_size, a.batch_size, a.buffer_size),
            (2, 1 << 20, 16, 64 << 20)
        );
        assert!(a.check_consistency);
        assert!(
            !parse(&["prog", "--nocheck_consistency"])
                .unwrap()
                .check_consistency
        );
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let stop = AtomicBool::new(false);
        for bad in [
            &["prog", "--mode=sideways"][..],
            &["prog", "--operation=copy", "--segment_id=x:1"],
            &["prog", "--report_unit=parsecs"],
            &["prog"], // no --segment_id
            &["prog", "--segment_id=x:1", "--threads=0"],
            &["prog", "--segment_id=x:1", "--duration=inf"],
            &["prog", "--segment_id=x:1", "--duration=-1"],
            &["prog", "--segment_id=x:1", "--duration=1e30"],
            &["prog", "--segment_id=x:1", "--buffer_size=1024"],
            &[
                "prog",
                "--segment_id=x:1",
                "--threads=4",
                "--batch_size=1",
                "--block_size",
                "18446744073709551615",
            ],
        ] {
            assert!(run(&parse(bad).unwrap(), &stop).is_err(), "{bad:?}");
        }
        assert_eq!(
            main(
                ["prog", "--threads=many"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            ),
            2
        );
    }

    #[test]
    fn units() {
        let r = BenchReport {
            bytes: 2_000_000_000,
            batches: 1,
            elapsed: Duration::from_secs(2),
            verified: None,
        };
        assert_eq!(r.rate("GB").unwrap(), 1.0);
        assert_eq!(r.rate("Gb").unwrap(), 8.0);
        assert_eq!(r.rate("MB").unwrap(), 1000.0);
        assert!(r.rate("XB").is_err());
    }
}
