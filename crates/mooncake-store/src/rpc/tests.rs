//! The server loop and the client pool over loopback, with a toy protocol
//! made of master messages. Waits are bounded; nothing asserts a duration.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};

use super::*;
use crate::proto::frame::{decode_payload, encode_frame, read_frame};
use crate::proto::{Request, Response};

/// Long enough never to fire in a healthy run; bounds every wait.
const WAIT: Duration = Duration::from_secs(30);

/// Answers `ExistKey` with whether the key is "yes", `GetSize` with a
/// `Keys` answer of that many bytes; counts malformed frames.
#[derive(Default)]
struct Toy {
    malformed: AtomicUsize,
    /// Who each connection's socket said its peer was.
    peers: parking_lot::Mutex<Vec<Peer>>,
}

impl Handler for Toy {
    type Request<'a> = Request<'a>;
    type Response = Response;
    /// Calls seen on the connection.
    type Session = u64;
    const OVERSIZED_ANSWER: ErrorCode = ErrorCode::INVALID_PARAMS;

    fn session(&self, peer: &Peer) -> u64 {
        self.peers.lock().push(*peer);
        0
    }

    fn evictable(&self, calls: &u64) -> bool {
        *calls == 0
    }

    fn handle(&self, calls: &mut u64, req: Request<'_>) -> Response {
        *calls += 1;
        match req {
            Request::ExistKey { key: "slow" } => {
                std::thread::sleep(Duration::from_millis(300));
                Response::Bool { result: Ok(true) }
            }
            Request::ExistKey { key } => Response::Bool {
                result: Ok(key == "yes"),
            },
            Request::GetSize { key } => Response::Keys {
                result: Ok(vec!["x".repeat(key.parse().unwrap())]),
            },
            _ => Response::Count { result: Ok(*calls) },
        }
    }

    fn failure(&self, error: Error) -> Response {
        Response::Failed { error }
    }

    fn observe_malformed(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }
}

fn options() -> ServerOptions {
    ServerOptions {
        name: "toy",
        max_connections: 16,
        when_full: WhenFull::Wait,
        idle_timeout: None,
        frame_timeout: WAIT,
        nodelay: true,
        read_buffer: 4096,
        poll: Duration::ZERO,
        stack_size: None,
    }
}

