use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use super::*;
use crate::client::dummy_proto::local_socket_name;
use crate::proto::frame::{encode_frame, read_frame, write_frames};

/// A store service that answers `Hello` (when `hello`) and then never
/// answers anything, on any connection.
fn wedged_service(hello: bool) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut keep = Vec::new();
        for (n, s) in l.incoming().enumerate() {
            let Ok(mut s) = s else { return };
            if hello && n == 0 {
                let mut buf = Vec::new();
                read_frame(&mut s, &mut buf).unwrap();
                let mut out = Vec::new();
                let answer = DummyResponse::Session {
                    session: 1,
                    client_id: 7,
                    hostname: "wedged".into(),
                };
                encode_frame(&answer, &mut out).unwrap();
                write_frames(&mut s, &out).unwrap();
            }
            keep.push(s);
        }
    });
    addr
}

/// Runs `f` on a thread; panics if it has not returned in 60 s.
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("call still blocked: no timeout")
}

const SHORT: Timeouts = Timeouts {
    hello: Duration::from_millis(300),
    call: Duration::from_millis(300),
};

#[test]
fn silent_service_fails_setup_with_rpc_fail() {
    let addr = wedged_service(false);
    let r = bounded(move || {
        DummyClient::connect_with(4096, 4096, &addr, DummyTransport::Auto, SHORT).map(drop)
    });
    assert_eq!(r.unwrap_err().code, ErrorCode::RPC_FAIL);
}

#[test]
fn service_wedged_mid_session_fails_calls_with_rpc_fail() {
    let addr = wedged_service(true);
    let dummy = Arc::new(
        DummyClient::connect_with(4096, 4096, &addr, DummyTransport::Auto, SHORT).unwrap(),
    );
    assert_eq!(dummy.hostname(), "wedged");
    for _ in 0..2 {
        // The first call times out on the Hello connection (dropped);
        // the second on a fresh one whose Attach gets no answer.
        let d = dummy.clone();
        let r = bounded(move || d.health_check());
        assert_eq!(r.unwrap_err().code, ErrorCode::RPC_FAIL);
        assert_eq!(
            dummy.conns.idle_count(),
            0,
            "a timed-out connection was kept"
        );
    }
    let d = dummy.clone();
    let sizes = bounded(move || d.get_size(&["k".into()]));
    assert_eq!(sizes[0].as_ref().unwrap_err().code, ErrorCode::RPC_FAIL);
}

#[test]
fn parts_fill_in_order_and_never_past_their_length() {
    // Same address, different lengths: each part keeps its own length.
    assert_eq!(filled_lens(110, &[(0x1000, 100), (0x1000, 10)]), [100, 10]);
    assert_eq!(filled_lens(105, &[(0x1000, 100), (0x1000, 10)]), [100, 5]);
    assert_eq!(filled_lens(50, &[(1, 100), (2, 10), (3, 0)]), [50, 0, 0]);
    // An object larger than the parts (refused upstream) stays capped.
    assert_eq!(filled_lens(u64::MAX, &[(1, 7), (2, 9)]), [7, 9]);
    assert!(filled_lens(0, &[]).is_empty());
}

/// Holds the abstract name of the service socket for TCP port `port`.
fn hold_local_name(port: u16) -> UnixListener {
    let addr = UnixAddr::from_abstract_name(local_socket_name(port).as_bytes()).unwrap();
    UnixListener::bind_addr(&addr).unwrap()
}

#[test]
fn the_unix_socket_is_trusted_only_when_its_owner_listens_at_the_address() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = tcp.local_addr().unwrap();
    // Nobody holds the name: TCP.
    assert!(session::local_service(&[at], WAIT).is_none());
    // This process holds the name and the listener: the service's socket.
    let _name = hold_local_name(at.port());
    let (local, _conn) = session::local_service(&[at], WAIT).expect("trusted");
    assert_eq!(local.pid, std::process::id());
    // The same port on an address this process does not listen on.
    let elsewhere = SocketAddr::new("127.0.0.2".parse().unwrap(), at.port());
    assert!(session::local_service(&[elsewhere], WAIT).is_none());
}

#[test]
fn a_stranger_holding_the_name_is_not_trusted() {
    // The "service" (its TCP listener) is another process; the name is ours.
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import socket, sys\n\
             s = socket.socket()\n\
             s.bind(('127.0.0.1', 0))\n\
             s.listen()\n\
             print(s.getsockname()[1], flush=True)\n\
             sys.stdin.read()",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().unwrap();
    let at = SocketAddr::new("127.0.0.1".parse().unwrap(), port);
    let _name = hold_local_name(port);
    assert!(session::local_service(&[at], WAIT).is_none());
    drop(child.stdin.take());
    let _ = child.wait();
}

/// Bounds the tests' waits.
const WAIT: Duration = Duration::from_secs(30);
