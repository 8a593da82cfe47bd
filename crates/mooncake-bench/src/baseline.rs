//! Context for the store numbers: what the machine does without us.
//!
//! - TCP ping-pong on loopback between two threads (blocking sockets,
//!   TCP_NODELAY): the floor under any RPC round trip.
//! - memcpy bandwidth between two pre-faulted buffers on one thread: the
//!   ceiling for any same-host byte path.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use mooncake_common::{Error, ErrorCode, Result};
use serde::Serialize;

use crate::stats::{summarize, Summary};

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, format!("{what}: {e}"))
}

/// Round trips of `msg` bytes each way over loopback TCP.
#[derive(Debug, Clone, Serialize)]
pub struct PingPong {
    pub msg_bytes: usize,
    #[serde(flatten)]
    pub summary: Summary,
}

/// `iters` round trips of a `msg`-byte message (after 100 untimed ones).
/// With `spin`, the client polls its socket without sleeping while it waits
/// for the echo (what a busy-polling RPC client would save); with
/// `server_spin` the echo side does the same between messages.
pub fn tcp_ping_pong(msg: usize, iters: usize, spin: bool, server_spin: bool) -> Result<PingPong> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| io_err("bind", e))?;
    let addr = listener.local_addr().map_err(|e| io_err("local_addr", e))?;
    let total = iters + 100;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        s.set_nonblocking(server_spin)?;
        let mut buf = vec![0u8; msg];
        for _ in 0..total {
            if server_spin {
                spin_read(&mut s, &mut buf)?;
                s.set_nonblocking(false)?;
                s.write_all(&buf)?;
                s.set_nonblocking(true)?;
            } else {
                s.read_exact(&mut buf)?;
                s.write_all(&buf)?;
            }
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr).map_err(|e| io_err("connect", e))?;
    s.set_nodelay(true).map_err(|e| io_err("nodelay", e))?;
    s.set_nonblocking(spin)
        .map_err(|e| io_err("nonblocking", e))?;
    let out = vec![7u8; msg];
    let mut back = vec![0u8; msg];
    let mut lat = Vec::with_capacity(iters);
    for i in 0..total {
        let t0 = Instant::now();
        s.write_all(&out).map_err(|e| io_err("write", e))?;
        if spin {
            spin_read(&mut s, &mut back).map_err(|e| io_err("read", e))?;
        } else {
            s.read_exact(&mut back).map_err(|e| io_err("read", e))?;
        }
        if i >= 100 {
            lat.push(t0.elapsed().as_nanos() as u64);
        }
    }
    echo.join()
        .map_err(|_| io_err("echo", std::io::Error::other("thread panicked")))?
        .map_err(|e| io_err("echo", e))?;
    Ok(PingPong {
        msg_bytes: msg,
        summary: summarize(&mut lat, 2 * msg as u64, 1),
    })
}

/// Reads `buf` full from a non-blocking socket, spinning instead of sleeping.
fn spin_read(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Copy bandwidth for blocks of `block` bytes.
#[derive(Debug, Clone, Serialize)]
pub struct Memcpy {
    pub block_bytes: usize,
    /// 10⁹ bytes copied per second (median over calls).
    pub gb_s: f64,
    pub p50_us: f64,
}

/// Copies `block` bytes between two pre-faulted buffers, `iters` times.
pub fn memcpy_bandwidth(block: usize, iters: usize) -> Memcpy {
    let src = vec![1u8; block];
    let mut dst = vec![0u8; block];
    dst.copy_from_slice(&src); // fault every page in first
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    let s = summarize(&mut lat, block as u64, 1);
    Memcpy {
        block_bytes: block,
        gb_s: if s.p50_us > 0.0 {
            block as f64 / (s.p50_us * 1e3)
        } else {
            0.0
        },
        p50_us: s.p50_us,
    }
}

/// Copies `block` bytes from one buffer to successive offsets of a
/// pre-faulted `region`-byte buffer (wrapping), `iters` times: the ceiling
/// for a store that writes values into different places of a large warm
/// segment (the destination is rarely in cache, unlike [`memcpy_bandwidth`]).
pub fn memcpy_streaming(block: usize, region: usize, iters: usize) -> Memcpy {
    let region = region.max(block);
    let src = vec![1u8; block];
    let mut dst = vec![0u8; region];
    for page in dst.chunks_mut(4096) {
        page[0] = 1; // fault every page in first
    }
    let slots = region / block;
    let mut lat = Vec::with_capacity(iters);
    for i in 0..iters {
        let off = (i % slots) * block;
        let t0 = Instant::now();
        dst[off..off + block].copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    let s = summarize(&mut lat, block as u64, 1);
    Memcpy {
        block_bytes: block,
        gb_s: if s.p50_us > 0.0 {
            block as f64 / (s.p50_us * 1e3)
        } else {
            0.0
        },
        p50_us: s.p50_us,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_pong_moves_every_message() {
        for spin in [false, true] {
            let r = tcp_ping_pong(64, 20, spin, spin).unwrap();
            assert_eq!(r.summary.n, 20);
            assert!(r.summary.p50_us > 0.0);
        }
    }

    #[test]
    fn memcpy_reports_a_rate() {
        let m = memcpy_bandwidth(1 << 16, 10);
        assert_eq!(m.block_bytes, 1 << 16);
        assert!(m.gb_s > 0.0);
        let m = memcpy_streaming(1 << 16, 1 << 20, 40);
        assert_eq!(m.block_bytes, 1 << 16);
        assert!(m.gb_s > 0.0);
    }
}