fn serve(opts: ServerOptions) -> (Server, Arc<Toy>) {
    let toy = Arc::new(Toy::default());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    (Server::start(l, toy.clone(), opts).unwrap(), toy)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

fn frame(req: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(req, &mut out).unwrap();
    out
}

fn exchange(s: &mut (impl Read + Write), bytes: &[u8]) -> Response {
    s.write_all(bytes).unwrap();
    let mut buf = Vec::new();
    read_frame(s, &mut buf).unwrap();
    decode_payload(&buf).unwrap()
}

fn failed_code(resp: Response) -> ErrorCode {
    match resp {
        Response::Failed { error } => error.code,
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// Whether the peer closes `s` (end of stream or reset) within [`WAIT`].
fn closed_by_peer(s: &mut impl Read) -> bool {
    match s.read(&mut [0u8; 1]) {
        Ok(0) => true,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
        Ok(_) => panic!("unexpected bytes"),
        Err(_) => false,
    }
}

#[test]
fn malformed_frames_are_answered_counted_and_only_bad_lengths_close() {
    let (server, toy) = serve(options());
    for len in [u32::MAX, 0, 1] {
        let mut s = connect(server.local_addr());
        let code = failed_code(exchange(&mut s, &len.to_le_bytes()));
        assert_eq!(code, ErrorCode::DESERIALIZE_FAIL);
        assert!(closed_by_peer(&mut s), "a bad length kept its connection");
    }
    let mut s = connect(server.local_addr());
    let mut garbage = 5u32.to_le_bytes().to_vec();
    garbage.extend_from_slice(&[crate::proto::PROTOCOL_VERSION, 200, 1, 2, 3]);
    assert_eq!(
        failed_code(exchange(&mut s, &garbage)),
        ErrorCode::DESERIALIZE_FAIL
    );
    let mut wrong_version = frame(&Request::ExistKey { key: "yes" });
    wrong_version[4] = 99;
    assert_eq!(
        failed_code(exchange(&mut s, &wrong_version)),
        ErrorCode::INVALID_VERSION
    );
    let good = frame(&Request::ExistKey { key: "yes" });
    assert_eq!(exchange(&mut s, &good), Response::Bool { result: Ok(true) });
    assert_eq!(toy.malformed.load(Ordering::Relaxed), 5);
    // The session lives as long as its connection.
    let count = frame(&Request::RemoveAll { force: false });
    assert_eq!(exchange(&mut s, &count), Response::Count { result: Ok(2) });
    let mut other = connect(server.local_addr());
    assert_eq!(
        exchange(&mut other, &count),
        Response::Count { result: Ok(1) }
    );
}

#[test]
fn an_answer_over_the_frame_limit_becomes_an_error() {
    let (server, _) = serve(options());
    let mut s = connect(server.local_addr());
    let huge = (crate::proto::MAX_FRAME_LEN + 1).to_string();
    let resp = exchange(&mut s, &frame(&Request::GetSize { key: &huge }));
    assert_eq!(failed_code(resp), ErrorCode::INVALID_PARAMS);
    // The connection goes on.
    let small = frame(&Request::GetSize { key: "3" });
    assert_eq!(
        exchange(&mut s, &small),
        Response::Keys {
            result: Ok(vec!["xxx".into()])
        }
    );
}

#[test]
fn idle_and_stalled_connections_are_closed() {
    let (server, _) = serve(ServerOptions {
        idle_timeout: Some(Duration::from_millis(200)),
        ..options()
    });
    let mut idle = connect(server.local_addr());
    assert!(closed_by_peer(&mut idle), "an idle connection stayed open");
    let (server, _) = serve(ServerOptions {
        frame_timeout: Duration::from_millis(200),
        ..options()
    });
    let mut stalled = connect(server.local_addr());
    // Declares 64 MiB, sends one byte of it, then nothing.
    stalled
        .write_all(&(64u32 << 20).to_le_bytes())
        .and_then(|()| stalled.write_all(&[1]))
        .unwrap();
    assert!(
        closed_by_peer(&mut stalled),
        "a stalled frame kept its connection"
    );
}

#[test]
fn past_the_cap_connections_evict_or_wait() {
    let good = frame(&Request::ExistKey { key: "yes" });
    // A connection that made no call yet is evictable (see `Toy`): a new
    // one takes its place.
    let (server, _) = serve(ServerOptions {
        max_connections: 1,
        ..options()
    });
    let mut silent = connect(server.local_addr());
    let mut newer = connect(server.local_addr());
    assert_eq!(
        exchange(&mut newer, &good),
        Response::Bool { result: Ok(true) }
    );
    assert!(
        closed_by_peer(&mut silent),
        "the evictable connection stayed"
    );

    let (server, _) = serve(ServerOptions {
        max_connections: 1,
        when_full: WhenFull::Wait,
        ..options()
    });
    let mut first = connect(server.local_addr());
    assert_eq!(
        exchange(&mut first, &good),
        Response::Bool { result: Ok(true) }
    );
    let mut second = connect(server.local_addr());
    second.write_all(&good).unwrap();
    second
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let err = second.read(&mut [0u8; 1]).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "a connection over the cap was served: {err}"
    );
    drop(first);
    second.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut second, &mut buf).unwrap();
    assert_eq!(
        decode_payload::<Response>(&buf).unwrap(),
        Response::Bool { result: Ok(true) }
    );
}

#[test]
fn stop_closes_connections_and_the_listener() {
    let (server, _) = serve(options());
    let addr = server.local_addr();
    let mut s = connect(addr);
    let good = frame(&Request::ExistKey { key: "no" });
    assert_eq!(
        exchange(&mut s, &good),
        Response::Bool { result: Ok(false) }
    );
    server.stop();
    assert!(closed_by_peer(&mut s));
    assert!(TcpStream::connect(addr).is_err(), "still listening");
}

/// A call the server is handling when it stops is answered before its
/// connection closes: the client must not be left to guess whether it ran.
#[test]
fn stop_answers_the_call_being_handled() {
    let (server, _) = serve(options());
    let mut s = connect(server.local_addr());
    let mut idle = connect(server.local_addr());
    s.write_all(&frame(&Request::ExistKey { key: "slow" }))
        .unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        read_frame(&mut s, &mut buf).unwrap();
        let answer: Response = decode_payload(&buf).unwrap();
        (answer, closed_by_peer(&mut s))
    });
    std::thread::sleep(Duration::from_millis(100));
    server.stop();
    assert_eq!(
        reader.join().unwrap(),
        (Response::Bool { result: Ok(true) }, true)
    );
    assert!(closed_by_peer(&mut idle), "an idle connection just closes");
}

/// Connects to a fixed address; counts the connections it made.
struct Target {
    addr: SocketAddr,
    opened: AtomicUsize,
}

impl Connector for Target {
    fn peer(&self) -> String {
        format!("toy {}", self.addr)
    }

    fn connect(&self, timeout: Duration) -> Result<TcpStream> {
        self.opened.fetch_add(1, Ordering::Relaxed);
        connect_any(&[self.addr], timeout).map_err(rpc_fail)
    }
}

fn pool(addr: SocketAddr, call_timeout: Duration, drop_idle: bool) -> Pool<Target> {
    let target = Target {
        addr,
        opened: AtomicUsize::new(0),
    };
    Pool::new(
        target,
        ClientOptions {
            connect_timeout: WAIT,
            call_timeout,
            max_idle: 4,
            read_buffer: 4096,
            poll: Duration::from_micros(50),
            drop_idle_on_failure: drop_idle,
        },
    )
}

fn exists(pool: &Pool<Target>, key: &str) -> Result<Response> {
    pool.call(&frame(&Request::ExistKey { key }), |p| {
        decode_payload(p).map_err(Error::from)
    })
}

