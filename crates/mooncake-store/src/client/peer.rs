//! Who is at the other end of a loopback TCP connection: the kernel's
//! socket table (`/proc/net/tcp`, `/proc/net/tcp6`) names the peer
//! socket's owner uid and inode, and `/proc/<pid>/fd` tells whether a
//! process holds that socket. The store service uses it to tie a dummy's
//! session to the process that opened it (TCP has no `SO_PEERCRED`).

use std::net::{IpAddr, SocketAddr, TcpStream};

/// The socket at the far end of a local connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerSocket {
    pub(crate) uid: u32,
    pub(crate) inode: u64,
}

/// The two ends of `conn`: `(peer, ours)`.
pub(crate) fn ends(conn: &TcpStream) -> Option<(SocketAddr, SocketAddr)> {
    Some((conn.peer_addr().ok()?, conn.local_addr().ok()?))
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
    use std::net::TcpListener;

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
    }

    #[test]
    fn finds_this_process_behind_a_loopback_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let (far, near) = ends(&server).unwrap();
        let peer = local_peer(far, near).expect("a loopback peer is found");
        // SAFETY: geteuid has no preconditions.
        assert_eq!(peer.uid, unsafe { libc::geteuid() });
        assert!(process_holds(std::process::id(), peer.inode));
        drop(client);
    }
}
