//! Dialing the mesh's connections and their socket options.

use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use socket2::{SockRef, TcpKeepalive};

/// Keepalive idle time, probe interval and probe count: a peer host that
/// vanishes is found within about idle + count x interval (5 s), and the
/// same bound applies to unacknowledged data (`TCP_USER_TIMEOUT`).
pub const KEEPALIVE: (Duration, Duration, u32) =
    (Duration::from_secs(2), Duration::from_secs(1), 3);

/// Socket buffers large enough that a slot's worth of bytes is in flight
/// to every peer at once (the kernel caps it at `net.core.[rw]mem_max`).
const SOCKET_BUFFER: usize = 4 << 20;

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

/// A tuned connection to `host:port` that has said `hello` (who it comes
/// from), retried until `deadline` (the peer may not listen yet).
pub(super) fn connect(
    host: &str,
    port: u16,
    hello: &[u8],
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
            s.write_all(hello)?;
            Ok(s)
        })();
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
