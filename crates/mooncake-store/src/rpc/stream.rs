//! The sockets framed RPC runs over: TCP, and Unix stream sockets for peers
//! on the same host, whose credentials the kernel vouches for
//! (`SO_PEERCRED`). The server loop and the client are generic over
//! [`Listener`] and [`Stream`], so both transports get the same limits,
//! deadlines and framing.

use std::fmt::Debug;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// A process as the kernel recorded it when it connected (or listened).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The credentials of the process at the other end of Unix socket `sock`.
pub fn peer_credentials(sock: &impl AsRawFd) -> io::Result<Credentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, for
    // the call's duration.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // A peer in a pid namespace we cannot see shows as pid 0.
    let pid = u32::try_from(cred.pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| io::Error::other("the peer's process is not visible here"))?;
    Ok(Credentials {
        pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Who is at the other end of a served connection, as its socket tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// A TCP peer: its address and ours.
    Tcp {
        remote: SocketAddr,
        local: SocketAddr,
    },
    /// A Unix-socket peer, by the kernel's word.
    Local(Credentials),
    /// The socket could not say (it closed already).
    Unknown,
}

/// A connected blocking socket.
pub trait Stream: Read + Write + AsRawFd + Send + Sized + 'static {
    fn try_clone(&self) -> io::Result<Self>;
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Turns Nagle's algorithm off, where the transport has it.
    fn set_nodelay(&self, nodelay: bool) -> io::Result<()>;
    /// Shuts both directions down, waking a thread blocked on it.
    fn shutdown(&self) -> io::Result<()>;
    /// Shuts the receiving side down: a blocked read ends, an answer being
    /// written still goes out.
    fn shutdown_read(&self) -> io::Result<()>;
    fn peer(&self) -> Peer;
}

/// A listening socket.
pub trait Listener: AsFd + Send + 'static {
    type Stream: Stream;
    type Addr: Clone + Debug + Send + 'static;
    /// The next connection, and its peer's address for log lines.
    fn accept(&self) -> io::Result<(Self::Stream, Self::Addr)>;
    fn local_addr(&self) -> io::Result<Self::Addr>;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()>;
}

impl Stream for TcpStream {
    fn try_clone(&self) -> io::Result<Self> {
        TcpStream::try_clone(self)
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, timeout)
    }
    fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        TcpStream::set_nodelay(self, nodelay)
    }
    fn shutdown(&self) -> io::Result<()> {
        TcpStream::shutdown(self, Shutdown::Both)
    }
    fn shutdown_read(&self) -> io::Result<()> {
        TcpStream::shutdown(self, Shutdown::Read)
    }
    fn peer(&self) -> Peer {
        match (self.peer_addr(), self.local_addr()) {
            (Ok(remote), Ok(local)) => Peer::Tcp { remote, local },
            _ => Peer::Unknown,
        }
    }
}

impl Stream for UnixStream {
    fn try_clone(&self) -> io::Result<Self> {
        UnixStream::try_clone(self)
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, timeout)
    }
    fn set_nodelay(&self, _: bool) -> io::Result<()> {
        Ok(())
    }
    fn shutdown(&self) -> io::Result<()> {
        UnixStream::shutdown(self, Shutdown::Both)
    }
    fn shutdown_read(&self) -> io::Result<()> {
        UnixStream::shutdown(self, Shutdown::Read)
    }
    fn peer(&self) -> Peer {
        peer_credentials(self).map_or(Peer::Unknown, Peer::Local)
    }
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    type Addr = SocketAddr;
    fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        TcpListener::accept(self)
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        TcpListener::local_addr(self)
    }
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        TcpListener::set_nonblocking(self, nonblocking)
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    type Addr = std::os::unix::net::SocketAddr;
    fn accept(&self) -> io::Result<(UnixStream, Self::Addr)> {
        UnixListener::accept(self)
    }
    fn local_addr(&self) -> io::Result<Self::Addr> {
        UnixListener::local_addr(self)
    }
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        UnixListener::set_nonblocking(self, nonblocking)
    }
}

/// A client connection over either transport, chosen at run time.
#[derive(Debug)]
pub enum AnyStream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

macro_rules! either {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            AnyStream::Tcp($s) => $e,
            AnyStream::Unix($s) => $e,
        }
    };
}

impl Read for AnyStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        either!(self, s => s.read(buf))
    }
}

impl Write for AnyStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        either!(self, s => s.write(buf))
    }
    fn flush(&mut self) -> io::Result<()> {
        either!(self, s => s.flush())
    }
}

impl AsRawFd for AnyStream {
    fn as_raw_fd(&self) -> RawFd {
        either!(self, s => s.as_raw_fd())
    }
}

impl Stream for AnyStream {
    fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            AnyStream::Tcp(s) => AnyStream::Tcp(Stream::try_clone(s)?),
            AnyStream::Unix(s) => AnyStream::Unix(Stream::try_clone(s)?),
        })
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        either!(self, s => Stream::set_read_timeout(s, timeout))
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        either!(self, s => Stream::set_write_timeout(s, timeout))
    }
    fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        either!(self, s => Stream::set_nodelay(s, nodelay))
    }
    fn shutdown_read(&self) -> io::Result<()> {
        either!(self, s => Stream::shutdown_read(s))
    }
    fn shutdown(&self) -> io::Result<()> {
        either!(self, s => Stream::shutdown(s))
    }
    fn peer(&self) -> Peer {
        either!(self, s => Stream::peer(s))
    }
}

/// Connects to the Unix socket `name` in the abstract namespace. A server
/// whose accept queue is full makes a Unix connect fail at once (where TCP
/// waits); this one waits up to `timeout` for a place, as TCP would.
pub fn connect_abstract(name: &str, timeout: Duration) -> io::Result<UnixStream> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let addr = SockAddr::unix(format!("\0{name}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        match socket.connect(&addr) {
            Ok(()) => {
                socket.set_nonblocking(false)?;
                return Ok(UnixStream::from(OwnedFd::from(socket)));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(QUEUE_FULL_RETRY);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Pause between connects to a Unix socket whose accept queue is full.
const QUEUE_FULL_RETRY: Duration = Duration::from_millis(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unix_peer_is_known_by_its_process() {
        let (a, b) = UnixStream::pair().unwrap();
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        // SAFETY: getegid has no preconditions.
        let gid = unsafe { libc::getegid() };
        let me = Credentials {
            pid: std::process::id(),
            uid,
            gid,
        };
        assert_eq!(a.peer(), Peer::Local(me));
        assert_eq!(AnyStream::Unix(b).peer(), Peer::Local(me));
    }
}
