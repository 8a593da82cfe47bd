//! Who is at the other end of a loopback TCP connection: the kernel's
//! socket table (`/proc/net/tcp`, `/proc/net/tcp6`) names the peer
//! socket's owner uid and inode, and `/proc/<pid>/fd` tells whether a
//! process holds that socket. The store service uses it to tie a dummy's
//! session to the process that opened it when the dummy comes over TCP
//! (TCP has no `SO_PEERCRED`; over the Unix socket the kernel says who the
//! peer is). A dummy uses the same tables the other way round: before it
//! trusts the service's Unix socket, it checks that the process behind it
//! is the one listening on the TCP address it was given.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The socket at the far end of a local connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerSocket {
    pub(crate) uid: u32,
    pub(crate) inode: u64,
}

/// The socket at `peer` connected to `local`, when the peer is on this host
/// (in this network namespace); `None` for a remote peer or an unreadable
/// table.
pub(crate) fn local_peer(peer: SocketAddr, local: SocketAddr) -> Option<PeerSocket> {
    let table = match peer.ip() {
        IpAddr::V4(_) => "/proc/net/tcp",
        IpAddr::V6(_) => "/proc/net/tcp6",
    };
    find_socket(&std::fs::read_to_string(table).ok()?, peer, local)
}

/// Whether process `pid` holds the socket `inode` among its descriptors.
pub(crate) fn process_holds(pid: u32, inode: u64) -> bool {
    let want = format!("socket:[{inode}]");
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == want.as_str())
    })
}

/// Whether process `pid` holds a TCP socket listening where a connection
/// to one of `addrs` arrives (that address or a wildcard on its port).
pub(crate) fn holds_listener(pid: u32, addrs: &[SocketAddr]) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(t).ok())
        .flat_map(|table| listeners(&table, addrs))
        .any(|inode| process_holds(pid, inode))
}

/// The inodes of the listening sockets of `table` that accept connections
/// to one of `addrs`.
fn listeners(table: &str, addrs: &[SocketAddr]) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // State 0A: TCP_LISTEN.
            if f.len() < 10 || f[3] != "0A" {
                return None;
            }
            let bound = parse_proc_addr(f[1])?;
            addrs
                .iter()
                .any(|a| accepts(bound, *a))
                .then(|| f[9].parse().ok())
                .flatten()
        })
        .collect()
}

/// Whether a socket listening on `bound` takes connections to `to`.
fn accepts(bound: SocketAddr, to: SocketAddr) -> bool {
    let mapped = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    bound.port() == to.port()
        && (bound.ip().is_unspecified() || mapped(bound.ip()) == mapped(to.ip()))
}

/// An address as the kernel spells it in its socket tables (see
/// [`proc_addr`]).
fn parse_proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(ip.get(8 * i..8 * i + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The kernel's spelling of an address in its socket tables: each 32-bit
/// word of the address in host byte order, in hex, then the port.
fn proc_addr(a: SocketAddr) -> String {
    let words: Vec<[u8; 4]> = match a.ip() {
        IpAddr::V4(ip) => vec![ip.octets()],
        IpAddr::V6(ip) => ip
            .octets()
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect(),
    };
    let mut s: String = words
        .iter()
        .map(|w| format!("{:08X}", u32::from_ne_bytes(*w)))
        .collect();
    s.push_str(&format!(":{:04X}", a.port()));
    s
}

/// The row of a socket table whose local end is `peer` and remote end
/// `ours`: the peer's socket.
fn find_socket(table: &str, peer: SocketAddr, ours: SocketAddr) -> Option<PeerSocket> {
    let (want_local, want_remote) = (proc_addr(peer), proc_addr(ours));
    table.lines().skip(1).find_map(|line| {
        if !line.contains(want_local.as_str()) {
            return None;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 || f[1] != want_local || f[2] != want_remote {
            return None;
        }
        Some(PeerSocket {
            uid: f[7].parse().ok()?,
            inode: f[9].parse().ok()?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn reads_the_kernels_spelling() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0100007F:C350 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111 1 0 100 0 0 10 0\n\
           1: 0100007F:9C40 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1001        0 222 1 0 20 4 30 10 -1\n";
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let ours: SocketAddr = "127.0.0.1:50000".parse().unwrap();
        assert_eq!(
            find_socket(table, peer, ours),
            Some(PeerSocket {
                uid: 1001,
                inode: 222
            })
        );
        assert_eq!(find_socket(table, ours, peer), None);
        let v6: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(proc_addr(v6), "00000000000000000000000001000000:0050");
        for a in [peer, ours, v6] {
            assert_eq!(parse_proc_addr(&proc_addr(a)), Some(a));
        }
        // Row 0 listens on 127.0.0.1:50000; row 1 is connected, not listening.
        assert_eq!(listeners(table, &[ours]), [111]);
        assert!(listeners(table, &[peer]).is_empty());
        let elsewhere: SocketAddr = "127.0.0.2:50000".parse().unwrap();
        assert!(listeners(table, &[elsewhere]).is_empty());
        let wild: SocketAddr = "0.0.0.0:50000".parse().unwrap();
        assert!(accepts(wild, elsewhere) && accepts(wild, ours));
        let wild6: SocketAddr = "[::]:50000".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:50000".parse().unwrap();
        assert!(accepts(wild6, ours) && accepts(mapped, ours));
        let other_port: SocketAddr = "127.0.0.1:50001".parse().unwrap();
        assert!(!accepts(mapped, elsewhere) && !accepts(wild, other_port));
    }

    #[test]
    fn finds_this_process_behind_a_loopback_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let (far, near) = (server.peer_addr().unwrap(), server.local_addr().unwrap());
        let peer = local_peer(far, near).expect("a loopback peer is found");
        // SAFETY: geteuid has no preconditions.
        assert_eq!(peer.uid, unsafe { libc::geteuid() });
        assert!(process_holds(std::process::id(), peer.inode));
        let me = std::process::id();
        let at = listener.local_addr().unwrap();
        assert!(holds_listener(me, &[at]));
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() } as u32;
        assert!(!holds_listener(parent, &[at]), "another process's listener");
        drop(client);
    }
}
