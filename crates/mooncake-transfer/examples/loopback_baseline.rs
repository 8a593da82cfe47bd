//! Ceilings for the transfer-engine benchmarks on this machine:
//! - one loopback TCP stream (1 MiB writes, reads into a reused buffer, like a
//!   plain iperf run);
//! - plain memcpy over the same working sets as `transfer_engine_bench
//!   --threads=2 --batch_size=128`: each thread copies its own
//!   128 x block bytes, block by block (16 MiB in all at 64 KiB blocks, 256 MiB
//!   at 1 MiB), between pre-touched buffers.
//!
//! `cargo run --release -p mooncake-transfer --example loopback_baseline [seconds]`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn tcp_stream(secs: f64) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n as u64,
            }
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let chunk = vec![7u8; 1 << 20];
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        s.write_all(&chunk).unwrap();
    }
    drop(s);
    let total = receiver.join().unwrap();
    total as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// `threads` threads, each copying `per_thread` bytes in `block`-byte pieces.
fn memcpy(secs: f64, threads: usize, block: usize, per_thread: usize) -> f64 {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let total: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let src = vec![1u8; per_thread];
                    let mut dst = vec![2u8; per_thread];
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        for off in (0..per_thread).step_by(block) {
                            dst[off..off + block].copy_from_slice(&src[off..off + block]);
                        }
                        std::hint::black_box(&mut dst);
                        n += per_thread as u64;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    total as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    println!("loopback TCP, 1 stream: {:.2} GB/s", tcp_stream(secs));
    for block in [64 << 10, 1 << 20] {
        for threads in [1, 2] {
            let gbps = memcpy(secs, threads, block, 128 * block);
            println!(
                "memcpy, {threads} thread(s), {} KiB blocks, 128 per thread: {gbps:.2} GB/s",
                block >> 10
            );
        }
    }
}