#[test]
fn a_pooled_connection_the_server_closed_is_replaced() {
    let (server, _) = serve(ServerOptions {
        idle_timeout: Some(Duration::from_millis(100)),
        ..options()
    });
    let p = pool(server.local_addr(), WAIT, true);
    assert_eq!(
        exists(&p, "yes").unwrap(),
        Response::Bool { result: Ok(true) }
    );
    assert_eq!(p.idle_count(), 1);
    // Wait until the server has closed the pooled connection as idle.
    assert!(p.oldest_idle_readable_within(WAIT));
    assert_eq!(
        exists(&p, "yes").unwrap(),
        Response::Bool { result: Ok(true) }
    );
    assert_eq!(p.connector().opened.load(Ordering::Relaxed), 2);
    assert_eq!(p.idle_count(), 1);
}

#[test]
fn a_call_without_an_answer_fails_and_drops_its_connection() {
    // Accepts and never answers.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let held: Vec<_> = l.incoming().collect();
        drop(held);
    });
    for drop_idle in [true, false] {
        let p = pool(addr, Duration::from_millis(200), drop_idle);
        for _ in 0..2 {
            let conn = p.open().unwrap();
            p.put_idle(conn);
        }
        let e = exists(&p, "yes").unwrap_err();
        assert_eq!(e.code, ErrorCode::RPC_FAIL);
        assert_eq!(p.idle_count(), if drop_idle { 0 } else { 1 });
    }
    let p = pool(addr, WAIT, true);
    p.close();
    let e = exists(&p, "yes").unwrap_err();
    assert_eq!(e.code, ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
}

/// Connects to the abstract Unix socket `name` with a read timeout.
fn connect_unix(name: &str) -> UnixStream {
    let s = stream::connect_abstract(name, WAIT).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

#[test]
fn a_unix_socket_is_served_with_the_same_limits_and_knows_its_peer() {
    let name = format!("mooncake-rpc-test-{}", rand::random::<u64>());
    let addr = UnixAddr::from_abstract_name(name.as_bytes()).unwrap();
    let toy = Arc::new(Toy::default());
    let opts = ServerOptions {
        max_connections: 2,
        ..options()
    };
    let server = Server::start(UnixListener::bind_addr(&addr).unwrap(), toy.clone(), opts).unwrap();
    let mut s = connect_unix(&name);
    let yes = frame(&Request::ExistKey { key: "yes" });
    assert_eq!(exchange(&mut s, &yes), Response::Bool { result: Ok(true) });
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    match toy.peers.lock()[0] {
        Peer::Local(c) => assert_eq!((c.pid, c.uid), (std::process::id(), uid)),
        other => panic!("a Unix peer seen as {other:?}"),
    }
    // Bad lengths are answered and closed.
    drop(s);
    let mut s = connect_unix(&name);
    let code = failed_code(exchange(&mut s, &u32::MAX.to_le_bytes()));
    assert_eq!(code, ErrorCode::DESERIALIZE_FAIL);
    assert!(closed_by_peer(&mut s));
    // Past the cap, a connection without a call makes room.
    let mut first = connect_unix(&name);
    let mut second = connect_unix(&name);
    let mut third = connect_unix(&name);
    assert_eq!(
        exchange(&mut third, &yes),
        Response::Bool { result: Ok(true) }
    );
    first
        .set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    let evicted = closed_by_peer(&mut first) || closed_by_peer(&mut second);
    assert!(evicted, "nothing was evicted");
    // The pool works over it too.
    struct Local(String);
    impl Connector<UnixStream> for Local {
        fn peer(&self) -> String {
            format!("@{}", self.0)
        }
        fn connect(&self, timeout: Duration) -> Result<UnixStream> {
            stream::connect_abstract(&self.0, timeout).map_err(rpc_fail)
        }
    }
    let p: Pool<Local, UnixStream> = Pool::new(
        Local(name.clone()),
        ClientOptions {
            connect_timeout: WAIT,
            call_timeout: WAIT,
            max_idle: 1,
            read_buffer: 4096,
            poll: Duration::ZERO,
            drop_idle_on_failure: true,
        },
    );
    let answer = p.call(&yes, |a| decode_payload::<Response>(a).map_err(Error::from));
    assert_eq!(answer.unwrap(), Response::Bool { result: Ok(true) });
    server.stop();
    assert!(closed_by_peer(&mut third));
    assert!(
        stream::connect_abstract(&name, Duration::ZERO).is_err(),
        "still listening"
    );
}

#[test]
fn the_open_file_limit_caps_connections() {
    use super::server::descriptor_cap;
    assert_eq!(
        descriptor_cap(Some(1024)),
        256,
        "two descriptors each, half the limit for the process"
    );
    assert_eq!(descriptor_cap(Some(400)), 100);
    assert_eq!(descriptor_cap(Some(20)), 16, "a floor");
    assert_eq!(descriptor_cap(None), usize::MAX, "unlimited");
}
