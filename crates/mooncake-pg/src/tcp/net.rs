//! Setting up the mesh's connections: dialing, accepting, socket options.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{SockRef, TcpKeepalive};

use super::Shared;

/// Keepalive idle time, probe interval and probe count: a peer host that
/// vanishes is found within about idle + count x interval (5 s), and the
/// same bound applies to unacknowledged data (`TCP_USER_TIMEOUT`).
pub const KEEPALIVE: (Duration, Duration, u32) =
    (Duration::from_secs(2), Duration::from_secs(1), 3);

/// Socket buffers large enough that a slot's worth of bytes is in flight
/// to every peer at once (the kernel caps it at `net.core.[rw]mem_max`).
const SOCKET_BUFFER: usize = 4 << 20;
const POLL: Duration = Duration::from_millis(2);

pub(super) fn tune(s: &TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    let sock = SockRef::from(s);
    let (idle, interval, count) = KEEPALIVE;
    sock.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(idle)
            .with_interval(interval)
            .with_retries(count),
    )?;
    sock.set_tcp_user_timeout(Some(idle + interval * count))?;
    // Best effort: a smaller cap still works, only slower.
    let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
    let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
    Ok(())
}

/// A tuned connection to `host:port` that has said it comes from `rank`,
/// retried until `deadline` (the peer may not listen yet).
pub(super) fn connect(
    host: &str,
    port: u16,
    rank: usize,
    deadline: Instant,
) -> io::Result<TcpStream> {
    loop {
        let attempt = (|| {
            let addr = (host, port)
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(100));
            let mut s = TcpStream::connect_timeout(&addr, left)?;
            tune(&s)?;
            s.write_all(&(rank as u32).to_le_bytes())?;
            Ok(s)
        })();
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Accepts one connection from each `expected` peer until `deadline` or
/// the group closes, and starts a reader on each.
pub(super) fn accept_peers(
    sh: Arc<Shared>,
    listener: TcpListener,
    mut expected: Vec<bool>,
    deadline: Instant,
) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    while expected.iter().any(|&e| e) && Instant::now() < deadline {
        if sh.closed.load(Ordering::SeqCst) {
            return;
        }
        let s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(POLL);
                continue;
            }
            Err(_) => {
                std::thread::sleep(POLL);
                continue;
            }
        };
        let Some(peer) = greet(&s, deadline) else {
            continue;
        };
        if peer >= expected.len() || !expected[peer] {
            continue;
        }
        let (Ok(handle), Ok(())) = (s.try_clone(), tune(&s)) else {
            continue;
        };
        expected[peer] = false;
        sh.inbound.lock().push((peer, handle));
        let reader_sh = Arc::clone(&sh);
        let started = std::thread::Builder::new()
            .name(format!("mooncake-pg-tcp-{peer}"))
            .spawn(move || super::reader(reader_sh, peer, s));
        let mut st = sh.state.lock();
        if started.is_err() {
            st.dead[peer] = true;
        }
        st.accepted[peer] = true;
        sh.cv.notify_all();
    }
}

/// The rank an accepted connection says it comes from.
fn greet(s: &TcpStream, deadline: Instant) -> Option<usize> {
    s.set_nonblocking(false).ok()?;
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(Duration::from_millis(100))))
        .ok()?;
    let mut b = [0u8; 4];
    (&*s).read_exact(&mut b).ok()?;
    s.set_read_timeout(None).ok()?;
    Some(u32::from_le_bytes(b) as usize)
}
