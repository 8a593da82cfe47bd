//! Baselines for the transfer-engine benchmarks on this machine:
//! one loopback TCP stream (1 MiB writes, reads into a reused buffer, like a
//! plain iperf run) and memcpy bandwidth (1 and 2 threads, 64 MiB blocks).
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

fn memcpy(secs: f64, threads: usize) -> f64 {
    const BLOCK: usize = 64 << 20;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let total: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let src = vec![1u8; BLOCK];
                    let mut dst = vec![0u8; BLOCK];
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        dst.copy_from_slice(&src);
                        std::hint::black_box(&mut dst);
                        n += BLOCK as u64;
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
    println!("memcpy, 1 thread: {:.2} GB/s", memcpy(secs, 1));
    println!("memcpy, 2 threads: {:.2} GB/s", memcpy(secs, 2));
}
